"""How a ``quiet_cores`` test gets the cores under ``pytest -n``: by a CPU cgroup of its own where the session may
make one, else by waiting for the others to finish (tests/suite.py).

As root with cgroup v1's ``cpu`` controller (CI's VM and here), the controller makes two groups: every worker runs in
``background`` (cpu.shares 2), and a quiet test moves its worker and every process it started to ``quiet`` (cpu.shares
1024, what the machine's own processes have) for its duration: whenever it wants a core it gets one, so the quiet tests
run from the session's start beside the others instead of one at a time after them (that tail was 368-414 s of a
1,175-1,285 s session, at a quarter of the cores' use). A group, not nice: a process that starts a session of its own
(vLLM's fixture script, Locust's processes, Chromium) leaves its parent's nice behind in an autogroup of its own, and
beside nice-19 workers the quiet tests still waited 457-601 ms a second for a CPU; a cgroup is inherited by every
descendant. Elsewhere the quiet tests wait, as before, until no other test runs (``VLLM_LOAD_TEST_QUIET=wait`` forces
that)."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

#: how the quiet tests get their cores: "cgroup:DIR" or "wait" (the controller decides once, its workers inherit it)
MODE_ENV = "VLLM_LOAD_TEST_QUIET"
CPU_V1 = "/sys/fs/cgroup/cpu"
#: the shares of the two groups (cgroup v1's cpu.shares: 2 is its least, 1024 every other process's)
SHARES = {"background": 2, "quiet": 1024}


def choose_mode() -> str:
    """The session's mode, decided once in the controller (a value the user set wins), its groups made; the
    controller itself moves to ``background``, and the workers it starts are born there."""
    mode = os.environ.get(MODE_ENV) or _make_groups()
    os.environ[MODE_ENV] = mode
    if mode.startswith("cgroup:"):
        move([os.getpid()], "background")
    return mode


def _make_groups() -> str:
    _remove_stale()
    base = os.path.join(CPU_V1, f"vllm-load-tests-{os.getpid()}")
    try:
        for name, shares in SHARES.items():
            os.makedirs(os.path.join(base, name), exist_ok=True)
            with open(os.path.join(base, name, "cpu.shares"), "w") as f:
                f.write(str(shares))
    except OSError:  # not root, no cgroup v1 cpu controller (a cgroup v2 host), a read-only /sys
        remove(base)
        return "wait"
    return f"cgroup:{base}"


def _remove_stale() -> None:
    """The groups of sessions that were killed before they removed theirs (their controller's pid is gone)."""
    try:
        names = os.listdir(CPU_V1)
    except OSError:
        return
    for name in names:
        pid = name.removeprefix("vllm-load-tests-")
        if pid != name and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            remove(os.path.join(CPU_V1, name))


def base_dir() -> str | None:
    mode = os.environ.get(MODE_ENV, "")
    return mode.split(":", 1)[1] if mode.startswith("cgroup:") else None


def by_priority() -> bool:
    """Quiet tests get their cores by their group in this session (a worker of ``pytest -n``)."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER")) and base_dir() is not None


def tree() -> list[int]:
    """This process and every process it started (their children's children too)."""
    import psutil

    return [os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))]


@contextlib.contextmanager
def lifted() -> Iterator[None]:
    """This worker and every process it started in ``quiet`` while a test runs, then back in ``background``."""
    move(tree(), "quiet")
    try:
        yield
    finally:
        move(tree(), "background")


def move(pids: list[int], group: str) -> None:
    """Each process (all its threads) into ``group`` of the session's."""
    base = base_dir()
    if base is not None:
        _write_pids(os.path.join(base, group), pids)


def _write_pids(group: str, pids: list[str] | list[int]) -> None:
    """Into a cgroup, one write each: a process gone meanwhile fails its own write alone. Unbuffered: a buffered
    file kept the failed write and raised it again at its close (ProcessLookupError, when a PostgreSQL backend ended
    between the listing and the move)."""
    with open(os.path.join(group, "cgroup.procs"), "wb", buffering=0) as f:
        for pid in pids:
            try:
                f.write(f"{pid}\n".encode())
            except OSError:
                pass


def remove(base: str | None = None) -> None:
    """The session's groups, their processes (a server a test left) back in the machine's own group."""
    base = base or base_dir()
    if not base or not os.path.isdir(base):
        return
    for name in SHARES:
        group = os.path.join(base, name)
        try:
            with open(os.path.join(group, "cgroup.procs")) as f:
                _write_pids(CPU_V1, f.read().split())
        except OSError:
            pass
        try:
            os.rmdir(group)
        except OSError:
            pass
    try:
        os.rmdir(base)
    except OSError:
        pass
