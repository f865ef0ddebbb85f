"""The master's port, settled right after Locust parses its options (before its runner binds anything).

A ``--processes`` master whose port another Locust master held died in Locust's raw traceback; with only
``--master-bind-port`` its forked workers still joined the default port (5557: another master, or nothing) and the
run hung past ``-t``. Here the workers of ``--processes`` join the port their master binds, and a port in use is one
line and exit 2.
"""

from __future__ import annotations

import errno
import socket
from typing import Any

from vllm_load.errors import die

#: Locust's default worker port
DEFAULT_PORT = 5557
_settled: list[bool] = []


#: seconds a --processes master waits for its own workers to join (--expect-workers-max-wait, when not given)
PROCESSES_JOIN_S = 60


def settle(options: Any) -> None:
    """Once per process (Locust parses again for its web UI's form): align --processes' workers with their
    master's port, and refuse a master port that is taken."""
    if _settled:
        return
    _settled.append(True)
    if getattr(options, "worker", False) or not (getattr(options, "master", False) or getattr(options, "processes", 0)):
        return
    bind_port = int(getattr(options, "master_bind_port", DEFAULT_PORT))
    if getattr(options, "processes", 0) and int(getattr(options, "master_port", DEFAULT_PORT)) == DEFAULT_PORT:
        options.master_port = bind_port  # the forked workers join their own master
    if getattr(options, "processes", 0) and not getattr(options, "expect_workers_max_wait", 0):
        # its own forks join in a second or two; one that never did held a --processes run at "1 of 2 connected"
        # for ever (seen once in a parallel test suite): Locust gives up, says so and exits 1 after this long
        options.expect_workers_max_wait = PROCESSES_JOIN_S
    host = str(getattr(options, "master_bind_host", "127.0.0.1") or "127.0.0.1")
    why = in_use("0.0.0.0" if host == "*" else host, bind_port)
    if why:
        die(f"the master's port {bind_port} on {host} cannot be bound ({why}: another Locust master?): give a free "
            "one with --master-bind-port N" + (" (--processes: its workers follow it)" if getattr(
                options, "processes", 0) else " (and --master-port N on the workers)"))


def in_use(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be bound now (None: it can)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            return "in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
    return None
