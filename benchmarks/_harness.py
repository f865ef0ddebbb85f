"""What the benchmarks share: pinning to a core, starting the emulator, reading its running count
(through the project's own /metrics parser) and a process's CPU time."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from server.sidecar.vllm_schema import parse_metrics  # noqa: E402

ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def pinned(core: int, cmd: list[str]) -> list[str]:
    """``cmd`` run on one core (taskset), when there are two or more and taskset exists."""
    if shutil.which("taskset") and (os.cpu_count() or 1) >= 2:
        return ["taskset", "-c", str(core)] + cmd
    return cmd


def start_emulator(*args: str, core: int | None = None) -> tuple[subprocess.Popen, str]:
    """A started emulator on a free port (quiet stats log) and its URL."""
    cmd = [sys.executable, "-m", "server.emulator", "--port", "0", "--log-stats-interval", "0",
           "--max-model-len", "100000", *args]
    emu = subprocess.Popen(cmd if core is None else pinned(core, cmd), stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, env=ENV, cwd=ROOT)
    line = emu.stdout.readline().decode()
    if "listening on " not in line:
        emu.kill()
        raise RuntimeError(f"the emulator did not start: {line!r}")
    return emu, line.split("listening on ", 1)[1].split()[0]


def running(url: str) -> float:
    """Requests the server is running now (vllm:num_requests_running)."""
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    return float(parse_metrics(text).get("running", 0.0))


def cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system
