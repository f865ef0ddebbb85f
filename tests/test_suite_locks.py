"""The suite's own locks (tests/suite.py): what keeps real servers from starting more than two at once."""

from __future__ import annotations

import fcntl
import subprocess
import sys

import pytest

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


if __name__ == "__main__":
    pytest.main([__file__])


def test_a_nice_set_reaches_every_thread_of_the_process_and_every_process_it_started():
    """A quiet test lifts (and lowers back) its worker's threads, those started before it too, and its children's
    children: raised here (which needs no privilege), in a process of its own."""
    code = """
import os, subprocess, threading, time
from tests.suite_priority import set_nice
stop = threading.Event()
t = threading.Thread(target=stop.wait)  # started before the change: its own nice is its own
t.start()
kid = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
import psutil
while not psutil.Process(kid.pid).children():
    time.sleep(0.01)
set_nice(7, tree=True)
nices = [os.getpriority(os.PRIO_PROCESS, int(tid)) for tid in os.listdir("/proc/self/task")]
kids = [p.nice() for p in psutil.Process().children(recursive=True)]
print(sorted(set(nices)), sorted(set(kids)), len(kids))
stop.set()
for p in psutil.Process().children(recursive=True):
    p.kill()
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("] [")[0] == "[7" and out.stdout.strip().endswith("[7] 2"), out.stdout


def test_the_session_lifts_quiet_tests_only_where_it_may_lower_them_again(monkeypatch):
    from tests import suite_priority

    monkeypatch.delenv(suite_priority.MODE_ENV, raising=False)
    assert suite_priority.choose_mode() == ("nice" if suite_priority.can_lift() else "wait")
    monkeypatch.setenv(suite_priority.MODE_ENV, "wait")  # the user's choice wins
    assert suite_priority.choose_mode() == "wait"
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert not suite_priority.by_priority()
    monkeypatch.setenv(suite_priority.MODE_ENV, "nice")
    assert suite_priority.by_priority()
