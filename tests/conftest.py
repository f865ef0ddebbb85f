"""Shared fixtures: the emulator and the sidecar as real processes on 127.0.0.1 (helpers in tests/helpers.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

# Bytecode kept, whatever the environment says (a machine here sets PYTHONDONTWRITEBYTECODE=1): without it each of
# pytest -n's workers rewrote and compiled all 80 test modules again (collection 4.4 s a process, 2.7 s with them),
# and every emulator, sidecar and Locust process the suite starts compiled the package from source
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
# The runs the suite makes write no figures (--no-figures, by its environment variable: ~1 s of matplotlib at each
# run's end, some 400 runs); the figures' own tests ask for them (tests/test_figures.py)
os.environ["VLLM_LOAD_NO_FIGURES"] = "true"

import locust  # noqa: E402,F401  (first: see below)
import pytest

from tests.helpers import Proc

pytest_plugins = ["tests.suite"]  # markers (slow, e2e, quiet_cores), the quiet cores' lock, the budgets


def _xdist_on_real_threads() -> None:
    """pytest-xdist's worker waits for its next test on an execnet Event that execnet's reader thread (a real OS
    thread, started before Locust's monkey-patching) sets; made after the patching, that Event and its locks were
    gevent's, and the worker died at once ("LoopExit: This operation would block forever"). A worker's execnet keeps
    real locks (gevent keeps the originals): between tests the main thread waits on one; nothing of a test runs then."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    import execnet.gateway_base as base
    from gevent import monkey

    allocate = monkey.get_original("_thread", "allocate_lock")
    rlock = monkey.get_original("_thread", "RLock")
    start, ident = monkey.get_original("_thread", "start_new_thread"), monkey.get_original("_thread", "get_ident")
    sleep = monkey.get_original("time", "sleep")

    class RealEvent:
        """threading.Event's interface on a real lock: held while the event is clear."""

        def __init__(self) -> None:
            self._guard, self._gate, self._set = allocate(), allocate(), False
            self._gate.acquire()

        def is_set(self) -> bool:
            return self._set

        def set(self) -> None:
            with self._guard:
                if not self._set:
                    self._set = True
                    self._gate.release()

        def clear(self) -> None:
            with self._guard:
                if self._set:
                    self._gate.acquire()
                    self._set = False

        def wait(self, timeout: float | None = None) -> bool:
            if self._set:
                return True
            if self._gate.acquire(True, -1 if timeout is None else timeout):
                self._gate.release()
            return self._set

    model = base.MainThreadOnlyExecModel
    model.Event = lambda self: RealEvent()
    model.Lock = model.RLock = lambda self: rlock()
    model.start = lambda self, func, args=(): start(func, args)
    model.get_ident = lambda self: ident()
    model.sleep = lambda self, delay: sleep(delay)


_xdist_on_real_threads()

# Importing Locust monkey-patches the process (gevent). The whole suite did it while collecting (test_busy_host imports
# the plugin), before any test ran; a subset without that module imported it mid-run, after ssl was in use, and the
# patch recursed in SSLContext (test_sweep's check of Locust's private call failed after test_reset and
# test_security). Imported here first, every selection of tests runs as the whole suite does.


def _factory(*module_args: str):
    """Fixture body: yields ``start(*extra, stderr=...)`` for processes of one kind, stops them all after."""
    procs: list[Proc] = []

    def start(*extra: str, stderr: Any = subprocess.PIPE) -> Proc:
        proc = Proc([*module_args, *extra], stderr=stderr)
        procs.append(proc)
        return proc

    yield start
    for p in procs:
        p.stop()


def _served(build: Any, *first: str):
    """Fixture body: yields ``start(*args)`` for servers served on this process's event loop, stopped after."""
    served: list = []

    def start(*extra: str) -> Any:
        server = build([*first, *extra]).start()
        served.append(server)
        return server

    yield start
    for s in served:
        s.stop()


@pytest.fixture
def emulator_factory():
    """Emulators served in the test's process (a few ms each, no port wait): a run in another process or in this
    one (``run_in_process``) reaches it while the test waits, gevent serving it meanwhile."""
    from server.emulator.cli import build

    yield from _served(build, "--host", "127.0.0.1", "--port", "0", "--log-stats-interval", "0")


@pytest.fixture
def emulator_process_factory():
    """Emulators as processes of their own: a test that kills one, pins it to a core, or needs its timing apart
    from the test's loop."""
    yield from _factory("-m", "server.emulator", "--port", "0")


@pytest.fixture
def sidecar_factory():
    from server.sidecar.app import build

    yield from _served(build, "--listen", "127.0.0.1:0")
