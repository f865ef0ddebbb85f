"""Watches a run (master or local runner) for over-saturation, every second, from what the run already holds: the
server's waiting queue (the sidecar's or Prometheus' live samples), else the client's requests in flight (open
loop), the merged TTFT and completions per second, and the load offered. The judgement is
``metrics/fleet/saturation.detect``; a finding is said once, kept for the summary, and with --stop-over-saturated ends
the run (or the sweep) there."""

from __future__ import annotations

import logging
import time
from typing import Any

import gevent

from vllm_load.metrics.fleet.saturation import Finding, detect
from vllm_load.plugin.lifecycle.collector import Collector
from vllm_load.plugin.lifecycle.run import Run

log = logging.getLogger(__name__)

#: seconds the judged window ends before now: a master's totals are as of the workers' last reports (every 3 s)
LAG_MASTER_S, LAG_LOCAL_S = 4.0, 1.0


def offered_level(environment: Any, col: Collector, now: float) -> tuple[float, str]:
    """The load offered now: the open loop's total rate (a sweep step's, the ramp's, --request-rate), else users."""
    opts, plan = col.opts, col.plan
    if col.sweep is not None and col.sweep.kind == "rate" and col.sweep.current_level() is not None:
        return float(col.sweep.current_level()), "req/s"
    if plan.ramp:
        return plan.ramp_rate(now - (col.clock.epoch or col.start_wall), col.totals.requests, plan.num_requests), "req/s"
    if plan.schedule is not None:
        return plan.schedule.rate_at(now - (col.clock.epoch or col.start_wall)), "req/s"
    if opts.request_rate:
        return float(opts.request_rate), "req/s"
    return float(getattr(environment.runner, "user_count", 0) or 0), "users"


def _per_second(sums: Any, counts: Any, start_wall: float, until: float, mean: bool) -> list[tuple[float, float]]:
    out = []
    for second in sorted(counts):
        if second + 1 > until:
            break
        n = counts[second]
        if n:
            out.append((second + 0.5 - start_wall, sums[second] / n if mean else float(n)))
    return out


def watch(environment: Any, run: Run, stop: bool, master: bool) -> None:
    """Until a finding (or the run's end: the greenlet is killed with the run's other watchers)."""
    col = run.collector
    assert col is not None
    lag = LAG_MASTER_S if master else LAG_LOCAL_S
    in_flight: list[tuple[float, float]] = []
    offered: list[tuple[float, float]] = []
    while True:
        gevent.sleep(1.0)
        now = time.time()
        t = now - col.start_wall
        level, unit = offered_level(environment, col, now)
        offered.append((t, level))
        gen = run.generator
        if gen is not None:  # local: the generator's own count
            in_flight.append((t, float(gen.in_flight)))
        elif master:  # the workers' latest reports
            latest = [rows[-1] for rows in col.health.reports.values() if rows and "in_flight" in rows[-1]]
            if latest:
                in_flight.append((max(r["t"] for r in latest) - col.start_wall, float(sum(r["in_flight"] for r in latest))))
        live = run.live_server
        samples = [s for s in (live.samples if live is not None else []) if s.get("waiting") is not None]
        if samples:
            queue, source = [(s["t"] - col.start_wall, float(s["waiting"])) for s in samples], "server waiting"
        elif unit == "req/s":
            queue, source = in_flight, "client in flight"
        else:  # a closed loop's in-flight count is its users: no queue to read without the server's
            continue
        totals = col.totals
        ttft = _per_second(totals.ttft_per_second, totals.first_tokens_per_second, col.start_wall, now - lag, True)
        done = _per_second(totals.done_per_second, totals.done_per_second, col.start_wall, now - lag, False)
        finding = detect(queue, ttft, done, offered, t - lag, source, unit)
        if finding is None:
            continue
        found(environment, col, finding, stop)
        return


def found(environment: Any, col: Collector, finding: Finding, stop: bool) -> None:
    from vllm_load.plugin.swarm.wire import end_run

    col.saturation = finding
    print(f"vllm-load: OVER-SATURATED: {finding.text}", flush=True)
    if stop:
        print("vllm-load: stopping the run there (--stop-over-saturated)", flush=True)
        end_run(environment)
