"""What the local runner and a master share: the start-up checks (options, target, embedded emulator, web UI), each
run's plan, collector and watchers, the sweep's steps, and the end of the run (``end_of_run.py``)."""

from __future__ import annotations

import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import gevent
import gevent.event
import gevent.pool

from vllm_load.client.openai_api import tls_context, use_tls_context
from vllm_load.client.pooling import POOLING
from vllm_load.errors import EXIT_BAD_INPUT, UsageError, die
from vllm_load.metrics.prometheus import registry_for
from vllm_load.metrics.slo import parse_slo_option
from vllm_load.plugin import (end_of_run, saturation_watch, startup, ui_guard, validate, warmup_reset, web_form, webui,
                              wire, worker_secrets)
from vllm_load.plugin.collector import Collector
from vllm_load.runtime.embedded import CHILDREN, Children, Served, emulator_args, emulator_mode, private_temp_file
from vllm_load.plugin.plan import ramp_kind
from vllm_load.plugin.process import Process
from vllm_load.plugin.run import Run
from vllm_load.plugin.server_control import Profiler, profile_point
from vllm_load.plugin.server_side import LiveServer
from vllm_load.runtime.server_wait import parse_duration, wait_for_server
from vllm_load.plugin.shapes import UsersRamp
from vllm_load.plugin.target import Target, resolve_targets
from vllm_load.rundir.files import check_writable, free_text

log = logging.getLogger("vllm_load")


class Controller(Process):
    """The process that decides and judges a run (a local runner or a master): what it started lives as long."""

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        self.target: Target | None = None
        self.target_error: str | None = None  # the web UI's target failed its check: shown there until fixed
        self.slos: list = []
        self.children: Children = getattr(environment, CHILDREN, None) or Children()  # how the emulator is started
        self.emulator: Served | None = None
        self.emulator_log: Path | None = None  # the embedded emulator's log (copied into each run directory)
        self.sidecar: Served | None = None
        self.sidecar_url = ""  # --sidecar-url, or the embedded emulator's sidecar
        self.span_receiver: Any = None  # --otlp-receiver (span_receiver.SpanReceiver)
        self.cache_reset: Any = None  # --reset-prefix-cache (server_control.CacheReset)
        self.report: str | None = None  # the last run's report.html
        self.final_summary: dict | None = None  # the stopped run's judged summary: the web UI's until the next start
        self.last_step: tuple[int, float] | None = None  # the sweep step the shape announced last
        self.steps_done: dict[int, int] = {}  # sweep step -> load processes that finished their share of it
        self.ending: gevent.event.Event | None = None  # set while the end of the run is written, then set
        self.end_signals = 0  # quitting events that came while it was written
        self.end_block = ""  # the end-of-run block, printed when Locust quits (after its own last tables)
        events = environment.events
        self.listen(events.test_stopping, lambda **_kw: self.drain())
        self.listen(events.test_stop, lambda **_kw: end_of_run.stopped(self))
        self.listen(events.quit, self._on_quit)

    # -- start-up ---------------------------------------------------------------------------------------
    def start_up(self) -> None:
        env, opts = self.environment, self.opts
        if opts is None:
            return
        try:
            self._check_options(opts)
            self._start_children(opts)
            self._check_profile_source(opts)
            wait = parse_duration(opts.wait_for_server, "--wait-for-server")
            if ramp_kind(opts) == "users":  # the closed loop's users ramp: a shape of the plugin's
                shape = UsersRamp(opts.ramp_up_strategy, int(opts.ramp_up_start_users),
                                  int(opts.ramp_up_end_users), float(opts.run_time))
                shape.runner = env.runner
                env.shape_class = shape
        except UsageError as exc:
            self.stop_children()
            die(str(exc))
        if env.web_ui is not None:  # before anything can fail: the UI stays up to show the error
            ui_guard.SecretGuard(env).install(env.web_ui)
            web_form.install(env)  # the start form as the command line groups it
            warning = ui_guard.bind_warning(opts.web_host, bool(opts.web_login))
            if warning:
                print(warning, flush=True)
        self._first_target(opts, wait)
        self._serve(opts)
        if env.web_ui is not None:
            gevent.spawn(startup.announce_web_ui, env.web_ui, opts)
        # The blocking start-up above (tokenizer, embedded emulator: seconds) left libev's cached clock
        # behind; Locust arms its --run-time timer next, relative to that stale "now", and a 3 s run
        # ended 0.1 s after it began. Refresh the clock so the run lasts what was asked.
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
        self.slos = parse_slo_option(opts.slo, opts.window)
        self.sidecar_url = opts.sidecar_url

    def _check_form(self, shim: Any) -> None:
        """The web UI's start form, as the command line is checked (``web_gate.screen_swarm`` applies it to a copy)."""
        validate.check_options(shim)
        self._check_profile_source(shim.parsed_options)

    def _check_profile_source(self, opts: Any) -> None:
        """--profile-at N reads the server's running requests from its series: a sidecar (the embedded emulator's
        too) or a Prometheus; without one nothing would start the profiler."""
        at = profile_point(opts)
        if at is not None and at.kind == "running" and not self.sidecar_url and not opts.prometheus_url:
            raise UsageError(f"--profile-at {opts.profile_at} starts on the server's running requests, read from its "
                             "series: give --sidecar-url (or --prometheus-url), or --profile-at run")

    def _guard_role(self, opts: Any) -> None:
        """What this role guards at start-up besides the common checks (a master: its port, the workers' secrets)."""

    def _start_children(self, opts: Any) -> None:
        """--otlp-receiver, then (no --host) the embedded emulator and its sidecar."""
        env = self.environment
        if opts.otlp_receiver:  # before the embedded emulator: it exports its spans there
            from vllm_load.plugin.span_receiver import SpanReceiver

            self.span_receiver = SpanReceiver(opts.otlp_receiver)
            print(self.span_receiver.banner(), flush=True)
        if env.host:
            return
        self.emulator_log = private_temp_file("emulator", ".log")
        spans = self.span_receiver.endpoint if self.span_receiver is not None else None
        self.emulator = self.children.emulator(emulator_args(opts, spans), self.emulator_log)
        env.host = self.emulator.url
        print(f"vllm-load: no --host given: started the built-in vLLM EMULATOR at {self.emulator.url}, "
              f"{emulator_mode(opts)} (results describe the emulator, not a real vLLM)", flush=True)
        if not opts.sidecar_url:
            self.sidecar = self.children.sidecar(self.emulator.url, private_temp_file("sidecar", ".jsonl"))
            self.sidecar_url = self.sidecar.url

    def stop_children(self) -> None:
        for child in (self.sidecar, self.emulator):
            if child:
                child.stop()

    def _first_target(self, opts: Any, wait: float) -> None:
        """The target, checked before any load (a headless run stops on a bad one; a web UI shows it)."""
        env = self.environment
        try:
            if wait > 0 and self.emulator is None:
                for one in validate.split_hosts(env.host):
                    wait_for_server(one, wait, opts.api_key, say=lambda line: print(line, flush=True))
            target = self.check_target()
            apis = self.apis()
            lengths = (f"input {target.input_spec.text} tokens per text" if apis and apis <= POOLING
                       else f"input {target.input_spec.text} output {target.output_spec.text} tokens")
            print(f"vllm-load: target {target.host} ({target.kind}) model {target.model} tokenizer {target.tokenizer} "
                  f"(from {target.tokenizer_source}) max_model_len {target.max_model_len} {lengths}", flush=True)
            if target.server_kind == "openai":
                print(startup.openai_mode_line(target, opts), flush=True)
        except UsageError as exc:
            if env.web_ui is None or opts.headless:
                self.stop_children()
                die(str(exc))
            # the web UI stays up with the error shown: the user fixes the host or the options there
            self.target_error = str(exc)
            log.error("vllm-load: %s (fix it in the web UI and start again)", exc)

    def check_target(self) -> Target:
        env = self.environment
        validate.check_options(env)  # the web UI may have changed them since start-up
        is_emulator = self.emulator is not None and env.host == self.emulator.url
        # check what this locustfile's users will send (a chat run against the chat template's minimum)
        self.target = resolve_targets(self.opts, validate.split_hosts(env.host), is_emulator,
                                      self.apis() or frozenset({"chat", "completions"}))
        return self.target  # what it resolved (model, tokenizer) goes into the run plan

    def _serve(self, opts: Any) -> None:
        """The web UI's LLM tab and --metrics-port, fed from this object."""
        registry = registry_for(lambda: self.run.collector.totals if self.run and self.run.collector else None)
        webui.LLMTab(self.environment, self._live_summary, self.slos, lambda: self.report, self._status,
                     metrics_registry=lambda: registry, live_source=self._live_series,
                     target_source=lambda: self.target, swarm_check=self._swarm_check).install()
        if opts.metrics_port:
            try:
                startup.serve_metrics(registry, opts.metrics_host, int(opts.metrics_port))
            except UsageError as exc:
                self.stop_children()
                die(str(exc))

    # -- what the web UI reads ----------------------------------------------------------------------------
    def _status(self) -> str | None:
        run = self.run
        outage = run.outage_now if run is not None else None
        return (run.fatal if run is not None else None) or self.target_error or (outage and f"OUTAGE: {outage}")

    def _swarm_check(self, host: str) -> str | None:
        if self.target is not None and self.target.host == host and not self.target_error:
            return None
        return startup.reachable(host)

    def _live_series(self) -> dict:
        from vllm_load.plugin.live_charts import live_series

        col = self.run.collector if self.run is not None else None
        if col is None:
            return live_series(None, 0.0, None)
        live = self.run.live_server
        return live_series(col.totals, col.start_wall, live.samples if live is not None else None)

    def _live_summary(self) -> dict | None:
        if self.final_summary is not None:  # the run stopped: its judged summary
            return self.final_summary
        col = self.run.collector if self.run is not None else None
        if col is None:
            return None
        summary = webui.live_summary(col.totals, col.measured_from, col.health)
        live = self.run.live_server
        summary["server"] = live.summary() if live is not None else None
        return summary

    # -- a run ------------------------------------------------------------------------------------------
    def start_run(self) -> None:
        env, opts = self.environment, self.opts
        if self.target is None or self.target.host != env.host:
            try:  # the web UI may have changed the host since start-up
                self.check_target()
                self.target_error = None
            except UsageError as exc:
                # keep the process (and its web UI) up: show the error, stop this start, let the user fix the host
                self.target_error = str(exc)
                log.error("vllm-load: %s (fix it in the web UI and start again)", exc)
                self._close_run()
                self.run = None
                gevent.spawn(env.runner.stop)
                return
        self._close_run()
        self.final_summary = None  # live numbers again
        if self.span_receiver is not None:  # this run's spans only
            self.span_receiver.clear()
        self._reset_cache(opts)
        assert self.target is not None
        master = self._master_runner()
        plan = wire.decide_plan(env, self.target, self.slos, self.sidecar_url, master)
        col = Collector.create(opts, plan, master)
        col.swarm = master is not None
        self.run = run = Run(plan, collector=col)
        at = profile_point(opts)  # read at each run's start: the web UI's form may have changed it
        if at is not None:  # a profiler per run (its windows go into this run's summary)
            col.profiler = Profiler(validate.split_hosts(env.host), opts.api_key, lambda line: print(line, flush=True),
                                    at)
        self._start_load(run)
        run.warmup = warmup_reset.reset_after(env, self._window(run), plan.warmup, say=True)
        self._watch(run)
        self.configure_users()
        if self.last_step is not None and env.shape_class is not None:
            self.begin_step(*self.last_step)
        col.write_config(self.target)
        print(f"vllm-load: run {plan.run_id} writes to {plan.files.path} "
              f"({free_text(shutil.disk_usage(plan.files.path).free)})", flush=True)

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
            from vllm_load.plugin.server_control import CacheReset

            self.cache_reset = CacheReset(validate.split_hosts(self.environment.host), opts.api_key,
                                          lambda line: print(line, flush=True))
        if not getattr(opts, "sweep", ""):
            self.cache_reset("the run")

    def _watch(self, run: Run) -> None:
        """The run's watchers (outages, silent workers, saturation), DCGM, and the server's live samples."""
        env, opts, col, plan = self.environment, self.opts, run.collector, run.plan
        assert col is not None
        run.watchers = gevent.pool.Group()
        run.watchers.spawn(end_of_run.watch_outages, env, run)
        self._watch_role(run)
        if col.profiler is not None and col.profiler.at.kind == "run":
            run.watchers.spawn(self._profile_window, col.profiler, self._window(run), plan.warmup)
        run.watchers.spawn(saturation_watch.watch, env, run, bool(opts.stop_over_saturated),
                           self._master_runner() is not None)
        dcgm_url = opts.dcgm_url or (plan.host.rstrip("/") + "/dcgm/metrics" if plan.is_emulator and opts.emulator_dcgm
                                     else "")
        if dcgm_url:
            from vllm_load.plugin.dcgm_source import DcgmPoller

            col.dcgm = DcgmPoller(dcgm_url)
        elif opts.dcgm_selector:  # the same fields from a Prometheus that scrapes the exporter, at the run's end
            from vllm_load.plugin.dcgm_source import PrometheusDcgm

            col.dcgm = PrometheusDcgm(opts.prometheus_url, opts.dcgm_selector, opts.prometheus_token, col.start_wall)
        if opts.prometheus_url:  # the web UI's server side, the saturation watch's queue
            run.live_server = LiveServer.prometheus(opts.prometheus_url, opts.prometheus_selector, col.start_wall,
                                                    opts.prometheus_token, interval=2.0)
        elif plan.sidecar_url:
            run.live_server = LiveServer.sidecar(plan.sidecar_url, col.start_wall, opts.sidecar_token, interval=2.0)
        if col.profiler is not None and col.profiler.at.kind == "running" and run.live_server is not None:
            run.watchers.spawn(_profile_when_running, col.profiler, run.live_server, int(col.profiler.at.value),
                               float(opts.profile_seconds))

    @staticmethod
    def _profile_window(profiler: Profiler, start_wall: Any, warmup: float) -> None:
        """--profile-at run: the profiler starts when the measured window opens (after --warmup)."""
        while (wait := start_wall() + warmup - time.time()) > 0:
            gevent.sleep(min(wait, 0.5))
        profiler.start("the measured window")

    def _watch_role(self, run: Run) -> None:
        """A watcher of this role's own (a master's: the workers Locust marks missing)."""

    # -- what happens during a run ----------------------------------------------------------------------
    def fatal(self, message: str, code: int = EXIT_BAD_INPUT) -> None:
        """A failure every request would repeat (prompts that cannot be built: exit code 2), or a run directory
        that cannot be written (6): the whole run stops with one line instead of going on until -t runs out; the
        end of the run still prints its verdict."""
        run = self.run
        if run is None or run.fatal is not None:
            return
        run.fatal, run.fatal_code = message, code
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
            self.steps_done[step] = self.steps_done.get(step, 0) + 1
            if self.steps_done[step] == run.plan.processes:
                print(f"vllm-load: sweep step {step}: {run.plan.num_requests} requests completed (--num-requests)",
                      flush=True)
            return
        run.shares_done += 1
        if run.shares_done < run.plan.processes:
            return
        if run.plan.num_requests:
            print(f"vllm-load: {run.plan.num_requests} requests completed (--num-requests): stopping the run",
                  flush=True)
        else:
            print("vllm-load: the trace was replayed: stopping the run", flush=True)
        wire.end_run(self.environment)

    def begin_step(self, step: int, level: float) -> None:
        """The sweep shape's tick (before the run's first, too: kept and applied when the run starts)."""
        self.last_step = (step, level)
        col = self.run.collector if self.run is not None else None
        # a step's measured window starts after its warm-up (its requests before that are not in its stats)
        if col is None or col.sweep is None or not col.sweep.begin(step, level, time.time(), col.plan.warmup):
            return
        rate = float(level) if col.sweep.kind == "rate" else 0.0
        if self.generator is not None:
            self.generator.set_step(step, rate)
        unit = "req/s" if col.sweep.kind == "rate" else "users"
        repeats = int(getattr(self.opts, "repeat", 1) or 1)
        said = f"repeat {step + 1} of {repeats} ({step})" if repeats > 1 else f"sweep step {step}"
        print(f"vllm-load: {said}: {level:g} {unit}", flush=True)
        profiler = col.profiler
        if profiler is not None:  # the profiled step's trace ends where it does, before the next one's reset
            profiler.stop()
        if self.cache_reset is not None:  # before the step's first request (its workers are told next)
            self.cache_reset(f"sweep step {step}")
        if profiler is not None and not profiler.windows and profiler.at.kind == "step" and level == profiler.at.value:
            profiler.start(f"sweep step {step} ({level:g} {unit})")
        self._announce_step(step, rate)

    def _announce_step(self, step: int, rate: float) -> None:
        """A master tells its workers the new sweep step."""

    def new_sweep(self) -> None:
        """The sweep shape starts over (a run starts): no step finished yet."""
        self.steps_done = {}

    def drain(self) -> None:
        """End the run without losing a request: no new request starts, in-flight streams finish (at most
        --drain-timeout) and are reported. Idempotent: a stop that comes during the drain (the -t limit reached
        while --stop-over-saturated's stop drains a queued server) waits for it, so Locust stops no user before
        its request has finished; 4 requests of a saturated run were once cancelled and failed that way."""
        col = self.run.collector if self.run is not None else None
        if col is None:
            return
        if col.drained:
            col.drain_over.wait()
            return
        col.drained = True
        try:
            self._drain(float(self.opts.drain_timeout) if self.opts else 30.0)
        finally:
            col.drain_over.set()

    def _drain(self, timeout: float) -> None:
        raise NotImplementedError

    # -- the end --------------------------------------------------------------------------------------------
    def _on_quitting(self, **_kw: Any) -> None:
        end_of_run.quitting(self)

    def _on_quit(self, **_kw: Any) -> None:
        """The end-of-run block goes out after Locust's final tables (printed after the quitting event, then the quit
        event fires): one readable block at the very end of a headless run's output, not between Locust's tables."""
        if self.end_block:
            sys.stderr.flush()  # Locust's tables (stderr) first
            sys.stdout.write(self.end_block)
            sys.stdout.flush()
            self.end_block = ""

    def close(self) -> None:
        super().close()
        self.stop_children()


def _profile_when_running(profiler: Profiler, live: LiveServer, running: int, seconds: float) -> None:
    """--profile-at N: the profiler starts once the server's series says it runs N requests (the sidecar's samples,
    seconds behind), for --profile-seconds; the run's end stops it sooner."""
    while not (live.samples and live.samples[-1].get("running", 0) >= running):
        gevent.sleep(0.5)
    profiler.start(f"the server at {running}+ running requests")
    gevent.sleep(seconds)
    profiler.stop()


def install_repeat(environment: Any) -> None:
    """--repeat N: the run's load N times back to back, as a sweep of one level repeated N times (its steps, their
    spread and the report's repeats table are the sweep's: --sweep LEVELxN, on any locustfile)."""
    opts = environment.parsed_options
    n = int(getattr(opts, "repeat", 1))
    if n <= 1:  # below 1: validate's bounds refuse it, in one line
        return
    if getattr(opts, "sweep", "") or environment.shape_class is not None:
        raise UsageError("--repeat repeats a plain run; a sweep repeats a level with --sweep LEVELxN, and a "
                         "locustfile's own load shape ends when it says: drop --repeat")
    if ramp_kind(opts) or opts.trace:
        raise UsageError("--repeat repeats a steady load: drop --ramp-up-strategy or --trace (a trace replays once)")
    seconds = float(opts.run_time or 0)
    if not seconds and not getattr(opts, "num_requests", 0):
        raise UsageError(f"--repeat {n} needs each repeat's length: -t DURATION (or --num-requests N)")
    from vllm_load.plugin.shapes import SweepShape

    rate = float(opts.request_rate or 0)
    opts.sweep = f"{rate:g}x{n}" if rate > 0 else f"{int(opts.num_users)}x{n}"
    opts.sweep_mode, opts.sweep_users = ("rate" if rate > 0 else "users"), max(1, int(opts.num_users))
    opts.step_duration = seconds
    opts.run_time = None  # the shape ends the run after its last repeat (Locust's -t would cut it at the first)
    shape = SweepShape()
    shape.runner = environment.runner
    environment.shape_class = shape
