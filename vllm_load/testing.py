"""vllm-load runs inside one process, for tests (this project's, or a user's of their own locustfiles).

``run(["-f", "locustfiles/chat.py", "--headless", "-u", "4", "-t", "3s"])`` builds what ``locust`` builds from the same
arguments: Locust's own parser (the plugin's options and the locustfile's included), an ``Environment`` with events
of its own, its runner (a local runner, or with ``--processes N`` a master and N workers joined over Locust's ZMQ on
127.0.0.1, as Locust's own ``test_runners.py`` runs them), the plugin's role object on each (``LocalProcess``,
``MasterProcess``, ``WorkerProcess``, made by the same init hook), Locust's headless start and stop, and its
shutdown: the quitting event, the exit code decision, the quit event. With no --host the embedded emulator and its
sidecar are served on this process's event loop (``InProcessChildren``) instead of as child processes. What the run
printed is captured; the ``Outcome`` holds it, the exit code, the run directory and the role objects themselves.

What differs from a ``locust`` process, by design: no interpreter per run, the emulator shares this process's event
loop (a timing test that needs the emulator's own core starts it as a process and gives --host), no signal of its
own, Locust's CSV writer and HTML report are not written. What only a process shows (signals, forks, the console's
order against Locust's own tables, exit codes of the real command) stays in the end-to-end tests.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import gevent
import gevent.event
from locust import events as global_events
from locust import log as locust_log
from locust import stats as locust_stats
from locust.argument_parser import get_parser
from locust.env import Environment
from locust.event import EventHook, Events
from locust.main import merge_locustfiles_content

from vllm_load.plugin import listeners, log_repeats
from vllm_load.plugin.process import Process, process_of
from vllm_load.runtime.embedded import CHILDREN, Children, Served, server_package


class InProcessChildren(Children):
    """The embedded emulator and sidecar, served on this process's event loop (no child process, no port wait)."""

    def emulator(self, args: list[str], log: Path | None) -> Served:
        cli = importlib.import_module(f"{server_package()}.emulator.cli")
        return cli.build(["--host", "127.0.0.1", "--port", "0", "--log-stats-interval", "0", *args]).start()

    def sidecar(self, vllm_url: str, out: Path) -> Served:
        app = importlib.import_module(f"{server_package()}.sidecar.app")
        return app.Sidecar.bind("127.0.0.1", 0, vllm_url, 1.0, out).start()


@dataclass
class Outcome:
    """What a run left: its exit code, what it printed (stdout, and stderr with the log lines), its run directory,
    and the role objects (``process``: the local runner's or the master's; ``workers``: each worker's)."""

    code: int
    stdout: str
    stderr: str
    run_dir: Path | None = None
    process: Process | None = None
    workers: list[Process] = field(default_factory=list)

    @property
    def returncode(self) -> int:  # the name subprocess gives it: a test can take either
        return self.code

    @property
    def run(self) -> Any:
        """The last run (``plugin.run.Run``): its plan, collector (merged totals, results) and generator."""
        return self.process.run if self.process is not None else None

    def summary(self) -> dict:
        """``summary.json`` as the run wrote it (the summary, the verdict, the SLO checks)."""
        import json

        assert self.run_dir is not None, "the run wrote no run directory"
        return json.loads((self.run_dir / "summary.json").read_text())

    def requests(self) -> list[dict]:
        """Every request line of the run's request logs (a swarm's workers each write their own)."""
        from vllm_load.rundir.reqlog import read_log

        assert self.run_dir is not None, "the run wrote no run directory"
        return [r for f in sorted(self.run_dir.glob("requests*.jsonl")) for r in read_log(f)]


def _greenlets() -> set:
    """gevent's greenlets alive in this process now."""
    import gc

    return {g for g in gc.get_objects() if isinstance(g, gevent.Greenlet) and not g.dead}


def _locustfile(args: list[str]) -> str:
    for i, a in enumerate(args):
        if a in ("-f", "--locustfile") and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--locustfile="):
            return a.split("=", 1)[1]
    raise ValueError("vllm_load.testing.run needs the locustfile: -f PATH")


def _hooks(events: Any) -> dict[str, list]:
    return {name: list(hook._handlers) for name, hook in vars(events).items() if isinstance(hook, EventHook)}


@dataclass
class _Loaded:
    """A locustfile, loaded as Locust loads it, and the listeners it put on Locust's global events (taken off them
    again: each environment here gets them on its own events, and a later run in this process does not)."""

    path: str
    user_classes: dict
    shape_class: Any
    hooks: dict[str, list]

    @classmethod
    def load(cls, path: str) -> _Loaded:
        before = _hooks(global_events)
        users, shapes, _tasks, shape = merge_locustfiles_content([path])
        added = {}
        for name, handlers in _hooks(global_events).items():
            new = [h for h in handlers if h not in before.get(name, [])]
            for h in new:
                getattr(global_events, name).remove_listener(h)
            if new:
                added[name] = new
        del shapes
        return cls(path, users, shape, added)

    def events(self) -> Events:
        """Events of an environment's own: the plugin's hooks, then the locustfile's."""
        own = Events()
        listeners.attach(own)
        for name, handlers in self.hooks.items():
            if name != "init_command_line_parser":
                for h in handlers:
                    getattr(own, name).add_listener(h)
        return own

    def parse(self, args: list[str]) -> Any:
        """Locust's parser with the plugin's options and the locustfile's own, as ``locust`` parses ``args``."""
        parser = get_parser(default_config_files=[])
        for h in self.hooks.get("init_command_line_parser", []):
            h(parser=parser)
        opts = parser.parse_args(args)
        if opts.headful:
            opts.headless = False
        return opts


class _Capture(io.StringIO):
    def fileno(self) -> int:  # some writers ask (faulthandler, subprocess): they get the real one
        return sys.__stderr__.fileno()


@contextlib.contextmanager
def _captured() -> Iterator[tuple[_Capture, _Capture]]:
    out, err = _Capture(), _Capture()
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("%(levelname)s/%(name)s: %(message)s"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        yield out, err
    finally:
        sys.stdout, sys.stderr = saved
        root.removeHandler(handler)
        root.setLevel(level)


@contextlib.contextmanager
def _environ(env: dict[str, str] | None, argv: list[str], cwd: Path | None) -> Iterator[None]:
    """The run's environment variables (``env``: set; None values: removed), its argv and working directory, for
    its length: the plugin reads each where ``locust`` would."""
    saved_env, saved_argv, saved_cwd = dict(os.environ), sys.argv, os.getcwd()
    for key, value in (env or {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    sys.argv = ["locust", *argv]
    if cwd is not None:
        os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)


class Swarm:
    """One Locust process's worth of vllm-load (or a master and its workers), built in this process."""

    def __init__(self, loaded: _Loaded, args: list[str], workers: int = 0, worker_args: list[str] | None = None,
                 in_process_children: bool = True) -> None:
        self.loaded = loaded
        self.children = InProcessChildren() if in_process_children else None
        self.opts = loaded.parse(args)
        self.workers: list[Environment] = []
        self.worker_args = list(worker_args or [])
        if workers:  # what locust's --processes sets up, with no fork: a master expecting N workers
            self.opts.master, self.opts.expect_workers, self.opts.processes = True, workers, None
            if not self.opts.master_bind_port or self.opts.master_bind_port == 5557:
                self.opts.master_bind_port = 0
        self.env = self._environment(self.opts, loaded.shape_class)
        self.web_ui: Any = None
        self.csv: Any = None  # --csv: Locust's CSV writer
        self.greenlets: list = []  # Locust main's own (stats history, the CSV writer)

    def _environment(self, opts: Any, shape: Any) -> Environment:
        env = Environment(user_classes=list(self.loaded.user_classes.values()), shape_class=shape,
                          events=self.loaded.events(), host=opts.host, reset_stats=opts.reset_stats,
                          parsed_options=opts, locustfile=os.path.basename(self.loaded.path),
                          parsed_locustfiles=[self.loaded.path], available_user_classes=self.loaded.user_classes,
                          available_shape_classes={type(shape).__name__: shape} if shape else {})
        if self.children is not None:
            setattr(env, CHILDREN, self.children)
        return env

    # -- Locust's main, in order --------------------------------------------------------------------------
    def init(self) -> None:
        """The runner(s) and the init event: the plugin's start-up (options, target, emulator) runs here."""
        opts, env = self.opts, self.env
        if opts.master:
            runner = env.create_master_runner(opts.master_bind_host, opts.master_bind_port)
        else:
            runner = env.create_local_runner()
        if opts.csv_prefix:
            self.csv = locust_stats.StatsCSVFileWriter(env, locust_stats.PERCENTILES_TO_REPORT, opts.csv_prefix,
                                                       opts.stats_history_enabled)
            self.greenlets.append(gevent.spawn(self.csv.stats_writer))
        self.greenlets.append(gevent.spawn(locust_stats.stats_history, runner))
        if not opts.headless:
            self.web_ui = env.create_web_ui(host=opts.web_host, port=opts.web_port, web_login=opts.web_login,
                                            delayed_start=True, userclass_picker_is_active=opts.class_picker,
                                            stats_csv_writer=self.csv)
        env.events.init.fire(environment=env, runner=runner, web_ui=self.web_ui)
        if self.web_ui is not None:
            self.web_ui.start()
        for _ in range(opts.expect_workers if opts.master else 0):
            wopts = self.loaded.parse(["-f", self.loaded.path, "--worker", *self.worker_args])
            wopts.run_time = wopts.csv_prefix = wopts.html_file = None
            shape = type(self.loaded.shape_class)() if self.loaded.shape_class is not None else None  # its own
            wenv = self._environment(wopts, shape)
            wrunner = wenv.create_worker_runner("127.0.0.1", runner.server.port)
            wenv.events.init.fire(environment=wenv, runner=wrunner, web_ui=None)
            self.workers.append(wenv)

    def start(self, timeout: float = 60.0) -> None:
        """Locust's headless start: a master waits for its workers, then the shape or the users, and -t."""
        opts, runner = self.opts, self.env.runner
        if opts.master:
            deadline = time.monotonic() + timeout
            while len(runner.clients.ready) < opts.expect_workers:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{len(runner.clients.ready)} of {opts.expect_workers} workers joined")
                gevent.sleep(0.05)
        if self.env.shape_class is not None:
            runner.start_shape()
            gevent.spawn(self._after_shape)
        else:
            gevent.spawn(runner.start, opts.num_users or 1, opts.spawn_rate or 1)
        if opts.run_time:
            gevent.spawn_later(opts.run_time, runner.quit)

    def _after_shape(self) -> None:
        self.env.runner.shape_greenlet.join()
        self.env.runner.quit()

    def wait(self, timeout: float) -> None:
        """Until the run's own end (-t, --num-requests, a trace replayed, a stop of its own) quits the runner."""
        group = self.env.runner.greenlet
        group.join(timeout=timeout)
        if len(group):
            raise TimeoutError(f"the run did not end within {timeout:g} s")

    def shutdown(self) -> int:
        """Locust's shutdown: the quitting event (the plugin's end of the run), the exit code, the runner's quit
        (a master's workers get theirs), Locust's last tables, the quit event (the plugin's end block)."""
        env, runner = self.env, self.env.runner
        env.events.quitting.fire(environment=env, reverse=True)
        if env.process_exit_code is not None:
            code = env.process_exit_code
        elif len(runner.errors) or len(runner.exceptions):
            code = self.opts.exit_code_on_error
        elif locust_log.unhandled_greenlet_exception:
            code = 2
        else:
            code = 0
        runner.quit()
        locust_stats.print_stats(runner.stats, current=False)
        locust_stats.print_percentile_stats(runner.stats)
        locust_stats.print_error_report(runner.stats)
        env.events.quit.fire(exit_code=code)
        if self.csv is not None:
            self.csv.close_files()
        for wenv in self.workers:
            wenv.runner.greenlet.join(timeout=10)
            wenv.events.quitting.fire(environment=wenv, reverse=True)
            wenv.runner.quit()
        return code

    def close(self) -> None:
        """What the run started here stops (the emulator and sidecar, the web UI, every greenlet)."""
        for env in [*self.workers, self.env]:
            process = process_of(env)
            if process is not None:
                process.close()
            if env.runner is not None:
                env.runner.greenlet.kill(block=True)
        if self.web_ui is not None and getattr(self.web_ui, "server", None) is not None:
            self.web_ui.stop()
        for g in self.greenlets:
            g.kill(block=False)


class Running:
    """A headless run going on in this process (``start``), in a greenlet of its own: the test does its part beside
    it (kills a server, reads a page) and then waits for the run's own end (``wait``) or ends it (``stop``)."""

    def __init__(self, args: list[str], cwd: Path | str | None, env: dict[str, str | None] | None, timeout: float,
                 worker_args: list[str] | None, emulator_process: bool) -> None:
        self.args = list(args)
        self.workers = 0
        if "--processes" in self.args:
            i = self.args.index("--processes")
            self.workers = int(self.args[i + 1])
            del self.args[i:i + 2]
        self.cwd, self.env, self.timeout = Path(cwd) if cwd is not None else None, env, timeout
        self.worker_args, self.emulator_process = worker_args, emulator_process
        self.swarm: Swarm | None = None
        self.started = gevent.event.Event()  # the users are starting (the runner exists)
        self.greenlet = gevent.spawn(self._run)

    def _run(self) -> Outcome:
        log_repeats.install().counts.clear()  # "logged once" counts per run, not per test process
        locust_log.unhandled_greenlet_exception = False
        before = _greenlets() | {gevent.getcurrent()}
        code = 0
        with _captured() as (out, err), _environ(self.env, self.args, self.cwd):
            try:
                loaded = _Loaded.load(_locustfile(self.args))
                self.swarm = Swarm(loaded, self.args, self.workers, self.worker_args,
                                   in_process_children=not self.emulator_process)
                self.swarm.init()
                opts = self.swarm.opts
                if opts.headless or opts.autostart:
                    self.swarm.start()
                self.started.set()
                if opts.headless:
                    self.swarm.wait(self.timeout)
                else:  # the web UI's process lives until it is stopped (Locust's main greenlet is the UI's)
                    self.swarm.web_ui.greenlet.join()
                code = self.swarm.shutdown()
            except SystemExit as exc:  # one line and exit 2 (bad input), as the command line leaves
                code = exc.code if isinstance(exc.code, int) else 1
            finally:
                self.started.set()
                if self.swarm is not None:
                    self.swarm.close()
                # nothing of the run outlives it (a locustfile's own greenlet, a server's loop): a later run or test
                # in this process would share the loop with it (one that held the loop 50 ms in 70 slowed a test 20x)
                gevent.killall(list(_greenlets() - before), block=True, timeout=5)
        return self._outcome(code, out.getvalue(), err.getvalue())

    def _outcome(self, code: int, out: str, err: str) -> Outcome:
        swarm = self.swarm
        if swarm is None:
            return Outcome(code, out, err)
        ready = [e.__dict__.get(listeners.READY) for e in (swarm.env, *swarm.workers)]
        processes = [r.value for r in ready if r is not None and r.ready()]  # closed at the end: still the objects
        process = processes[0] if ready[0] is not None and ready[0].ready() else None
        run_dir = process.run.plan.files.path if process is not None and process.run is not None else None
        return Outcome(code, out, err, run_dir, process, processes[1:] if process is not None else processes)

    def wait(self, timeout: float | None = None) -> Outcome:
        """Until the run ends by itself (-t, --num-requests, a stop of its own)."""
        return self.greenlet.get(timeout=timeout if timeout is not None else self.timeout + 60)

    @property
    def web_url(self) -> str:
        """The web UI's address (a run without --headless), once it listens."""
        self.started.wait()
        ui = self.swarm.web_ui if self.swarm is not None else None
        deadline = time.monotonic() + 30
        while ui is not None and getattr(ui, "server", None) is None and time.monotonic() < deadline:
            gevent.sleep(0.01)
        if ui is None or getattr(ui, "server", None) is None:
            raise RuntimeError("the run serves no web UI (--headless, or it failed at start-up)")
        return f"http://127.0.0.1:{ui.server.server_port}"

    def stop(self) -> Outcome:
        """End the run now, as its -t would (the drain, the end, the exit code; a web UI stops too), and wait for
        its end."""
        self.started.wait()
        if self.swarm is not None and self.swarm.env.runner is not None:
            self.swarm.env.runner.quit()
            if self.swarm.web_ui is not None and getattr(self.swarm.web_ui, "server", None) is not None:
                self.swarm.web_ui.stop()
        return self.wait()


def start(args: list[str], *, cwd: Path | str | None = None, env: dict[str, str | None] | None = None,
          timeout: float = 120.0, worker_args: list[str] | None = None, emulator_process: bool = False) -> Running:
    """``run``, in a greenlet beside the caller: ``wait()`` or ``stop()`` gives its Outcome."""
    return Running(args, cwd, env, timeout, worker_args, emulator_process)


def run(args: list[str], *, cwd: Path | str | None = None, env: dict[str, str | None] | None = None,
        timeout: float = 120.0, worker_args: list[str] | None = None, emulator_process: bool = False) -> Outcome:
    """A headless run of ``args`` (``locust``'s own arguments; ``--processes N``: a master and N workers here) in
    this process, as ``locust ARGS`` would run it in ``cwd`` with ``env`` added to its environment.
    ``emulator_process``: with no --host, the embedded emulator and sidecar are child processes, as on the command
    line (a test of timing against the emulator's own schedule: served here, it shares the client's event loop)."""
    return start(args, cwd=cwd, env=env, timeout=timeout, worker_args=worker_args,
                 emulator_process=emulator_process).wait()
