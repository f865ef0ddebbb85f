"""The run plan decided (``decide``) from the options and the checked target; the plan itself, which a finished
run reads back from config.json, is ``rundir/plan.RunPlan``."""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

from vllm_load.metrics.histogram import parse_percentiles
from vllm_load.plugin.lifecycle.sweep import SweepSpec
from vllm_load.plugin.prepare.target import Target
from vllm_load.rundir.files import own_run_dir
from vllm_load.rundir.plan import RunPlan
from vllm_load.workload.rate_schedule import RateSchedule
from vllm_load.plugin.lifecycle.run_timer import run_seconds
from vllm_load.workload.scenarios import apply

__all__ = ["PLAN", "RunPlan", "decide", "ramp_kind", "why_no_window"]

#: master -> worker: the plan, in every spawn message (an attribute of the master's parsed options, which Locust
#: copies into them)
PLAN = "vllm_load_plan"


def ramp_kind(opts: Any) -> str:
    """What --ramp-up-strategy ramps: "users" (``--ramp-up-*-users`` given: the closed loop), "rate" (the open loop),
    or "" (no ramp)."""
    if not opts.ramp_up_strategy:
        return ""
    return "users" if getattr(opts, "ramp_up_end_users", 0) or getattr(opts, "ramp_up_start_users", 0) else "rate"


def why_no_window(opts: Any, shaped: bool = False) -> str | None:
    """Why a run has no steady window (None: it has one). A load whose level changes by design has no one
    level to be steady at; ``shaped``: the locustfile brings a load shape of its own."""
    if getattr(opts, "sweep", "") or int(getattr(opts, "repeat", 0) or 0) > 1:
        return "a sweep's (or --repeat's) steps each run at their own level"
    if ramp_kind(opts) or float(getattr(opts, "ramp_up", 0) or 0) > 0:
        return "a ramp changes the load all along"
    if getattr(opts, "trace", ""):
        return "a trace's arrivals follow the trace, not one level"
    if getattr(opts, "rate_schedule", ""):
        return "a rate schedule changes the load all along"
    if shaped:
        return "the locustfile's load shape changes the load"
    return None


def decide(opts: Any, target: Target, slos: list[str], sidecar_url: str, total_users: int, processes: int = 1,
           shaped: bool = False) -> RunPlan:
    """The plan of the run that starts, from the options and the checked target."""
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
    sweep = SweepSpec.of(opts)
    return RunPlan(run_id=run_id, salt=opts.salt or secrets.token_hex(16), seed=opts.seed if opts.seed >= 0 else None,
                   run_dir=own_run_dir(opts.run_dir, run_id) if opts.run_dir else str(Path("reports") / run_id),
                   host=target.host, model=target.model, tokenizer=target.tokenizer, is_emulator=target.is_emulator,
                   slos=tuple(slos), sidecar_url=sidecar_url, total_users=max(1, int(total_users or 1)),
                   backoff_max=target.backoff_max, outage_after=target.outage_after,
                   stop_on_outage=target.stop_on_outage, models=target.models or (target.model,), warmup=target.warmup,
                   model_weights=target.model_weights,
                   processes=max(1, processes), trace_rows=target.trace_rows, trace_span=target.trace_span,
                   max_model_len=target.max_model_len, num_requests=max(0, int(opts.num_requests)),
                   server_kind=target.server_kind,
                   percentiles=parse_percentiles(opts.metric_percentiles) if opts.metric_percentiles else (),
                   ramp=(opts.ramp_up_strategy, float(opts.ramp_up_start_rps), float(opts.ramp_up_end_rps),
                         0.0 if opts.num_requests else run_seconds(opts)) if ramp_kind(opts) == "rate" else (),
                   sweep_kind=sweep.kind if sweep else "", sweep_levels=sweep.levels if sweep else (),
                   hosts=target.hosts, steady=why_no_window(opts, shaped) is None,
                   constant_rate=float(opts.request_rate or 0.0) if why_no_window(opts, shaped) is None else 0.0,
                   rate_schedule=tuple(tuple(p) for p in RateSchedule.read(opts.rate_schedule).to_wire())
                   if getattr(opts, "rate_schedule", "") else (),
                   rate_schedule_ends=bool(getattr(opts, "rate_schedule", "")) and not run_seconds(opts),
                   scenario=getattr(opts, "scenario", ""), min_duration=float(getattr(opts, "min_duration", 0.0) or 0),
                   scenario_overrides=scenario_applied(opts))


def scenario_applied(opts: Any, run_s: float | None = None) -> tuple[str, ...]:
    """--scenario: its fixed values set on ``opts`` where they were left at their defaults (idempotent: the web UI's
    every start checks again), and the options given other values (none without a scenario). ``run_s``: the -t
    asked, checked against a scenario that runs for a duration (the start-up's check of a headless run; the
    plan's, later, finds -t taken over by the run timer)."""
    from vllm_load.options import OPTIONS

    name = getattr(opts, "scenario", "")
    return apply(name, opts, {o.dest: o.default for o in OPTIONS}, run_s) if name else ()
