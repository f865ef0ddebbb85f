"""Locust wiring: options, the target check at start-up, and each run's start (plan, runtime, watchers).

Importing this module (the users module does) registers vllm-load's listeners on ``locust.events``, the
way Locust's own plugins do: these here, the wire's (``wire.py``) and the end of a run's (``end_of_run.py``).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import shutil
import signal
import socket
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import gevent
import gevent.pool
import gevent.ssl
from locust import events, runners

from vllm_load.client.openai_api import tls_context, use_tls_context
from vllm_load.errors import UsageError, die
from vllm_load.metrics.prometheus import registry_for
from vllm_load.metrics.slo import parse_slo_option
from vllm_load.client.pooling import POOLING
from vllm_load import lifeline
from vllm_load.plugin import (end_of_run, interrupt, log_repeats, ports, options, saturation_watch, ui_guard, validate,
                              warmup_reset, web_gate, webui, wire, worker_secrets)
from vllm_load.plugin.embedded import emulator_args, emulator_mode, start_emulator, start_sidecar
from vllm_load.plugin.collector import Collector
from vllm_load.plugin.generator import Generator
from vllm_load.plugin.server_side import LiveServer
from vllm_load.plugin.plan import ramp_kind
from vllm_load.plugin.server_wait import parse_duration, wait_for_server
from vllm_load.plugin.shapes import UsersRamp
from vllm_load.plugin.state import STATE, role as role_of
from vllm_load.plugin.target import Target, resolve_targets
from vllm_load.rundir.files import check_writable, free_text

log = logging.getLogger("vllm_load")
#: seconds without the master's heartbeat (sent every second) before a worker stops: a killed master's remote
#: workers kept sending for Locust's 60 s; a master busy writing a report goes quiet for well under this
MASTER_SILENCE_S = 15


@events.init_command_line_parser.add_listener
def _add_options(parser: Any, **_kw: Any) -> None:
    options.add_arguments(parser)
    # Locust's web UI and master listen on every interface unless told: vllm-load's on this host only (workers on
    # other machines need --master-bind-host given, and the master says its port is unauthenticated)
    parser.set_defaults(web_host=ui_guard.DEFAULT_WEB_HOST, master_bind_host=ui_guard.DEFAULT_WEB_HOST)
    parse = parser.parse_args

    def parse_args(*args: Any, **kw: Any) -> Any:
        options = parse(*args, **kw)
        ports.settle(options)  # before Locust's runner binds (or forks workers onto) the master's port
        return options

    parser.parse_args = parse_args


def _swarm_check(environment: Any, host: str) -> str | None:
    """The web UI's start, before Locust starts anything: the form's host must be a URL whose server accepts a
    connection (None: go on; the full check, with the options the form sets, runs at the run's start as before).
    Only a TCP connect: nothing is sent, so no credential goes to a host the form just named."""
    if STATE.target is not None and STATE.target.host == host and not STATE.target_error:
        return None
    try:
        hosts = validate.split_hosts(host)
    except UsageError as exc:
        return str(exc)
    for one in hosts:
        parts = urlsplit(one)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            with socket.create_connection((parts.hostname or "", port), timeout=3.0):
                pass
        except OSError as exc:
            return (f"the target {one} is not reachable ({exc.strerror or exc}): start the server there, or give "
                    "another host")
    return None


def _apis(environment: Any) -> frozenset[str]:
    """The APIs the run's user classes send ("chat", "completions")."""
    return frozenset(a for a in (getattr(c, "api", None) for c in environment.user_classes) if a)


def _check_target(environment: Any) -> Target:
    opts = environment.parsed_options
    validate.check_options(environment)  # the web UI may have changed them since start-up
    is_emulator = STATE.emulator is not None and environment.host == STATE.emulator.url
    # check what this locustfile's users will send (a chat run against the chat template's minimum)
    target = resolve_targets(opts, validate.split_hosts(environment.host), is_emulator,
                             _apis(environment) or frozenset({"chat", "completions"}))
    STATE.target = target  # what it resolved (model, tokenizer) goes into the run plan
    return target


@events.init.add_listener
def _on_init(environment: Any, **_kw: Any) -> None:
    log_repeats.install()
    interrupt.install()
    STATE.environment = environment
    role = role_of(environment)
    log_repeats.quiet(role)
    wire.register(environment, role)
    opts = environment.parsed_options
    if role == "worker" and opts is not None:
        _init_worker(opts)
    STATE.initialised.set()
    if role == "worker" or opts is None:
        return
    try:
        worker_secrets.read_key_file(opts)
        if environment.web_ui is not None:  # first: every other hook of the UI comes after the gate
            _install_gate(environment, opts)
        if role == "master":
            worker_secrets.guard_spawn_messages()
            warning = ui_guard.master_warning(opts.master_bind_host, int(opts.master_bind_port))
            if warning:
                print(warning, flush=True)
        validate.check_options(environment)  # before anything starts: one line, exit 2
        # the run directory can hold the run's files (its default is decided per run, under reports/)
        check_writable(Path(opts.run_dir) if opts.run_dir else Path("reports"), "--run-dir" if opts.run_dir
                       else "the run directory's folder")
        use_tls_context(tls_context(opts.insecure, opts.ca_bundle))
        if opts.otlp_receiver:  # before the embedded emulator: it exports its spans there
            from vllm_load.plugin.span_receiver import SpanReceiver

            STATE.span_receiver = SpanReceiver(opts.otlp_receiver)
            print(STATE.span_receiver.banner(), flush=True)
        # parsed here: workers get the texts in the run plan, not file paths their machines may not have
        STATE.slos = parse_slo_option(opts.slo)
        STATE.sidecar_url = opts.sidecar_url
        if not environment.host:
            STATE.emulator_log = private_temp_file("emulator", ".log")
            spans = STATE.span_receiver.endpoint if STATE.span_receiver is not None else None
            STATE.emulator = start_emulator(emulator_args(opts, spans), STATE.emulator_log)
            environment.host = STATE.emulator.url
            print(
                f"vllm-load: no --host given: started the built-in vLLM EMULATOR at {STATE.emulator.url}, "
                f"{emulator_mode(opts)} (results describe the emulator, not a real vLLM)",
                flush=True,
            )
            if not opts.sidecar_url:
                STATE.sidecar = start_sidecar(STATE.emulator.url, private_temp_file("sidecar", ".jsonl"))
                STATE.sidecar_url = STATE.sidecar.url
        wait = parse_duration(opts.wait_for_server, "--wait-for-server")
        if ramp_kind(opts) == "users":  # the closed loop's users ramp: a shape of the plugin's
            shape = UsersRamp(opts.ramp_up_strategy, int(opts.ramp_up_start_users), int(opts.ramp_up_end_users),
                              float(opts.run_time))
            shape.runner = environment.runner
            environment.shape_class = shape
    except UsageError as exc:
        _stop_children()
        die(str(exc))
    if environment.web_ui is not None:  # before anything can fail: the UI stays up to show the error
        ui_guard.SecretGuard(environment).install(environment.web_ui)
        warning = ui_guard.bind_warning(opts.web_host, bool(opts.web_login))
        if warning:
            print(warning, flush=True)
    try:
        if wait > 0 and STATE.emulator is None:
            for one in validate.split_hosts(environment.host):
                wait_for_server(one, wait, opts.api_key, say=lambda line: print(line, flush=True))
        target = _check_target(environment)
        apis = _apis(environment)
        lengths = (f"input {target.input_spec.text} tokens per text" if apis and apis <= POOLING
                   else f"input {target.input_spec.text} output {target.output_spec.text} tokens")
        print(
            f"vllm-load: target {target.host} ({target.kind}) model {target.model} tokenizer {target.tokenizer} (from "
            f"{target.tokenizer_source}) max_model_len {target.max_model_len} {lengths}",
            flush=True,
        )
        if target.server_kind == "openai":
            print(openai_mode_line(target, opts), flush=True)
    except UsageError as exc:
        if environment.web_ui is None or opts.headless:
            _stop_children()
            die(str(exc))
        # the web UI stays up with the error shown: the user fixes the host or the options there
        STATE.target_error = str(exc)
        log.error("vllm-load: %s (fix it in the web UI and start again)", exc)
    registry = registry_for(lambda: STATE.collector.totals if STATE.collector is not None else None)
    webui.install(environment, _live_summary, STATE.slos, lambda: STATE.report,
                  lambda: STATE.fatal or STATE.target_error or (STATE.outage_now and f"OUTAGE: {STATE.outage_now}"),
                  metrics_registry=lambda: registry, live_source=_live_series, target_source=lambda: STATE.target,
                  swarm_check=functools.partial(_swarm_check, environment))
    if opts.metrics_port:
        _serve_metrics(registry, opts.metrics_host, int(opts.metrics_port))
    # The blocking start-up above (tokenizer, embedded emulator: seconds) left libev's cached clock
    # behind; Locust arms its --run-time timer next, relative to that stale "now", and a 3 s run
    # ended 0.1 s after it began. Refresh the clock so the run lasts what was asked.
    gevent.get_hub().loop.update_now()


def openai_mode_line(target: Target, opts: Any) -> str:
    """What a run that sends standard OpenAI fields only cannot control, said once at start-up."""
    why = ("--server-kind openai (the server says it is vLLM: --server-kind auto sends vLLM's fields)"
           if target.owned_by == "vllm" else
           f"the server is not vLLM (/v1/models owned_by {target.owned_by or 'nothing'!r}; --server-kind vllm "
           "overrides)")
    return (f"vllm-load: {why}: standard OpenAI fields only. Not controlled: output lengths (no ignore_eos/"
            "min_tokens: each answer ends where the model stops, at most max_tokens), tokens per chunk (no continuous "
            "usage: ITL per chunk only), and prefix-cache hits (known only where its usage reports cached tokens); "
            "without usage, output tokens are counted from the stream's deltas (at most max_tokens)")


def _init_worker(opts: Any) -> None:
    """A worker reads its own secrets (the master sends none) and dies with a --processes master."""
    try:
        worker_secrets.read_key_file(opts)
    except UsageError as exc:
        die(str(exc))
    STATE.own_headers = worker_secrets.OwnHeaders(opts)
    if getattr(opts, "processes", None):  # a fork of the master: it goes when the master goes, however killed
        gevent.signal_handler(signal.SIGUSR2, _master_gone)
        lifeline.die_with_parent(os.getppid(), signal.SIGUSR2)
    # a remote worker whose master went silent stops after this long, not Locust's 60 s (its own line says so)
    runners.MASTER_HEARTBEAT_TIMEOUT = MASTER_SILENCE_S


def _master_gone() -> None:
    """A --processes worker whose master died (the kernel's parent-death signal): its request log kept, one line,
    gone at once (its numbers have no master to go to; Locust's shutdown would wait for it)."""
    print("vllm-load: worker: its --processes master is gone: stopping", flush=True)
    try:
        if STATE.generator is not None:
            STATE.generator.flush_log()
    finally:
        os._exit(1)


def _install_gate(environment: Any, opts: Any) -> None:
    password = ""
    if opts.web_login:
        password, source = web_gate.login_password(opts, private_temp_file)
        print(f"vllm-load: --web-login: the password is in {source}", flush=True)
    names = web_gate.allowed_names(opts.web_host, tuple(opts.web_allowed_host or ()))
    web_gate.install(environment, names, validate.check_options, password)


def _ca_bundle_context(ca_bundle: str, cafile: Any = None, **_kw: Any) -> Any:
    """geventhttpclient passes its own CA file (certifi's): --ca-bundle's is the one that counts."""
    return gevent.ssl.create_default_context(cafile=ca_bundle)


def _serve_metrics(registry: Any, host: str, port: int) -> None:
    """--metrics-port: Prometheus' scrape endpoint beside a headless run (127.0.0.1 unless --metrics-host)."""
    from gevent.pywsgi import WSGIServer
    from prometheus_client import make_wsgi_app

    try:
        server = WSGIServer((host, port), make_wsgi_app(registry), log=None, error_log=None)
        server.start()
    except OSError as exc:
        _stop_children()
        die(f"--metrics-port {port} on {host} cannot be served ({exc.strerror or exc}): pick a free port")
    print(f"vllm-load: client metrics for Prometheus on http://{host}:{server.server_port}/metrics", flush=True)


def private_temp_file(what: str, suffix: str) -> Path:
    """A file of this process's own in the temp folder: mode 0600 (the emulator's log and the sidecar's series
    hold the run's timings), removed at exit (a 7-minute run left 2.2 MB behind per run)."""
    fd, name = tempfile.mkstemp(prefix=f"vllm-load-{what}-{os.getpid()}-", suffix=suffix)
    os.close(fd)
    path = Path(name)
    atexit.register(path.unlink, missing_ok=True)
    return path


def _stop_children() -> None:
    for child in (STATE.sidecar, STATE.emulator):
        if child:
            child.stop()


def _close_run() -> None:
    """The previous run's generator (threads, monitor, request log) goes before a new one starts."""
    if STATE.generator is not None:
        STATE.generator.close()
    STATE.generator = STATE.collector = None


def _live_series() -> dict:
    from vllm_load.plugin.live_charts import live_series

    col = STATE.collector
    if col is None:
        return live_series(None, 0.0, None)
    samples = STATE.live_server.samples if STATE.live_server is not None else None
    return live_series(col.totals, col.start_wall, samples)


def _live_summary() -> dict | None:
    if STATE.final_summary is not None:  # the run stopped: its judged summary
        return STATE.final_summary
    col = STATE.collector
    if col is None:
        return None
    summary = webui.live_summary(col.totals, col.measured_from, col.health)
    summary["server"] = STATE.live_server.summary() if STATE.live_server is not None else None
    return summary


@events.test_start.add_listener
def _on_test_start(environment: Any, **_kw: Any) -> None:
    role = role_of(environment)
    if not STATE.initialised.is_set():
        # a worker that joined a running swarm: Locust sent its users as it connected, before this process's
        # runner existed and its init ran (which registers the run clock's messages); the runner's constructor
        # and init go on in the main greenlet meanwhile (seen: 2 joins in 6 sent nothing)
        if not STATE.initialised.wait(60.0):
            raise RuntimeError("vllm-load: Locust's init did not come within 60 s of this worker's first spawn")
    opts = environment.parsed_options
    if role != "worker" and (STATE.target is None or STATE.target.host != environment.host):
        try:  # the web UI may have changed the host since start-up
            _check_target(environment)
            STATE.target_error = None
        except UsageError as exc:
            # keep the process (and its web UI) up: show the error, stop this start, let the user fix the host
            STATE.target_error = str(exc)
            log.error("vllm-load: %s (fix it in the web UI and start again)", exc)
            _close_run()
            gevent.spawn(environment.runner.stop)
            return
    _close_run()
    if role != "worker":
        STATE.fatal = None
        STATE.final_summary = None  # live numbers again
        if STATE.span_receiver is not None:  # this run's spans only
            STATE.span_receiver.clear()
        if opts.reset_prefix_cache and STATE.target is not None:  # before the run's first request
            from vllm_load.plugin.server_control import CacheReset

            if STATE.cache_reset is None:
                STATE.cache_reset = CacheReset(validate.split_hosts(environment.host), opts.api_key,
                                               lambda line: print(line, flush=True))
            if not getattr(opts, "sweep", ""):  # a sweep resets before each step (its first too)
                STATE.cache_reset("the run")
    worker_id = getattr(environment.runner, "client_id", "local")
    if role == "worker" and STATE.own_headers is not None:  # the spawn message replaced --header without them
        STATE.own_headers.restore(opts)
    plan = wire.worker_plan(environment) if role == "worker" else wire.decide_plan(environment)
    if role != "worker":
        STATE.collector = col = Collector.create(opts, plan, environment.runner if role == "master" else None)
        col.swarm = role == "master"
    if role != "master":
        sink = (lambda report: col.health.add("local", report)) if role == "local" else None
        index = getattr(environment.runner, "worker_index", 0)
        STATE.generator = gen = Generator.create(role, opts, plan, worker_id, _apis(environment),
                                                 on_fatal=functools.partial(wire.fatal, environment),
                                                 health_sink=sink, worker_index=index if index >= 0 else 0,
                                                 on_trace_done=functools.partial(wire.trace_done, environment))
        if role == "local":  # one process: the collector's totals are the generator's own stats
            col.totals, col.start_wall = gen.stats, gen.start_wall
            if col.sweep is not None:  # and each step's stats are the generator's own per-step stats
                col.sweep.stats_source = gen.step_stats
            gen.clock.start_local()
        else:  # ready: its offset to the master's clock, then READY; the master sends the epoch
            if STATE.worker_step is not None and environment.shape_class is not None:
                gen.set_step(*STATE.worker_step)  # announced before this generator was made
            gen.clock.keeper = gevent.spawn(gen.clock.measure, environment.runner)
    if STATE.warmup_reset is not None:
        STATE.warmup_reset.kill(block=False)
    window = (lambda: gen.start_wall) if role != "master" else (lambda: col.start_wall)  # the LLM metrics' window
    STATE.warmup_reset = warmup_reset.reset_after(environment, window, plan.warmup, say=role != "worker")
    if role != "worker":
        if STATE.watcher is not None:
            STATE.watcher.kill(block=False)
        STATE.outage_now = STATE.outage_stop = None
        STATE.watcher = gevent.pool.Group()
        STATE.watcher.spawn(end_of_run.watch_outages, environment, col)
        if role == "master":
            STATE.watcher.spawn(end_of_run.watch_heartbeats, environment.runner, col)
        STATE.watcher.spawn(saturation_watch.watch, environment, col, bool(opts.stop_over_saturated))
        dcgm_url = opts.dcgm_url or (plan.host.rstrip("/") + "/dcgm/metrics" if plan.is_emulator and opts.emulator_dcgm
                                     else "")
        if dcgm_url:
            from vllm_load.plugin.dcgm_source import DcgmPoller

            col.dcgm = DcgmPoller(dcgm_url)
        elif opts.dcgm_selector:  # the same fields from a Prometheus that scrapes the exporter, at the run's end
            from vllm_load.plugin.dcgm_source import PrometheusDcgm

            col.dcgm = PrometheusDcgm(opts.prometheus_url, opts.dcgm_selector, opts.prometheus_token, col.start_wall)
    if role != "worker" and (plan.sidecar_url or opts.prometheus_url):  # the web UI's server side, the saturation
        if STATE.live_server is not None:                                  # watch's queue
            STATE.live_server.stop()
        STATE.live_server = (LiveServer.prometheus(opts.prometheus_url, opts.prometheus_selector, col.start_wall,
                                                   opts.prometheus_token, interval=2.0) if opts.prometheus_url else
                             LiveServer.sidecar(plan.sidecar_url, col.start_wall, opts.sidecar_token, interval=2.0))
    for cls in environment.user_classes:
        cls.network_timeout = float(opts.request_timeout)
        # Locust's FastHttpUser skips certificate checks unless told: vllm-load verifies unless --insecure
        cls.insecure = bool(opts.insecure)
        if opts.ca_bundle and not opts.insecure:
            cls.ssl_context_factory = functools.partial(_ca_bundle_context, opts.ca_bundle)
        if opts.request_rate > 0 or opts.trace or ramp_kind(opts) == "rate":  # open loop: one user holds many streams
            cls.concurrency = max(1, int(opts.max_concurrency))
    if STATE.last_step is not None and environment.shape_class is not None and role != "worker":
        wire.begin_step(*STATE.last_step)
    STATE.trace_done = 0
    if role != "worker":
        col.write_config(STATE.target)
        print(f"vllm-load: run {plan.run_id} writes to {plan.files.path} "
              f"({free_text(shutil.disk_usage(plan.files.path).free)})", flush=True)
