"""What watches a run while it goes (a local runner's or a master's): outages said as they start and end (and
--stop-on-outage), the workers Locust marks missing, the saturation watch, GPU telemetry, the server's live samples
for the web UI, the profiler's window and the fault plan's actions. Each is a greenlet of ``Run.watchers`` (killed with the run)."""

from __future__ import annotations

import functools
import sys
import time
from typing import Any, Callable

import gevent
import gevent.pool

from vllm_load.metrics.fleet.outages import LiveOutage, Window, describe
from vllm_load.plugin.watch import fault_plan, saturation_watch
from vllm_load.plugin.lifecycle.collector import Collector
from vllm_load.plugin.lifecycle.run import Run
from vllm_load.plugin.sources.server_control import Profiler
from vllm_load.plugin.sources.server_side import LiveServer
from vllm_load.plugin.swarm.wire import end_run, route


def start(environment: Any, run: Run, window: Callable[[], float], master_runner: Any = None) -> None:
    """The run's watchers; ``window``: when its measured window opens (read again at the warm-up's end);
    ``master_runner``: a master's runner, whose workers it watches (None: a local runner)."""
    opts, col, plan = environment.parsed_options, run.collector, run.plan
    assert col is not None
    run.watchers = gevent.pool.Group()
    run.watchers.spawn(watch_outages, environment, run)
    if master_runner is not None:
        run.watchers.spawn(watch_heartbeats, master_runner, col)
    if col.profiler is not None and col.profiler.at.kind == "run":
        run.watchers.spawn(_profile_window, col.profiler, window, plan.warmup)
    if opts.fault or opts.fault_plan:  # once per swarm: here, the master's or the local runner's
        actions = fault_plan.check_targets(fault_plan.parse_plan(opts.fault, opts.fault_plan), plan.hosts)
        col.fault_actions = actions
        router = functools.partial(fault_plan.read_router, opts.router_metrics) if opts.router_metrics else \
            (lambda: None)
        run.watchers.spawn(fault_plan.run_plan, actions, col.start_wall, col.faults,
                           lambda line: print(line, flush=True), functools.partial(route, run, master_runner), router)
    run.watchers.spawn(saturation_watch.watch, environment, run, bool(opts.stop_over_saturated),
                       master_runner is not None)
    dcgm_url = opts.dcgm_url or (plan.host.rstrip("/") + "/dcgm/metrics" if plan.is_emulator and opts.emulator_dcgm
                                 else "")
    if dcgm_url:
        from vllm_load.plugin.sources.dcgm_source import DcgmPoller

        col.dcgm = DcgmPoller(dcgm_url)
    elif opts.dcgm_selector:  # the same fields from a Prometheus that scrapes the exporter, at the run's end
        from vllm_load.plugin.sources.dcgm_source import PrometheusDcgm

        col.dcgm = PrometheusDcgm(opts.prometheus_url, opts.dcgm_selector, opts.prometheus_token, col.start_wall)
    if opts.prometheus_url:  # the web UI's server side, the saturation watch's queue
        run.live_server = LiveServer.prometheus(opts.prometheus_url, opts.prometheus_selector, col.start_wall,
                                                opts.prometheus_token, interval=2.0)
    elif plan.sidecar_url:
        run.live_server = LiveServer.sidecar(plan.sidecar_url, col.start_wall, opts.sidecar_token, interval=2.0)
    if col.profiler is not None and col.profiler.at.kind == "running" and run.live_server is not None:
        run.watchers.spawn(_profile_when_running, col.profiler, run.live_server, int(col.profiler.at.value),
                           float(opts.profile_seconds))


def watch_heartbeats(runner: Any, col: Collector) -> None:
    """A master notes each worker Locust marks missing, and when (Locust's check runs every second)."""
    while True:
        gevent.sleep(0.5)
        col.note_missing(runner)


def watch_outages(environment: Any, run: Run) -> None:
    """Say on the console (and the web UI) when the server becomes unreachable and when it is back, from the
    merged counts (on a master: as of the workers' last reports, every 3 s); --stop-on-outage ends the run.
    With --host a,b each replica is watched on its own evidence, and the run is unreachable only while every one
    is: a replica that goes down is named and stops nothing while another answers (a dead r2 was called a fleet
    outage, and --stop-on-outage stopped a healthy r1 mid-answer)."""
    col = run.collector
    assert col is not None
    stop_after = col.plan.stop_on_outage
    watches: dict[str | None, LiveOutage] = {}
    down: dict[str | None, str] = {}  # None: the run (every target); else a target's URL
    while True:
        gevent.sleep(1.0)
        now = time.time()
        current = _targets_now(watches, col, now)
        fleet = len(current) > 1
        run_window = _every_target(current, now) if fleet else _current(watches, None, col.totals, col, now)
        # while every target is down the run's line says it once; the replicas are named again once one answers
        items = [(None, run_window)] + (sorted(current.items()) if fleet and run_window is None else [])
        for key, cur in items:
            if cur is None:
                if down.pop(key, None) is not None:
                    print(f"vllm-load: {'the server' if key is None else f'target {key}'} answers again", flush=True)
                continue
            t = col.totals if key is None else col.totals.targets[key]
            text = ("" if key is None else f"target {key}: ") + describe(
                cur, col.start_wall, t.conn_error[1], live=True) + (" (every target)" if key is None and fleet else "")
            if key not in down:
                print(f"vllm-load: OUTAGE: {text}", flush=True)
            down[key] = text
            if key is None and stop_after and cur.seconds >= stop_after and run.outage_stop is None:
                run.stop_on_outage(f"{text}: stopping the run (--stop-on-outage "
                                   f"{environment.parsed_options.stop_on_outage})")
                sys.stderr.write(f"vllm-load: error: {run.outage_stop}\n")
                sys.stderr.flush()
                end_run(environment)
        run.outage_now = "; ".join(down.values()) or None


def _targets_now(watches: dict[str | None, LiveOutage], col: Collector, now: float) -> dict[str, Window | None]:
    """Each target's outage now. With --host a,b every replica is one of the fleet from the start, with or without
    a request ended on it yet (r1 streaming 2,000-token answers had ended none 6 s in, when r2 was killed: the fleet
    looked like r2 alone, and r2's refusals stopped the run as a fleet outage beside two real vLLMs)."""
    seen = col.totals.targets
    fleet = set(col.plan.hosts) if len(col.plan.hosts) > 1 else set()
    return {key: _current(watches, key, seen[key], col, now) if key in seen else None
            for key in sorted(fleet | set(seen))}


def _current(watches: dict[str | None, LiveOutage], key: str | None, t: Any, col: Collector, now: float
             ) -> Window | None:
    """The outage going on now at one target (or the run's single one), on its own evidence; None: it answers."""
    live = watches.setdefault(key, LiveOutage(col.plan.outage_after))
    span = live.check(t.ok_buckets, t.conn_buckets, t.fail_buckets, now)
    return span if span is not None and span.is_outage else None


def _every_target(current: dict[str, Window | None], now: float) -> Window | None:
    """The fleet's outage: every target unreachable at once, since the last of them went (None: one answers)."""
    if not current or any(w is None for w in current.values()):
        return None
    spans = [w for w in current.values() if w is not None]
    return Window(max(w.start for w in spans), now, sum(w.attempts for w in spans), sum(w.connection for w in spans),
                  ongoing=True, conn_seconds=min(w.conn_seconds for w in spans))


def _profile_window(profiler: Profiler, start_wall: Callable[[], float], warmup: float) -> None:
    """--profile-at run: the profiler starts when the measured window opens (after --warmup)."""
    while (wait := start_wall() + warmup - time.time()) > 0:
        gevent.sleep(min(wait, 0.5))
    profiler.start("the measured window")


def _profile_when_running(profiler: Profiler, live: LiveServer, running: int, seconds: float) -> None:
    """--profile-at N: the profiler starts once the server's series says it runs N requests (the sidecar's samples,
    seconds behind), for --profile-seconds; the run's end stops it sooner."""
    while not (live.samples and live.samples[-1].get("running", 0) >= running):
        gevent.sleep(0.5)
    profiler.start(f"the server at {running}+ running requests")
    gevent.sleep(seconds)
    profiler.stop()
