"""One server configuration's process: started from the --serve template in a process group of its own with its
log captured, waited for until it serves, stopped by its process group (vLLM forks engine processes)."""

from __future__ import annotations

import os
import random
import shlex
import sys
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from vllm_load.errors import UsageError
from vllm_load.runtime.server_wait import probe
from vllm_load.tune.children import spawning, stop_group


def free_port() -> int:
    """A port nothing on this host uses now, for a server that takes a port number, not 0: picked below the kernel's
    ephemeral range, since a server that binds a minute later (vLLM loading its model) found a port from bind(0)
    taken by a client connection's local end (CI, with the suite's load tests beside it: EADDRINUSE)."""
    low = ephemeral_low()
    for _ in range(200):
        port = random.randrange(20000, low) if low > 20100 else 0
        with socket.socket() as s:
            try:
                s.bind(("", port))  # the wildcard: taken if any address of this host uses the port
            except OSError:
                continue
            return s.getsockname()[1]
    raise OSError("no free port below the ephemeral range")


def ephemeral_low() -> int:
    """Where the kernel's range of ports for outgoing connections starts (Linux; 32768 elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def render(template: str, params: dict[str, object], port: int) -> list[str]:
    """The server's argv: ``{port}`` and every grid parameter ``{name}`` filled in (one line on a name the
    template uses and the grid does not give)."""
    try:
        text = template.format(port=port, **params)
    except KeyError as exc:
        raise UsageError(f"--serve uses {{{exc.args[0]}}}, which no --grid parameter gives "
                         f"(they are: port, {', '.join(params) or 'none'})") from None
    except (IndexError, ValueError) as exc:
        raise UsageError(f"--serve {template!r} is not a valid template ({exc}): write e.g. 'vllm serve M --port {{port}}'") from None
    return with_program_found(shlex.split(text))


def with_program_found(argv: list[str]) -> list[str]:
    """A program not on PATH but installed beside this Python (``.venv/bin/vllm-load tune`` run without activating
    the venv: its ``vllm-load-emulator`` and ``vllm`` are there) is started from there."""
    if argv and "/" not in argv[0] and shutil.which(argv[0]) is None:
        beside = Path(sys.executable).parent / argv[0]
        if beside.is_file() and os.access(beside, os.X_OK):
            return [str(beside), *argv[1:]]
    return argv


@dataclass
class ServerProcess:
    argv: list[str]
    url: str
    log: Path
    proc: subprocess.Popen | None = None

    def start(self, ready_timeout: float, say: callable = print) -> str | None:  # type: ignore[valid-type]
        """Start and wait until /health and /v1/models answer; None, or why it never served (it is stopped)."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            try:
                with spawning():  # held by self before a signal can leave it running
                    self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as exc:
                return f"cannot start {self.argv[0]!r}: {exc.strerror or exc}"
        deadline = time.monotonic() + ready_timeout
        next_say = time.monotonic() + 30
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                return f"the server exited with code {code} at start: {self.last_log_line()}"
            if probe(self.url, models=True, timeout=2.0) is None:
                return None
            if time.monotonic() >= next_say:
                say(f"vllm-load tune: waiting for {self.url} ({int(deadline - time.monotonic())} s left)")
                next_say += 30
            time.sleep(0.5)
        self.stop()
        return f"the server did not serve within {ready_timeout:.0f} s (--server-ready-timeout): {self.last_log_line()}"

    def crashed(self) -> str | None:
        """Why the server is gone mid-search, or None while it runs."""
        if self.proc is not None and self.proc.poll() is not None:
            return f"the server exited with code {self.proc.returncode} mid-search: {self.last_log_line()}"
        return None

    def stop(self, grace: float = 30.0) -> None:
        if self.proc is not None:
            stop_group(self.proc, grace)

    def last_log_line(self) -> str:
        try:
            lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return "(no log)"
        return (lines[-1].strip()[:200] if lines else "(empty log)") + f" (log: {self.log})"
