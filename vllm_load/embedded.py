"""Start the built-in vLLM emulator when the user gave no --host."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import gevent

from vllm_load.errors import UsageError


@dataclass
class EmbeddedEmulator:
    url: str
    process: subprocess.Popen

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()


def start_emulator(extra_args: list[str], timeout: float = 60.0) -> EmbeddedEmulator:
    """Run ``python -m server.emulator`` on 127.0.0.1, on a free port, and wait until it listens."""
    import server

    root = str(Path(server.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "server.emulator", "--host", "127.0.0.1", "--port", "0", *extra_args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env)
    emu = EmbeddedEmulator(url="", process=proc)
    atexit.register(emu.stop)
    line = b""
    try:
        with gevent.Timeout(timeout):
            line = proc.stdout.readline() if proc.stdout else b""
    except gevent.Timeout:
        pass
    text = line.decode(errors="replace").strip()
    if "listening on " not in text:
        emu.stop()
        raise UsageError(f"the built-in emulator did not start ({text or 'no output'}): run python -m server.emulator to see why")
    emu.url = text.split("listening on ", 1)[1].split()[0]
    return emu
