"""Shared fixtures: real processes on 127.0.0.1 with bounded lifetimes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")


class Proc:
    """A child process that announces its URL on its first stdout line."""

    def __init__(self, args: list[str], timeout: float = 60.0) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.p = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
        line = self.p.stdout.readline().decode()
        if "listening on " not in line:
            self.stop()
            raise RuntimeError(f"{args} did not start: {line!r} {self.p.stderr.read().decode()[-2000:]}")
        self.url = line.split("listening on ", 1)[1].split()[0]

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.p.kill()


@pytest.fixture
def emulator_factory():
    procs: list[Proc] = []

    def start(*extra: str) -> Proc:
        proc = Proc(["-m", "server.emulator", "--port", "0", *extra])
        procs.append(proc)
        return proc

    yield start
    for p in procs:
        p.stop()


def run_locust(args: list[str], cwd: Path, timeout: float = 120.0) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("VLLM_LOAD_API_KEY", None)
    return subprocess.run([sys.executable, "-m", "locust", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
