"""What the local runner and a master share: the start-up checks (options, target, web UI), each run's plan,
collector and watchers, the sweep's steps, and the end of the run. Its parts are objects of their own, each built
from its inputs: ``Servers`` (the receiver, the embedded emulator and sidecar), ``LiveView`` (what the web UI reads),
``SweepSteps``, the watchers (``watchers.start``), the end (``end_of_run.Ending``)."""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path
from typing import Any

import gevent

from vllm_load.client.apis.openai_api import tls_context, use_tls_context
from vllm_load.errors import EXIT_BAD_INPUT, UsageError, die
from vllm_load.metrics.judge.recipes import judged_slos
from vllm_load.plugin.lifecycle import end_of_run, interrupt, run_timer
from vllm_load.plugin.prepare import startup, validate
from vllm_load.plugin.load import warmup_reset
from vllm_load.plugin.watch import watchers
from vllm_load.plugin.swarm import wire, worker_secrets
from vllm_load.plugin.lifecycle.collector import Collector
from vllm_load.plugin.webui.live_view import LiveView
from vllm_load.plugin.prepare.plan import ramp_kind
from vllm_load.plugin.lifecycle.process import Process
from vllm_load.plugin.lifecycle.run import Run
from vllm_load.plugin.sources.server_control import CacheReset, Profiler, check_profile_source, profile_point
from vllm_load.plugin.prepare.servers import Servers
from vllm_load.plugin.lifecycle.shapes import UsersRamp, load_started
from vllm_load.plugin.lifecycle.steps import SweepSteps, install_repeat
from vllm_load.plugin.prepare.target import Target
from vllm_load.plugin.prepare.target_check import TargetCheck
from vllm_load.rundir.files import check_writable, free_text
from vllm_load.runtime.embedded import CHILDREN, Children
from vllm_load.workload.lengths import parse_duration

log = logging.getLogger("vllm_load")


def _say(line: str) -> None:
    print(line, flush=True)


class Controller(Process):
    """The process that decides and judges a run (a local runner or a master): what it started lives as long."""

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        self.servers = Servers(getattr(environment, CHILDREN, None) or Children())
        self.targets = TargetCheck(environment, self.servers, self.apis)
        self.slos: list = []
        self.cache_reset: CacheReset | None = None  # --reset-prefix-cache
        self.steps = SweepSteps()
        self.live = LiveView(self)
        self.end = end_of_run.Ending()
        events = environment.events
        self.listen(events.test_stopping, lambda **_kw: self.drain())
        self.listen(events.test_stop, lambda **_kw: end_of_run.stopped(self))
        self.listen(events.quit, lambda **_kw: self.end.print_block())
        interrupt.hurry, interrupt.ending = self.hurry, self.end  # this process's: one controller per process

    # -- start-up ---------------------------------------------------------------------------------------
    def start_up(self) -> None:
        env, opts = self.environment, self.opts
        if opts is None:
            return
        try:
            self._check_options(opts)
            emulator = self.servers.start(opts, env.host)
            if emulator is not None:
                env.host = emulator
            self._check_profile_source(opts)
            wait = parse_duration(opts.wait_for_server, "--wait-for-server")
            if ramp_kind(opts) == "users":  # the closed loop's users ramp: a shape of the plugin's
                shape = UsersRamp(opts.ramp_up_strategy, int(opts.ramp_up_start_users),
                                  int(opts.ramp_up_end_users), float(opts.run_time))
                shape.runner = env.runner
                env.shape_class = shape
        except UsageError as exc:
            self.servers.stop()
            die(str(exc))
        startup.guard_web_ui(env, opts)  # before anything can fail: the UI stays up to show the error
        self.targets.first(opts, wait)
        try:
            self.live.install(opts)  # the web UI's LLM tab, --metrics-port
        except UsageError as exc:
            self.servers.stop()
            die(str(exc))
        if env.web_ui is not None:
            gevent.spawn(startup.announce_web_ui, env.web_ui, opts)
        run_timer.take_over(opts, env)  # a headless run's -t counts from its load's start (plugin/lifecycle/run_timer.py)
        # the blocking start-up above left libev's cached clock behind: a timer armed now (the web UI's) is fresh
        gevent.get_hub().loop.update_now()

    def _check_options(self, opts: Any) -> None:
        env = self.environment
        worker_secrets.read_key_file(opts)
        if env.web_ui is not None:  # first: every other hook of the UI comes after the gate
            startup.install_gate(env, opts, self._check_form)
        self._guard_role(opts)
        install_repeat(env)  # before the checks: the repeats' shape reads the sweep's options
        validate.check_options(env)  # before anything starts: one line, exit 2
        # the run directory can hold the run's files (its default is decided per run, under reports/)
        check_writable(Path(opts.run_dir) if opts.run_dir else Path("reports"), "--run-dir" if opts.run_dir
                       else "the run directory's folder")
        use_tls_context(tls_context(opts.insecure, opts.ca_bundle))
        # parsed here: workers get the texts in the run plan, not file paths their machines may not have
        self.slos = judged_slos(opts.recipe, opts.slo, opts.window)

    def _check_form(self, shim: Any) -> None:
        """The web UI's start form, as the command line is checked (``web_gate.screen_swarm`` applies it to a copy)."""
        validate.check_options(shim)
        self._check_profile_source(shim.parsed_options)

    @property
    def target(self) -> Target | None:
        """The target as last checked (its model and tokenizer go into the run plan)."""
        return self.targets.target

    @property
    def target_error(self) -> str | None:
        """Why the target failed its check (the web UI shows it until the host is fixed)."""
        return self.targets.error

    def _check_profile_source(self, opts: Any) -> None:
        check_profile_source(opts, self.servers.sidecar_url)

    def _guard_role(self, opts: Any) -> None:
        """What this role guards at start-up besides the common checks (a master: its port, the workers' secrets)."""

    # -- a run ------------------------------------------------------------------------------------------
    def start_run(self) -> None:
        env, opts = self.environment, self.opts
        if not self.targets.again():  # the web UI's host failed its check: it shows why, the user fixes it
            self._close_run()
            self.run = None
            gevent.spawn(env.runner.stop)
            return
        self._close_run()
        self.end.started()
        if self.servers.span_receiver is not None:  # this run's spans only
            self.servers.span_receiver.clear()
        self._reset_cache(opts)
        assert self.target is not None
        master = self._master_runner()
        plan = wire.decide_plan(env, self.target, self.slos, self.servers.sidecar_url, master)
        col = Collector.create(opts, plan, master, self.target)
        col.swarm = master is not None
        col.user_errors = lambda: [(e["count"], e["msg"], e["traceback"]) for e in env.runner.exceptions.values()]
        self.run = run = Run(plan, collector=col)
        at = profile_point(opts)  # read at each run's start: the web UI's form may have changed it
        if at is not None:  # a profiler per run (its windows go into this run's summary)
            col.profiler = Profiler(validate.split_hosts(env.host), opts.api_key, _say, at)
        self._start_load(run)
        run.warmup = warmup_reset.reset_after(env, self._window(run), plan.warmup, say=True)
        watchers.start(env, run, self._window(run), master)
        self.configure_users()
        load_started(env.shape_class)  # a shape of ours counts its time from now, the load's start
        if self.steps.last is not None and env.shape_class is not None:
            self.begin_step(*self.steps.last)
        col.write_config()
        moved = f"; {opts.run_dir} holds an earlier run" if opts.run_dir and plan.run_dir != opts.run_dir else ""
        print(f"vllm-load: run {plan.run_id} writes to {plan.files.path} "
              f"({free_text(shutil.disk_usage(plan.files.path).free)}{moved})", flush=True)

    def _master_runner(self) -> Any:
        """The MasterRunner whose workers this process waits for (None: it generates the load itself)."""
        return None

    def _start_load(self, run: Run) -> None:
        """What generates the run's load here (a local runner's generator; a master's workers get the plan)."""

    def _window(self, run: Run) -> Any:
        """When the LLM metrics' window opens (read again at the warm-up's end: a swarm's epoch may move it)."""
        col = run.collector
        return lambda: col.start_wall

    def _reset_cache(self, opts: Any) -> None:
        """--reset-prefix-cache, before the run's first request (a sweep resets before each step, its first too)."""
        if not opts.reset_prefix_cache or self.target is None:
            return
        if self.cache_reset is None:
            self.cache_reset = CacheReset(validate.split_hosts(self.environment.host), opts.api_key, _say)
        if not getattr(opts, "sweep", ""):
            self.cache_reset("the run")

    # -- what happens during a run ----------------------------------------------------------------------
    def fatal(self, message: str, code: int = EXIT_BAD_INPUT) -> None:
        """A failure every request would repeat (prompts that cannot be built: exit code 2), or a run directory
        that cannot be written (6): the whole run stops with one line instead of going on until -t runs out; the
        end of the run still prints its verdict."""
        run = self.run
        if run is None or run.fatal is not None:
            return
        run.stop_with(message, code)
        sys.stderr.write(f"vllm-load: error: {message}\n")
        sys.stderr.flush()
        wire.end_run(self.environment)  # a web UI shows the error; the user fixes the options

    def share_done(self, step: int | None = None) -> None:
        """A load process finished its share of the run (its trace rows, or its --num-requests share): the run
        ends once every one has. In a sweep (``step``) the share is the step's: the shape moves on then."""
        run = self.run
        if run is None:
            return
        if step is not None:
            self.steps.finish(step, run.plan.processes, run.plan.num_requests)
            return
        run.shares_done += 1
        if run.shares_done < run.plan.processes:
            return
        print(f"vllm-load: {run.plan.share_end}: stopping the run", flush=True)
        wire.end_run(self.environment)

    def begin_step(self, step: int, level: float) -> None:
        """The sweep shape's tick (``SweepSteps.begin``)."""
        self.steps.begin(step, level, self.run, self.opts, self.cache_reset, self._announce_step)

    def _announce_step(self, step: int, rate: float, floor_s: float = 0.0) -> None:
        """A master tells its workers the new sweep step."""

    def new_sweep(self) -> None:
        self.steps.new_sweep()

    def _reset_own(self) -> None:
        super()._reset_own()
        self.live.forget()  # the web UI's next poll shows the numbers as they start over

    def hurry(self) -> None:
        """A second Ctrl-C: the end stops waiting for requests in flight (``plugin/lifecycle/interrupt.py``)."""
        self.end.cut.set()

    def drain(self) -> None:
        """End the run without losing a request: no new request starts, in-flight streams finish (at most
        --drain-timeout) and are reported; once (``Collector.drain_once``)."""
        col = self.run.collector if self.run is not None else None
        if col is not None:
            col.drain_once(lambda: self._drain(parse_duration(getattr(self.opts, "drain_timeout", 30), "--drain-timeout")))

    def _drain(self, timeout: float) -> None:
        raise NotImplementedError

    # -- the end --------------------------------------------------------------------------------------------
    def _on_quitting(self, **_kw: Any) -> None:
        end_of_run.quitting(self)

    def close(self) -> None:
        super().close()
        self.servers.stop()
