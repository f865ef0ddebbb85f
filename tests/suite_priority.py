"""How a ``quiet_cores`` test gets the cores under ``pytest -n``: by priority where the session may give it, else by
waiting for the others to finish (tests/suite.py).

With CAP_SYS_NICE (root on CI's VM and here) every worker runs its tests at nice 19, and a quiet test lifts its worker
and every process it started to nice 0 for its duration: the scheduler gives it a core whenever it wants one (a nice-0
task weighs 1024 to a nice-19 one's 15, and the native reader runs SCHED_FIFO above both), so the quiet tests run from
the session's start beside the others instead of one at a time after them. That tail was 368-414 s of a 1,175-1,285 s
session at a quarter of the cores' use. Without the capability a lifted nice could not come down again: the quiet tests
then wait, as before, until no other test runs (``VLLM_LOAD_TEST_QUIET=wait`` forces that)."""

from __future__ import annotations

import os

#: the nice of every test but a quiet one, and of what it starts
BACKGROUND = 19
#: how the quiet tests get their cores: "nice" or "wait" (the controller decides, its workers inherit it)
MODE_ENV = "VLLM_LOAD_TEST_QUIET"
CAP_SYS_NICE = 23


def can_lift() -> bool:
    """CAP_SYS_NICE in this process's effective set: a nice raised can be lowered again."""
    try:
        with open("/proc/self/status") as f:
            caps = next(line for line in f if line.startswith("CapEff:")).split()[1]
        return bool(int(caps, 16) >> CAP_SYS_NICE & 1)
    except (OSError, StopIteration, ValueError):
        return False


def choose_mode() -> str:
    """The session's mode, decided once in the controller (a value the user set wins)."""
    mode = os.environ.get(MODE_ENV) or ("nice" if can_lift() else "wait")
    os.environ[MODE_ENV] = mode
    return mode


def by_priority() -> bool:
    """Quiet tests get their cores by priority in this session (a worker of ``pytest -n`` under the "nice" mode)."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER")) and os.environ.get(MODE_ENV) == "nice"


def set_nice(value: int, tree: bool) -> None:
    """Every thread of this process (Linux's nice is a thread's; the ones started later inherit it from their
    starter) and, with ``tree``, of every process it started, to ``value``."""
    pids = [os.getpid()]
    if tree:
        import psutil

        pids += [p.pid for p in psutil.Process().children(recursive=True)]
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # gone meanwhile
        for tid in tids:
            try:
                os.setpriority(os.PRIO_PROCESS, int(tid), value)
            except OSError:
                pass  # gone meanwhile
