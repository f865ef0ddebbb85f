"""Locust wiring: options, target checks, per-process runtime, worker->master shipping, results.

Importing this module (the users module does) registers the listeners on ``locust.events``,
in the same way Locust's own plugins do.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path

import gevent
import time
from typing import Any

from locust import events
from locust.runners import MasterRunner, WorkerRunner

from vllm_load.plugin import log_repeats
from vllm_load.plugin import options
from vllm_load.plugin import webui
from vllm_load.report.console import render_table
from vllm_load.plugin.embedded import ChildServer, start_emulator, start_sidecar
from vllm_load.metrics.outages import describe
from vllm_load.plugin.server_side import LiveServer, fetch_series
from vllm_load.plugin.server_wait import parse_duration, wait_for_server
from vllm_load.errors import EXIT_BAD_INPUT, EXIT_ERRORS, EXIT_OK, UsageError, die
from vllm_load.report.results import render_validity
from vllm_load.metrics.slo import render_checks
from vllm_load.plugin.runtime import Runtime, Target, resolve_target
from vllm_load.metrics.slo import parse_slo_option
from vllm_load.metrics.stats import LLMStats

log = logging.getLogger("vllm_load")


class _State:
    """Process-wide plugin state (one Locust environment per process)."""

    target: Target | None = None
    slos: list = []
    report: str | None = None  # path of the last run's report.html
    flushed: set = set()  # workers that sent their final report
    step_verdicts: dict = {}  # sweep step -> met every SLO
    last_step: tuple | None = None  # the sweep step the shape announced last
    emulator: ChildServer | None = None
    sidecar: ChildServer | None = None
    runtime: Runtime | None = None
    fatal: str | None = None  # a failure every request would repeat: the run was stopped with it
    target_error: str | None = None  # the web UI's target failed its check: shown there until fixed
    outage_now: str | None = None  # an outage going on right now, as the console said it
    outage_stop: str | None = None  # --stop-on-outage ended the run with this reason
    watcher: Any = None  # greenlet watching for outages (master / local)
    live_server: LiveServer | None = None  # the sidecar's samples while the web UI shows a run
    environment: Any = None  # this process's Locust environment (some events do not pass it)


STATE = _State()


def _role(environment: Any) -> str:
    if isinstance(environment.runner, WorkerRunner):
        return "worker"
    if isinstance(environment.runner, MasterRunner):
        return "master"
    return "local"


@events.init_command_line_parser.add_listener
def _add_options(parser: Any, **_kw: Any) -> None:
    options.add_arguments(parser)


def _emulator_args(opts: Any) -> list[str]:
    args = ["--ttft", str(opts.emulator_ttft), "--itl", str(opts.emulator_itl),
            "--tokens-per-chunk", str(opts.emulator_tokens_per_chunk)]
    return args + (["--profile", opts.emulator_profile] if opts.emulator_profile else [])


def _apis(environment: Any) -> frozenset[str]:
    """The APIs the run's user classes send ("chat", "completions")."""
    return frozenset(a for a in (getattr(c, "api", None) for c in environment.user_classes) if a)


def _check_target(environment: Any) -> Target:
    opts = environment.parsed_options
    is_emulator = STATE.emulator is not None and environment.host == STATE.emulator.url
    # check what this locustfile's users will send (a chat run against the chat template's minimum)
    target = resolve_target(opts, environment.host, is_emulator, _apis(environment) or frozenset({"chat", "completions"}))
    # resolved values travel to the workers with the spawn message
    opts.model = target.model
    opts.tokenizer = target.tokenizer
    STATE.target = target
    return target


FLUSH, FLUSHED, STEP, FATAL, RESET = ("vllm_load_flush", "vllm_load_flushed", "vllm_load_step", "vllm_load_fatal",
                                      "vllm_load_reset")


def _reset(environment: Any) -> None:
    """Reset the LLM metrics with Locust's table: here, and (from a master) in every worker, whose pending
    deltas go at the same instant as Locust's own pending worker stats, so both tables keep agreeing."""
    rt = STATE.runtime
    if rt is not None:
        rt.reset_metrics()
    if isinstance(environment.runner, MasterRunner):
        for client in environment.runner.clients.all:
            environment.runner.send_message(RESET, None, client_id=client.id)


def _worker_reset(environment: Any) -> None:
    environment.runner.stats.reset_all()  # Locust's pending worker stats, in the same greenlet step as ours
    if STATE.runtime is not None:
        STATE.runtime.reset_metrics()


@events.reset_stats.add_listener
def _on_reset_stats(**_kw: Any) -> None:
    """The web UI's Reset button (fired on the master or the local runner)."""
    if STATE.environment is not None:
        _reset(STATE.environment)


@events.spawning_complete.add_listener
def _on_spawning_complete(user_count: int = 0, **_kw: Any) -> None:
    """--reset-stats: Locust resets every runner's table when its spawning completes; ours go with it."""
    env = STATE.environment
    if env is not None and env.reset_stats and STATE.runtime is not None:
        STATE.runtime.reset_metrics()


def fatal(environment: Any, message: str) -> None:
    """A failure every request would repeat (prompts that cannot be built): stop the whole run with one
    line and exit code 2, instead of failing every request until -t runs out. Workers tell the master."""
    if isinstance(environment.runner, WorkerRunner):
        environment.runner.send_message(FATAL, message)
        return
    if STATE.fatal is not None:
        return
    STATE.fatal = message
    sys.stderr.write(f"vllm-load: error: {message}\n")
    sys.stderr.flush()
    if environment.web_ui is not None:  # the UI stays up and shows the error; the user fixes the options
        gevent.spawn(environment.runner.stop)
    else:
        gevent.spawn(environment.runner.quit)


def begin_step(environment: Any, step: int, level: float) -> None:
    """Called by the sweep shape on the master (or local runner) at every tick; acts on a new step."""
    # the shape's first tick comes before test_start creates the run's runtime: test_start re-applies it
    STATE.last_step = (environment, step, level)
    rt = STATE.runtime
    if rt is None or rt.step == step:
        return
    now = time.time()
    if rt.step is not None and rt.step in rt.step_bounds:
        rt.step_bounds[rt.step][2] = now
    rt.step_bounds[step] = [level, now, None]
    rt.set_step(step, float(level) if rt.opts.sweep_mode == "rate" else 0.0)
    print(f"vllm-load: sweep step {step}: {level:g} {'req/s' if rt.opts.sweep_mode == 'rate' else 'users'}", flush=True)
    if isinstance(environment.runner, MasterRunner):
        for client in environment.runner.clients.all:
            environment.runner.send_message(STEP, {"step": step, "rate": rt.step_rate}, client_id=client.id)


def _worker_step(msg: Any) -> None:
    rt = STATE.runtime
    if rt is not None:
        rt.set_step(int(msg.data["step"]), float(msg.data["rate"]))


def judge_step(step: int) -> bool:
    """Did a finished sweep step meet every SLO (client metrics)? Remembered once judged."""
    rt = STATE.runtime
    if rt is None:
        return True
    if step in STATE.step_verdicts:
        return STATE.step_verdicts[step]
    from vllm_load.metrics.slo import evaluate

    level, start, end = rt.step_bounds.get(step, [0, 0.0, None])
    stats = rt.step_stats.get(step, LLMStats())
    checks = evaluate(STATE.slos, stats.summary(duration=max((end or time.time()) - start, 1e-9)))
    ok = all(c.passed for c in checks)
    STATE.step_verdicts[step] = ok
    if not ok:
        missed = ", ".join(c.slo for c in checks if not c.passed)
        print(f"vllm-load: sweep step {step} ({level:g}) missed {missed}: stopping the sweep", flush=True)
    return ok


def _write_sweep(rt: Runtime) -> None:
    if not rt.step_bounds:
        return
    from vllm_load.report.html import build, build_sweep
    from vllm_load.rundir.steps import write_step_dirs

    dirs = write_step_dirs(rt.run_dir, rt.step_stats, rt.step_bounds, rt.opts.sweep_mode, rt.end_wall or time.time())
    for d in dirs:
        build(d)
    page = build_sweep(dirs, rt.run_dir)
    best = (rt.run_dir / "sweep.md").read_text().splitlines()[0].strip("*")
    print(f"vllm-load: sweep of {len(dirs)} steps: {best} ({page})", flush=True)


def _worker_flush(environment: Any, msg: Any, **_kw: Any) -> None:
    """Master asked for the end of the run: drain, then ship the final numbers before Locust quits."""
    rt = STATE.runtime
    if rt is not None:
        if not rt.drain(float(environment.parsed_options.drain_timeout)):
            log.warning("vllm-load: %d requests still in flight after the drain timeout", rt.in_flight)
        environment.runner._send_stats()  # Locust's and our final report, before the master quits
    environment.runner.send_message(FLUSHED, None)


def _master_flushed(environment: Any, msg: Any, **_kw: Any) -> None:
    STATE.flushed.add(msg.node_id)


def _live_workers(runner: MasterRunner) -> set[str]:
    """Workers still heartbeating: Locust's heartbeat greenlet marks a silent one missing, then drops it."""
    return {c.id for c in runner.clients.all if c.state != "missing"}


def _drain(environment: Any) -> None:
    """End the run without losing a request: this process (local) or every worker (master) starts no
    new request, lets in-flight streams finish (at most --drain-timeout) and reports them. Idempotent."""
    runner, rt = environment.runner, STATE.runtime
    if rt is None or rt.drained:
        return
    rt.drained = True
    timeout = float(environment.parsed_options.drain_timeout) if environment.parsed_options else 30.0
    if isinstance(runner, MasterRunner):
        # a worker Locust marked missing (no heartbeat) cannot answer: do not wait for it, nor for one
        # Locust marks missing while we wait (a worker killed just before the stop; ~4 s, not the timeout)
        clients = _live_workers(runner)
        STATE.flushed = set()
        for cid in clients:
            runner.send_message(FLUSH, None, client_id=cid)
        with gevent.Timeout(timeout + 10, False):
            while (clients & _live_workers(runner)) - STATE.flushed:
                gevent.sleep(0.05)  # the flushed messages arrive on the runner's own greenlet
        rt.workers_lost = sorted((rt.workers_seen | clients) - STATE.flushed)
        if rt.workers_lost:
            log.warning("vllm-load: no final report from %d worker(s): %s", len(rt.workers_lost), ", ".join(rt.workers_lost))
    elif rt.role == "local":
        if not rt.drain(timeout):
            log.warning("vllm-load: %d requests still in flight after the drain timeout", rt.in_flight)


@events.test_stopping.add_listener
def _on_test_stopping(environment: Any, **_kw: Any) -> None:
    """Locust's quit() (-t) stops without telling workers and waits 0.5 s for their last report, which
    loses the requests finishing then: drain first."""
    _drain(environment)


@events.init.add_listener
def _on_init(environment: Any, **_kw: Any) -> None:
    log_repeats.install()
    STATE.environment = environment
    if _role(environment) == "worker":
        environment.runner.register_message(FLUSH, lambda msg, **kw: _worker_flush(environment, msg), concurrent=True)
        environment.runner.register_message(STEP, lambda msg, **kw: _worker_step(msg))
        environment.runner.register_message(RESET, lambda msg, **kw: _worker_reset(environment))
        return
    if isinstance(environment.runner, MasterRunner):
        environment.runner.register_message(FLUSHED, lambda msg, **kw: _master_flushed(environment, msg))
        environment.runner.register_message(FATAL, lambda msg, **kw: fatal(environment, str(msg.data)))
    if environment.parsed_options is None:
        return
    opts = environment.parsed_options
    try:
        STATE.slos = parse_slo_option(opts.slo)
        # workers get the parsed texts, not file paths that may not exist on their machines
        opts.slo = [s.text for s in STATE.slos]
        if not environment.host:
            STATE.emulator = start_emulator(_emulator_args(opts))
            environment.host = opts.host = STATE.emulator.url
            print(
                f"vllm-load: no --host given: started the built-in vLLM EMULATOR at {STATE.emulator.url} "
                "(results describe the emulator, not a real vLLM)",
                flush=True,
            )
            if not opts.sidecar_url:
                series = Path(tempfile.gettempdir()) / f"vllm-load-sidecar-{os.getpid()}.jsonl"
                STATE.sidecar = start_sidecar(STATE.emulator.url, series)
                opts.sidecar_url = STATE.sidecar.url
        wait = parse_duration(opts.wait_for_server, "--wait-for-server")
    except UsageError as exc:
        _stop_children()
        die(str(exc))
    try:
        if wait > 0 and STATE.emulator is None:
            wait_for_server(environment.host, wait, opts.api_key, say=lambda line: print(line, flush=True))
        target = _check_target(environment)
        print(
            f"vllm-load: target {target.host} model {target.model} tokenizer {target.tokenizer} max_model_len "
            f"{target.max_model_len} input {target.input_spec.text} output {target.output_spec.text} tokens",
            flush=True,
        )
    except UsageError as exc:
        if environment.web_ui is None or opts.headless:
            _stop_children()
            die(str(exc))
        # the web UI stays up with the error shown: the user fixes the host or the options there
        STATE.target_error = str(exc)
        log.error("vllm-load: %s (fix it in the web UI and start again)", exc)
    webui.install(environment, _live_summary, STATE.slos, lambda: STATE.report,
                  lambda: STATE.fatal or STATE.target_error or (STATE.outage_now and f"OUTAGE: {STATE.outage_now}"))
    # The blocking start-up above (tokenizer, embedded emulator: seconds) left libev's cached clock
    # behind; Locust arms its --run-time timer next, relative to that stale "now", and a 3 s run
    # ended 0.1 s after it began. Refresh the clock so the run lasts what was asked.
    gevent.get_hub().loop.update_now()


def _watch_outages(environment: Any, rt: Runtime) -> None:
    """Say on the console (and the web UI) when the server becomes unreachable and when it is back, from the
    merged counts (on a master: as of the workers' last reports, every 3 s); --stop-on-outage ends the run."""
    stop_after = parse_duration(environment.parsed_options.stop_on_outage, "--stop-on-outage")
    while True:
        gevent.sleep(1.0)
        if rt.totals is None:
            return
        wins = rt.totals.outage_windows(rt.outage_after, time.time())
        cur = wins[-1] if wins and wins[-1].ongoing and wins[-1].is_outage else None
        if cur is not None:
            text = describe(cur, rt.start_wall, rt.totals.conn_error[1], live=True)
            if STATE.outage_now is None:
                print(f"vllm-load: OUTAGE: {text}", flush=True)
            STATE.outage_now = text
            if stop_after and cur.seconds >= stop_after and STATE.outage_stop is None:
                STATE.outage_stop = f"{text}: stopping the run (--stop-on-outage {environment.parsed_options.stop_on_outage})"
                sys.stderr.write(f"vllm-load: error: {STATE.outage_stop}\n")
                sys.stderr.flush()
                gevent.spawn(environment.runner.quit if environment.web_ui is None else environment.runner.stop)
        elif STATE.outage_now is not None:
            print("vllm-load: the server answers again", flush=True)
            STATE.outage_now = None


def _stop_children() -> None:
    for child in (STATE.sidecar, STATE.emulator):
        if child:
            child.stop()


def _live_summary() -> dict | None:
    rt = STATE.runtime
    if rt is None or rt.totals is None:
        return None
    summary = webui.live_summary(rt.totals, rt.start_wall, rt.health)
    summary["server"] = STATE.live_server.summary() if STATE.live_server is not None else None
    return summary


@events.test_start.add_listener
def _on_test_start(environment: Any, **_kw: Any) -> None:
    role = _role(environment)
    opts = environment.parsed_options
    if role != "worker" and (STATE.target is None or STATE.target.host != environment.host):
        try:  # the web UI may have changed the host since start-up
            _check_target(environment)
            STATE.target_error = None
        except UsageError as exc:
            # keep the process (and its web UI) up: show the error, stop this start, let the user fix the host
            STATE.target_error = str(exc)
            log.error("vllm-load: %s (fix it in the web UI and start again)", exc)
            if STATE.runtime is not None:
                STATE.runtime.close()
                STATE.runtime = None
            gevent.spawn(environment.runner.stop)
            return
    if STATE.runtime is not None:
        STATE.runtime.close()
    STATE.step_verdicts = {}
    if role != "worker":
        STATE.fatal = None
    worker_id = getattr(environment.runner, "client_id", "local")
    total_users = getattr(environment.runner, "target_user_count", 0) or 0
    STATE.runtime = rt = Runtime.create(role, opts, worker_id, total_users, _apis(environment),
                                        on_fatal=lambda message: fatal(environment, message))
    if role != "worker":
        if STATE.watcher is not None:
            STATE.watcher.kill(block=False)
        STATE.outage_now = STATE.outage_stop = None
        STATE.watcher = gevent.spawn(_watch_outages, environment, rt)
    if role != "worker" and environment.web_ui is not None and opts.sidecar_url:
        if STATE.live_server is not None:
            STATE.live_server.stop()
        STATE.live_server = LiveServer(opts.sidecar_url, rt.start_wall, opts.sidecar_token)
    for cls in environment.user_classes:
        cls.network_timeout = float(opts.request_timeout)
        if opts.request_rate > 0:  # open loop: one user holds many streams, each on its own connection
            cls.concurrency = max(1, int(opts.max_concurrency))
    if STATE.last_step is not None and environment.shape_class is not None and role != "worker":
        begin_step(*STATE.last_step)
    if role != "worker":
        rt.write_config(STATE.target, environment.host)
        print(f"vllm-load: run {rt.run_id} writes to {rt.run_dir}", flush=True)


@events.report_to_master.add_listener
def _on_report_to_master(data: dict, **_kw: Any) -> None:
    if STATE.runtime is not None:
        data["vllm_load"] = STATE.runtime.stats.take_delta()
        steps = {str(k): v.take_delta() for k, v in STATE.runtime.step_stats.items() if v.requests}
        if steps:
            data["vllm_load_steps"] = steps
        if STATE.runtime.monitor is not None:
            data["vllm_load_client"] = STATE.runtime.monitor.take()


@events.worker_report.add_listener
def _on_worker_report(client_id: str, data: dict, **_kw: Any) -> None:
    rt = STATE.runtime
    if rt is not None and rt.totals is not None and "vllm_load" in data:
        delta = LLMStats.from_wire(data["vllm_load"])
        if delta.requests or delta.tokens_per_second:
            rt.workers_seen.add(client_id)
        rt.totals.merge(delta)
        for k, wire in data.get("vllm_load_steps", {}).items():
            rt.step_stats.setdefault(int(k), LLMStats()).merge(LLMStats.from_wire(wire))
        if "vllm_load_client" in data:
            rt.health.add(client_id, data["vllm_load_client"])


def _collect_server_side(rt: Runtime, opts: Any) -> None:
    if not opts.sidecar_url or rt.end_wall is None:
        return
    why = fetch_series(opts.sidecar_url, rt.start_wall, rt.end_wall, rt.run_dir / "server.jsonl", opts.sidecar_token)
    if why:
        log.warning("vllm-load: server side missing from the report: %s", why)


@events.test_stop.add_listener
def _on_test_stop(environment: Any, **_kw: Any) -> None:
    rt = STATE.runtime
    if rt is not None and rt.role != "worker":
        rt.end_wall = time.time()
        rt.write_results()
        _collect_server_side(rt, environment.parsed_options)
        if environment.web_ui is not None:  # the web UI links the report as soon as a run stops
            from vllm_load.report.html import build

            STATE.report = str(build(rt.run_dir).report)


@events.quitting.add_listener
def _on_quitting(environment: Any, **_kw: Any) -> None:
    rt = STATE.runtime
    if rt is None:
        return
    if rt.role != "worker":
        # SIGTERM/SIGINT fire quitting before Locust stops the users: drain here too (no-op after a stop)
        _drain(environment)
        rt.end_wall = rt.end_wall or time.time()
        summary = rt.write_results()
        if not (rt.run_dir / "server.jsonl").exists():
            _collect_server_side(rt, environment.parsed_options)
        banner = " (target: built-in EMULATOR, not a real vLLM)" if STATE.target and STATE.target.is_emulator else ""
        from vllm_load.report.html import build  # matplotlib is loaded only at the end of a run

        _write_sweep(rt)
        built = build(rt.run_dir, junit=environment.parsed_options.junit)
        code = EXIT_BAD_INPUT if STATE.fatal else built.code
        exceptions = sum(row["count"] for row in environment.runner.exceptions.values())
        if code == EXIT_OK and exceptions:  # Locust's own rule, which our exit code would otherwise mask
            code = EXIT_ERRORS
        if STATE.outage_stop:
            code = EXIT_ERRORS
        STATE.report = str(built.report)
        sys.stdout.write("\n" + render_table(built.summary, f"vllm-load LLM metrics, run {rt.run_id}{banner}",
                                              server=built.server) + "\n")
        if STATE.fatal:
            sys.stdout.write(f"vllm-load: the run was stopped: {STATE.fatal}\n")
        if STATE.outage_stop:
            sys.stdout.write(f"vllm-load: the run was stopped: {STATE.outage_stop}\n")
        elif render_validity(built.validity):
            sys.stdout.write(render_validity(built.validity) + "\n")
        if exceptions:
            sys.stdout.write(f"vllm-load: user tasks raised {exceptions} exceptions (Locust's error report lists "
                             "them; the log shows each kind once)\n")
        if built.checks:
            sys.stdout.write(render_checks(built.checks) + "\n")
        sys.stdout.write(f"vllm-load: report {built.report} (exit code {code})\n")
        sys.stdout.flush()
        environment.process_exit_code = code
    if STATE.watcher is not None:
        STATE.watcher.kill(block=False)
    rt.close()
