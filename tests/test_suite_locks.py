"""The suite's own means (tests/suite.py, tests/suite_priority.py): what keeps real servers from starting more than two
at once, and the CPU groups that put a quiet test above the others."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys

from tests.helpers import ROOT, wait_for
from tests.suite import LOCK_ENV, one_of


def _held(path) -> bool:
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


def _waiting(pid: int) -> bool:
    """The process waits for a flock (a "->" line of /proc/locks names its waiters)."""
    with open("/proc/locks") as f:
        return any(line.split()[1] == "->" and line.split()[5] == str(pid) for line in f if "->" in line)


def test_at_most_two_servers_start_at_once_and_the_third_starts_when_one_is_ready(tmp_path, monkeypatch):
    monkeypatch.setenv(LOCK_ENV, str(tmp_path))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    slots = [tmp_path / "start-0", tmp_path / "start-1"]
    first = one_of("start", 2)
    first.__enter__()
    assert [_held(p) for p in slots] == [True, False]  # a free slot is taken
    with one_of("start", 2):
        assert [_held(p) for p in slots] == [True, True]
        # the third holder is another process, as pytest -n's workers are (Locust's plugin makes threads greenlets)
        third = subprocess.Popen([sys.executable, "-c", "import sys\nfrom tests.suite import one_of\n"
                                  "with one_of('start', 2):\n    print('in', flush=True)\n    sys.stdin.readline()"],
                                 cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: _waiting(third.pid), timeout=30, what="the third start waiting for a slot")
            first.__exit__(None, None, None)  # slot 0 freed: the third waits on slot 1 (gw3: 3 % 2), held here
            assert _waiting(third.pid)
        except BaseException:
            third.kill()
            raise
    try:
        assert third.stdout.readline() == "in\n"  # slot 1 freed: the third starts
        assert [_held(p) for p in slots] == [False, True]
        third.stdin.write("done\n")
        third.stdin.flush()
        assert third.wait(30) == 0
    finally:
        third.kill()
    assert [_held(p) for p in slots] == [False, False]


def test_without_the_sessions_lock_folder_nothing_is_locked(monkeypatch):
    monkeypatch.delenv(LOCK_ENV, raising=False)
    with one_of("start", 2), one_of("start", 2), one_of("start", 2):
        pass


def test_a_quiet_test_moves_its_worker_and_all_it_started_to_the_quiet_group_and_back(tmp_path, monkeypatch):
    """The groups' files as the session writes them (a folder stands for cgroup v1's cpu controller here: the kernel's
    side, that a group's shares hold, is what the whole suite's quiet tests passing beside the others shows)."""
    from tests import suite_priority

    monkeypatch.setattr(suite_priority, "CPU_V1", str(tmp_path))
    monkeypatch.delenv(suite_priority.MODE_ENV, raising=False)
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale, alive = tmp_path / f"vllm-load-tests-{gone.pid}", tmp_path / f"vllm-load-tests-{os.getppid()}"
    stale.mkdir()
    alive.mkdir()
    mode = suite_priority.choose_mode()
    assert not stale.exists() and alive.exists()  # a killed session's groups go, a running one's stay
    base = tmp_path / f"vllm-load-tests-{os.getpid()}"
    assert mode == f"cgroup:{base}" and suite_priority.base_dir() == str(base)
    assert {g: (base / g / "cpu.shares").read_text() for g in ("background", "quiet")} == {"background": "2",
                                                                                          "quiet": "1024"}
    # the controller, whose workers are born there
    assert (base / "background" / "cgroup.procs").read_text() == f"{os.getpid()}\n"
    _kid = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])  # held: a collected Popen lost the child
    try:
        wait_for(lambda: len(suite_priority.tree()) == 3, timeout=30, what="the child's child")
        suite_priority.move(suite_priority.tree(), "quiet")
        assert sorted(map(int, (base / "quiet" / "cgroup.procs").read_text().split())) == sorted(suite_priority.tree())
    finally:
        import psutil

        for p in psutil.Process().children(recursive=True):
            p.kill()
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert suite_priority.by_priority()
    monkeypatch.setenv(suite_priority.MODE_ENV, "wait")  # the user's choice wins
    assert suite_priority.choose_mode() == "wait" and not suite_priority.by_priority()


def test_without_a_cpu_controller_to_write_the_quiet_tests_wait(tmp_path, monkeypatch):
    from tests import suite_priority

    (tmp_path / "file").write_text("")
    monkeypatch.setattr(suite_priority, "CPU_V1", str(tmp_path / "file"))  # no folder can be made below a file
    monkeypatch.delenv(suite_priority.MODE_ENV, raising=False)
    assert suite_priority.choose_mode() == "wait" and suite_priority.base_dir() is None
