"""Locust's own objects for a run in the test's process, built as ``locust`` builds them: the locustfile loaded (its
hooks kept apart from Locust's global events), Locust's parser with the plugin's options, an ``Environment`` with
events of its own, its runner (a local runner, or a master and its workers joined over Locust's ZMQ on 127.0.0.1,
as Locust's own ``test_runners.py`` runs them), the init event (the plugin's role objects), the headless start, and
Locust's shutdown (the quitting event, the exit code decision, the quit event)."""

from __future__ import annotations

import importlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gevent
from locust import events as global_events
from locust import log as locust_log
from locust import stats as locust_stats
from locust.argument_parser import get_parser
from locust.env import Environment
from locust.event import EventHook, Events
from locust.main import merge_locustfiles_content

from vllm_load.plugin.lifecycle import listeners
from vllm_load.plugin.lifecycle.process import process_of
from vllm_load.runtime.embedded import CHILDREN, Children, Served, server_package


class InProcessChildren(Children):
    """The embedded emulator and sidecar, served on this process's event loop (no child process, no port wait)."""

    def emulator(self, args: list[str], log: Path | None) -> Served:
        cli = importlib.import_module(f"{server_package()}.emulator.cli")
        return cli.build(["--host", "127.0.0.1", "--port", "0", "--log-stats-interval", "0", *args]).start()

    def sidecar(self, vllm_url: str, out: Path) -> Served:
        app = importlib.import_module(f"{server_package()}.sidecar.app")
        return app.Sidecar.bind("127.0.0.1", 0, vllm_url, 1.0, out).start()



def locustfile_of(args: list[str]) -> str:
    for i, a in enumerate(args):
        if a in ("-f", "--locustfile") and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--locustfile="):
            return a.split("=", 1)[1]
    raise ValueError("vllm_load.testing.run needs the locustfile: -f PATH")



def _hooks(events: Any) -> dict[str, list]:
    return {name: list(hook._handlers) for name, hook in vars(events).items() if isinstance(hook, EventHook)}



@dataclass
class Loaded:
    """A locustfile, loaded as Locust loads it, and the listeners it put on Locust's global events (taken off them
    again: each environment here gets them on its own events, and a later run in this process does not)."""

    path: str
    user_classes: dict
    shape_class: Any
    hooks: dict[str, list]

    @classmethod
    def load(cls, path: str) -> Loaded:
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



class Swarm:
    """One Locust process's worth of vllm-load (or a master and its workers), built in this process."""

    def __init__(self, loaded: Loaded, args: list[str], workers: int = 0, worker_args: list[str] | None = None,
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


