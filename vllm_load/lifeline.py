"""A child goes when the process that started it goes, however that one died (``kill -9`` included).

Linux's ``PR_SET_PDEATHSIG`` has the kernel signal the child when its parent exits: without it a killed run left
its embedded emulator and sidecar running (the sidecar's file growing), and a killed ``--processes`` master left
its workers sending at full rate 40 s past ``-t``. Elsewhere a daemon thread watches the parent's pid instead.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

#: the variable a parent sets to its pid for the children it starts (server/ reads it at start-up)
PARENT_ENV = "VLLM_LOAD_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int | None = None, sig: int = signal.SIGTERM) -> str:
    """Arrange ``sig`` for this process when ``parent`` (default: the current parent) exits; returns how. The kernel
    sends it each time the thread this process is parented to exits, so a killed multi-threaded parent can send it
    more than once: its handler must act once."""
    parent = os.getppid() if parent is None else parent
    how = "watch"
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0:
                how = "pdeathsig"
        except (OSError, AttributeError):
            pass
    if how == "watch":
        threading.Thread(target=_watch, args=(parent, sig), daemon=True, name="vllm-load-lifeline").start()
    if os.getppid() != parent:  # it died before the arrangement: go now
        os.kill(os.getpid(), sig)
    return how


def _watch(parent: int, sig: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os.kill(os.getpid(), sig)


def from_environment() -> None:
    """In a child started with ``PARENT_ENV`` set: die with that parent (a no-op without it)."""
    value = os.environ.get(PARENT_ENV, "")
    if value.isdigit():
        die_with_parent(int(value))


def child_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a child that must die with this process."""
    return {**env, PARENT_ENV: str(os.getpid())}
