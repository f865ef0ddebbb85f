"""The worker <-> master wire: vllm-load's message names, the run plan that rides in Locust's spawn message, and
the LLM stats riding in Locust's own reports (each role's object handles its end: ``worker.py``, ``roles.py``)."""

from __future__ import annotations

import time
from typing import Any

import gevent
from locust.runners import MasterRunner

from vllm_load.metrics.stats import LLMStats
from vllm_load.plugin.lifecycle.collector import Collector
from vllm_load.plugin.load.generator import Generator
from vllm_load.plugin.prepare.plan import PLAN, RunPlan, decide
from vllm_load.plugin.prepare.target import Target

#: worker -> master: this worker finished its share of the run (the trace's rows, or --num-requests)
TRACE_DONE = "vllm_load_trace_done"
FLUSH, FLUSHED, STEP, FATAL, RESET = ("vllm_load_flush", "vllm_load_flushed", "vllm_load_step", "vllm_load_fatal",
                                      "vllm_load_reset")
#: master -> worker: a second Ctrl-C: stop waiting for the requests in flight, cut them, and send the final numbers
CUT = "vllm_load_cut"
#: master -> worker: a fault plan drained a replica of --host (or brought it back): {"target", "drained"}
DRAIN = "vllm_load_drain"



def end_run(environment: Any) -> None:
    """The run ends before its -t: a headless process quits (and exits with the run's code), a web UI stops
    the run and stays up (it shows why)."""
    if environment.web_ui is not None:
        gevent.spawn(environment.runner.stop)
    else:
        gevent.spawn(environment.runner.quit)


def decide_plan(environment: Any, target: Target, slos: list, sidecar_url: str,
                master: MasterRunner | None) -> RunPlan:
    """The master's (or local runner's) plan for the run that starts; workers get it in their spawn message."""
    opts = environment.parsed_options
    users = getattr(environment.runner, "target_user_count", 0) or getattr(opts, "num_users", 0) or 1
    processes = len(master.clients.all) if master is not None else 1
    plan = decide(opts, target, [s.text for s in slos], sidecar_url, users, processes,
                  shaped=environment.shape_class is not None)
    if master is not None:
        # the plan rides in every spawn message: Locust copies the master's custom options into each (the
        # decision, not an option the user gave). A message of its own raced a joining worker: Locust sends
        # the joiner its users as it connects, before the worker's init has registered any handler, and the
        # plan was dropped as an unknown message type (the joiner then never sent: 2 runs in 6 here).
        setattr(opts, PLAN, plan.to_wire())
    return plan


def worker_plan(opts: Any) -> RunPlan:
    """The plan that came with the master's spawn message (at the run's start, or when this worker joined)."""
    data = getattr(opts, PLAN, None)
    if not data:
        raise RuntimeError("vllm-load: a spawn came without the master's run plan (master and worker versions differ?)")
    return RunPlan.from_wire(data)


def add_report(gen: Generator, data: dict) -> None:
    """A worker's LLM numbers since its last report, into Locust's report to the master."""
    data["vllm_load"] = gen.stats.take_delta()
    steps = {str(k): v.take_delta() for k, v in gen.step_stats.items() if v.requests}
    if steps:
        data["vllm_load_steps"] = steps
    if gen.monitor is not None:
        data["vllm_load_client"] = gen.monitor.take()


def merge_report(col: Collector, client_id: str, data: dict) -> None:
    """A worker's report, merged into the master's totals (and its sweep steps, and its client health)."""
    if "vllm_load" not in data:
        return
    delta = LLMStats.from_wire(data["vllm_load"])
    col.last_report[client_id] = time.time()
    if delta.requests or delta.tokens_per_second:
        col.workers_seen.add(client_id)
    col.totals.merge(delta)
    if col.sweep is not None:
        for k, wire in data.get("vllm_load_steps", {}).items():
            col.sweep.merge(int(k), LLMStats.from_wire(wire))
    if "vllm_load_client" in data:
        col.health.add(client_id, data["vllm_load_client"])


def live_workers(runner: MasterRunner) -> set[str]:
    """Workers still heartbeating: Locust's heartbeat greenlet marks a silent one missing, then drops it."""
    return {c.id for c in runner.clients.all if c.state != "missing"}


def route(run: Any, master_runner: Any, target: str, drained: bool) -> None:
    """A fault plan's drain in every load process: this one's generator, or each live worker's (``DRAIN``); the
    master keeps what is drained (``Run.drained``) for a worker that joins later (``tell_drained``)."""
    (run.drained.add if drained else run.drained.discard)(target)
    if master_runner is None:
        if run.generator is not None:
            run.generator.drained.set(target, drained)
        return
    for cid in live_workers(master_runner):
        master_runner.send_message(DRAIN, {"target": target, "drained": drained}, client_id=cid)


def tell_drained(run: Any, master_runner: Any, client_id: str) -> None:
    """A worker that got ready mid-run (READY) hears the drains in force: it would send to a drained replica."""
    for target in sorted(run.drained):
        master_runner.send_message(DRAIN, {"target": target, "drained": True}, client_id=client_id)
