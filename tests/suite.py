"""The suite's own rules, as a pytest plugin (``tests/conftest.py`` loads it): which tests are slow, the quiet cores a
timing test gets beside the others of ``pytest -n``, and the budgets (docs in README.md, "Tests").

- ``slow``: the full suite's bulk (real servers, swarms of processes, namespaces, capacity searches, the timing
  tests that need the cores to themselves), left out of the developer's ``-m 'not slow'``; every test of
  ``SLOW_MODULES``, every ``e2e`` and every ``quiet_cores`` test is one (the quiet ones ran one after another at the
  fast selection's end: 60-70 s of its 3 minutes, the other workers idle).
- ``e2e``: starts a real Locust process, for what only a process shows (signals, forks, a CPU pinned, resource
  limits, the console's order against Locust's own tables, exit codes of the command itself). Everything else runs
  in the test's process (``tests/helpers.run_in_process``).
- ``quiet_cores``: the test bounds a time the client keeps (a send's lateness, a gap against the server's schedule,
  the trust verdict on a quiet machine): under ``pytest -n`` it runs in a CPU cgroup above the other workers'
  (``tests/suite_priority.py``), or, where the session cannot make one, alone (the other workers wait); it is the
  only kind ``tests/test_busy_suite.py`` leaves out beside its busy loops. A check on counts, ids or order never is.
- The whole suite runs the fast selection among its slow tests (a busy host: it says the load they met); the busy
  suite, the fast selection beside a busy loop on every core, runs when named.
- Budgets: the fast selection starts at most ``LOCUST_PROCESSES_FAST`` Locust processes; no test's call takes over
  ``TEST_LIMIT_S`` but the real servers' (``LONG_TESTS``); the session's wall time is said beside its budget.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import subprocess
import tempfile
import time
from typing import Any, Iterator

import pytest

from tests import suite_priority

#: the modules whose tests are all slow (real vLLMs, swarms of processes, namespaces, capacity searches, browsers)
SLOW_MODULES = frozenset({
    "test_real_vllm", "test_real_vllm_pooling", "test_real_vllm_reasoning", "test_real_vllm_tune",
    "test_real_vllm_vision", "test_real_vllm_speech", "test_saturation", "test_tune", "test_netns", "test_process_faults", "test_busy_host",
    "test_faults", "test_compose", "test_kubernetes", "test_packaging", "test_webui", "test_sweep",
    "test_security", "test_router", "test_transformers_serve", "test_real_vllm_fleet", "test_real_vllm_scheduler",
    "test_pd",  # the real vllm-router binary in front of an emulator pair: a real server process
    "test_page_screenshots",  # a Chromium over four pages
})
#: the test that runs the fast selection beside busy loops (the whole suite leaves that selection to it)
BUSY_SUITE = "test_busy_suite.py::test_the_fast_selection_passes_beside_a_busy_loop_on_every_core"
#: Locust processes the fast selection may start (each costs an interpreter, an emulator and a sidecar: seconds)
LOCUST_PROCESSES_FAST = 0
#: the longest a test's call may take (seconds), but the named real-server ones
TEST_LIMIT_S = 60.0
LONG_TESTS = ("test_real_vllm", "test_transformers_serve", "test_real_vllm_tune", "test_saturation", "test_tune",
              "test_real_vllm_fleet", "test_real_vllm_scheduler",
              "test_busy_suite",
              # a Chromium and a Locust process, each starting beside the suite: 10-17 s alone, 45-60 s beside it
              "test_webui")
#: the session's budget in seconds on 2 cores: the full suite, and the fast selection (README.md, "Tests")
BUDGET_S = {"full": 20 * 60, "fast": 3 * 60}
#: the directory of the quiet-cores lock files, shared by pytest -n's workers (set by the controller)
LOCK_ENV = "VLLM_LOAD_TEST_LOCKS"


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "e2e: starts a real Locust process (what only a process shows); slow too")
    config.addinivalue_line("markers", "quiet_cores: bounds a time the client keeps: runs alone under pytest -n, "
                                       "and is left out beside busy loops")
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault(LOCK_ENV, tempfile.mkdtemp(prefix="vllm-load-test-locks-"))
        if getattr(config.option, "numprocesses", None) and suite_priority.choose_mode().startswith("cgroup:"):
            atexit.register(suite_priority.remove)
    config._vllm_load = {"started": time.monotonic(), "locust": 0, "locust_tests": [], "long": [], "load": [],
                         "slow": 0}
    _count_locust_processes(config)


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which names each item by its group (--dist loadgroup)
def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    shared = set()
    for item in items:
        if item.module.__name__.rsplit(".", 1)[-1] in SLOW_MODULES or item.get_closest_marker("e2e") or \
                item.get_closest_marker("quiet_cores"):
            item.add_marker(pytest.mark.slow)
    _leave_the_busy_suite_out_of_the_whole(config, items)
    for item in items:
        if _alone(item):
            # one worker runs them all, one after another: a single quiet test waits for the cores at a time, and
            # the other workers never find the room empty mid-run (with several waiting on several workers, the
            # last two workers running between tests let one in: 5 workers then waited 211 s behind it)
            item.add_marker(pytest.mark.xdist_group("quiet-cores"))
        elif _shares_a_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
            shared.add(item)
    # the order pytest -n hands them out in (--no-loadscope-reorder keeps it, pyproject.toml): by priority
    # (suite_priority.py) the quiet_cores tests first, on one worker beside the others; then the modules sharing a
    # server (their tests run one after another on one worker), then the rest, then the tests that run alone (one
    # worker, at the end, each once the others are done): the busy suite, then, waiting for the cores, the quiet_cores
    # tests (xdist's own order, biggest group first, gave the quiet group a worker at the start, idle 134 s of 200);
    # among the rest the slow ones first, so the fast selection's seconds-long tests fill the workers' gaps at the end
    first = suite_priority.base_dir() is not None
    items.sort(key=lambda item: (not (first and _quiet(item)), _alone(item), not item.nodeid.endswith(BUSY_SUITE),
                                 item not in shared, item.get_closest_marker("slow") is None))


def _alone(item: Any) -> bool:
    """It runs with the cores to itself: a ``quiet_cores`` test (by priority, or alone), or the busy suite, whose
    loops take every core."""
    return _quiet(item) or item.nodeid.endswith(BUSY_SUITE)


def _quiet(item: Any) -> bool:
    return item.get_closest_marker("quiet_cores") is not None


def _leave_the_busy_suite_out_of_the_whole(config: Any, items: list[Any]) -> None:
    """The whole suite (no -m, no -k) runs the fast selection among its slow tests, not inside ``test_busy_suite``:
    beside 4 workers' real vLLM starts, browsers and swarms on 2 cores the host is busy all along (the session
    prints the load its fast tests met), and the busy suite ran alone, its loops on every core and the other workers
    idle: 254 s of a 1,622 s session, serial. ``pytest tests/test_busy_suite.py`` runs it."""
    if config.option.markexpr or config.option.keyword or all(i.nodeid.endswith(BUSY_SUITE) for i in items):
        return
    busy = [i for i in items if i.nodeid.endswith(BUSY_SUITE)]
    if busy:
        config.hook.pytest_deselected(items=busy)
        items[:] = [i for i in items if not i.nodeid.endswith(BUSY_SUITE)]


def _shares_a_fixture(item: Any) -> bool:
    """A test that uses a module- or session-scoped fixture (a real vLLM, a router's replicas): its module's tests
    go to one worker of ``pytest -n`` (``--dist loadgroup``, pyproject.toml), which builds the fixture once; spread
    over 6 workers, test_real_vllm's 8 tests once started up to 6 vLLMs side by side."""
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    module = item.nodeid.split("::")[0]  # its file, as a fixture defined there is based
    return any(d.scope in ("module", "session") and not d.argname.startswith("_") and d.baseid == module
               for fixturedefs in defs.values() for d in fixturedefs)


def _count_locust_processes(config: Any) -> None:
    """Every Locust process a test starts (``python -m locust``, the ``locust`` script), counted for the budget."""
    popen_init = subprocess.Popen.__init__

    def init(self: Any, args: Any, *a: Any, **kw: Any) -> None:
        argv = [str(x) for x in (args if isinstance(args, (list, tuple)) else [args])]
        if any(x.endswith("/locust") or x == "locust" for x in argv[:1]) or \
                any(argv[i] == "-m" and argv[i + 1] == "locust" for i in range(len(argv) - 1)):
            config._vllm_load["locust"] += 1
            config._vllm_load["locust_tests"].append(os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0])
        popen_init(self, args, *a, **kw)

    subprocess.Popen.__init__ = init  # type: ignore[method-assign]


@contextlib.contextmanager
def locked(name: str, kind: int) -> Iterator[None]:
    """``flock`` of ``kind`` (LOCK_SH, LOCK_EX) on the lock file ``name`` the session's processes share (nothing
    without the session's lock folder)."""
    where = os.environ.get(LOCK_ENV)
    if not where:
        yield
        return
    with open(os.path.join(where, name), "a") as fh:
        fcntl.flock(fh, kind)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def one_of(name: str, slots: int) -> Iterator[None]:
    """An exclusive ``flock`` on one of ``slots`` lock files ``name-0`` … : a free one if any, else (blocking) the one
    this worker's number picks, so that at most ``slots`` holders run at once without polling."""
    where = os.environ.get(LOCK_ENV)
    if not where:
        yield
        return
    files = [open(os.path.join(where, f"{name}-{i}"), "a") for i in range(slots)]
    try:
        held = None
        for fh in files:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            held = fh
            break
        if held is None:
            held = files[int("0" + os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]) % slots]
            fcntl.flock(held, fcntl.LOCK_EX)
        yield
    finally:
        for fh in files:
            fh.close()  # closing drops its lock


@pytest.fixture(autouse=True)
def _cores(request: Any) -> Any:
    """By priority (suite_priority.py) a ``quiet_cores`` test moves its worker and what it started above the others.
    Else a shared lock on one file for every test, an exclusive one for a ``quiet_cores`` test: it has the machine's
    cores to itself. The others never wait for it (flock lets a shared lock in beside a waiting exclusive one), so a
    quiet test waits until no other test runs, which, the quiet tests sorted last, is the session's end. (A
    turnstile that made the others wait for a pending quiet test idled 5 workers for up to 355 s each while it
    waited for one real-vLLM test to end.)"""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    # by priority a quiet test runs beside the others, above them; else alone
    lift = suite_priority.by_priority() and _quiet(request.node)
    with locked("room", fcntl.LOCK_EX if _alone(request.node) and not lift else fcntl.LOCK_SH), \
            (suite_priority.lifted() if lift else contextlib.nullcontext()):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Any:
    """VLLM_LOAD_TEST_CPU=FILE: each test's CPU seconds (this process and the children it reaped) and wall seconds
    appended to FILE, for the budget's accounts."""
    if _CONFIG:  # the load the fast selection meets beside the slow tests (a session that ran both says it)
        state = _CONFIG[0]._vllm_load
        if item.get_closest_marker("slow") is None:
            state["load"].append(os.getloadavg()[0])
        else:
            state["slow"] += 1
    out = os.environ.get("VLLM_LOAD_TEST_CPU")
    if not out:
        yield
        return
    import resource

    def cpu() -> float:
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    used, began = cpu(), time.monotonic()
    yield
    with open(out, "a") as fh:  # + the worker and its start (wall clock): each worker's timeline, its gaps
        fh.write(f"{cpu() - used:.2f} {time.monotonic() - began:.2f} {item.nodeid} "
                 f"{os.environ.get('PYTEST_XDIST_WORKER', '-')} {time.time() - (time.monotonic() - began):.1f}\n")


def pytest_runtest_logreport(report: Any) -> None:
    if report.when == "call" and report.duration > TEST_LIMIT_S and \
            not any(f"/{m}.py::" in f"/{report.nodeid}" for m in LONG_TESTS):
        _state(report)["long"].append(f"{report.nodeid} ({report.duration:.0f} s)")


def _state(report: Any) -> dict:
    return _CONFIG[0]._vllm_load


_CONFIG: list = []


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: Any) -> None:
    _CONFIG[:] = [session.config]


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    """Workers hand their count to the controller; the controller (or a run without -n) judges the budgets."""
    state = session.config._vllm_load
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["locust"] = state["locust"]
        session.config.workeroutput["locust_tests"] = state["locust_tests"]
        session.config.workeroutput["load"] = state["load"]
        session.config.workeroutput["slow"] = state["slow"]
        return
    fast = "not slow" in (session.config.option.markexpr or "")
    elapsed = time.monotonic() - state["started"]
    budget = BUDGET_S["fast" if fast else "full"]
    lines = [f"suite: {elapsed:.0f} s of its {budget} s budget ({'fast' if fast else 'full'}), "
             f"{state['locust']} Locust processes started"]
    if getattr(session.config.option, "numprocesses", None) and not fast:
        lines.append("suite: the quiet_cores tests ran " + (
            f"in a CPU cgroup above the other workers ({suite_priority.base_dir()})" if suite_priority.base_dir()
            else "last, alone (no CPU cgroup: not root, no cgroup v1 cpu controller, or VLLM_LOAD_TEST_QUIET=wait)"))
    if state["load"] and state["slow"] and not fast:
        load = sorted(state["load"])
        lines.append(f"suite: the fast selection's {len(load)} tests ran beside the slow ones at a 1-min load average "
                     f"of {load[len(load) // 2]:.1f} (median; min {load[0]:.1f}) on {len(os.sched_getaffinity(0))} "
                     "cores")
    failed = []
    if fast and state["locust"] > LOCUST_PROCESSES_FAST:
        failed.append(f"the fast selection started {state['locust']} Locust processes (at most "
                      f"{LOCUST_PROCESSES_FAST}): test the logic in-process, or mark the test e2e: "
                      + ", ".join(sorted(set(state["locust_tests"]))))
    if state["long"]:
        failed.append(f"over {TEST_LIMIT_S:.0f} s: " + ", ".join(state["long"]))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for line in lines + [f"suite: budget exceeded: {f}" for f in failed]:
        if reporter is not None:
            reporter.write_line(line)
    if failed and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest -n: a worker's count joins the controller's."""
    out = getattr(node, "workeroutput", {}) or {}
    if _CONFIG:
        _CONFIG[0]._vllm_load["locust"] += int(out.get("locust", 0))
        _CONFIG[0]._vllm_load["locust_tests"] += list(out.get("locust_tests", []))
        _CONFIG[0]._vllm_load["load"] += list(out.get("load", []))
        _CONFIG[0]._vllm_load["slow"] += int(out.get("slow", 0))
