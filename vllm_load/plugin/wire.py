"""Both ends of the worker <-> master wire: vllm-load's messages (plan, step, drain, reset, fatal stop) and
the LLM stats riding in Locust's own reports, with what each end does on receipt."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import gevent
from locust import events
from locust.runners import MasterRunner, WorkerRunner

from vllm_load.metrics.stats import LLMStats
from vllm_load.plugin import run_clock
from vllm_load.plugin.plan import PLAN, RunPlan, decide
from vllm_load.errors import EXIT_BAD_INPUT
from vllm_load.plugin.state import STATE

log = logging.getLogger("vllm_load")
#: worker -> master: this worker finished its share of the run (the trace's rows, or --num-requests)
TRACE_DONE = "vllm_load_trace_done"


FLUSH, FLUSHED, STEP, FATAL, RESET = ("vllm_load_flush", "vllm_load_flushed", "vllm_load_step", "vllm_load_fatal",
                                      "vllm_load_reset")


def _reset(environment: Any) -> None:
    """Reset the LLM metrics with Locust's table: here, and (from a master) in every worker, whose pending
    deltas go at the same instant as Locust's own pending worker stats, so both tables keep agreeing."""
    for part in (STATE.generator, STATE.collector):
        if part is not None:
            part.reset_metrics()
    if isinstance(environment.runner, MasterRunner):
        for client in environment.runner.clients.all:
            environment.runner.send_message(RESET, None, client_id=client.id)


def _worker_reset(environment: Any) -> None:
    environment.runner.stats.reset_all()  # Locust's pending worker stats, in the same greenlet step as ours
    if STATE.generator is not None:
        STATE.generator.reset_metrics()


@events.reset_stats.add_listener
def _on_reset_stats(**_kw: Any) -> None:
    """The web UI's Reset button (fired on the master or the local runner)."""
    if STATE.environment is not None:
        _reset(STATE.environment)


@events.spawning_complete.add_listener
def _on_spawning_complete(user_count: int = 0, **_kw: Any) -> None:
    """--reset-stats: Locust resets every runner's table when its spawning completes; ours go with it."""
    env = STATE.environment
    if env is not None and env.reset_stats:
        for part in (STATE.generator, STATE.collector):
            if part is not None:
                part.reset_metrics()


def trace_done(environment: Any, step: int | None = None) -> None:
    """This process finished its share of the run (its trace rows, or its --num-requests share, sent and
    back): a worker tells the master; the master (or a local runner) ends the run once every load process has.
    In a sweep (``step``) the share is the step's: the sweep shape moves on once every process finished it."""
    if isinstance(environment.runner, WorkerRunner):
        environment.runner.send_message(TRACE_DONE, {"step": step})
        return
    plan = STATE.plan
    if step is not None:
        STATE.steps_done[step] = STATE.steps_done.get(step, 0) + 1
        if plan is not None and STATE.steps_done[step] == plan.processes:
            print(f"vllm-load: sweep step {step}: {plan.num_requests} requests completed (--num-requests)", flush=True)
        return
    STATE.trace_done += 1
    if plan is None or STATE.trace_done < plan.processes:
        return
    if plan.num_requests:
        print(f"vllm-load: {plan.num_requests} requests completed (--num-requests): stopping the run", flush=True)
    else:
        print("vllm-load: the trace was replayed: stopping the run", flush=True)
    end_run(environment)


def end_run(environment: Any) -> None:
    """The run ends before its -t: a headless process quits (and exits with the run's code), a web UI stops
    the run and stays up (it shows why)."""
    if environment.web_ui is not None:
        gevent.spawn(environment.runner.stop)
    else:
        gevent.spawn(environment.runner.quit)


def fatal(environment: Any, message: str, code: int = EXIT_BAD_INPUT) -> None:
    """A failure every request would repeat (prompts that cannot be built: exit code 2), or a run directory that
    cannot be written (6): stop the whole run with one line instead of going on until -t runs out; the end
    of the run still prints its verdict. Workers tell the master."""
    if isinstance(environment.runner, WorkerRunner):
        environment.runner.send_message(FATAL, {"message": message, "code": code})
        return
    if STATE.fatal is not None:
        return
    STATE.fatal, STATE.fatal_code = message, code
    sys.stderr.write(f"vllm-load: error: {message}\n")
    sys.stderr.flush()
    end_run(environment)  # a web UI shows the error; the user fixes the options


def begin_step(environment: Any, step: int, level: float) -> None:
    """Called by the sweep shape on the master (or local runner) at every tick; acts on a new step."""
    # the shape's first tick comes before test_start creates the run's collector: test_start re-applies it
    STATE.last_step = (environment, step, level)
    col = STATE.collector
    # a step's measured window starts after its warm-up (its requests before that are not in its stats)
    if col is None or col.sweep is None or not col.sweep.begin(step, level, time.time(), col.plan.warmup):
        return
    rate_sweep = col.sweep.kind == "rate"
    rate = float(level) if rate_sweep else 0.0
    if STATE.generator is not None:
        STATE.generator.set_step(step, rate)
    print(f"vllm-load: sweep step {step}: {level:g} {'req/s' if rate_sweep else 'users'}", flush=True)
    if STATE.cache_reset is not None:  # before the step's first request (its workers are told next)
        STATE.cache_reset(f"sweep step {step}")
    if isinstance(environment.runner, MasterRunner):
        for client in environment.runner.clients.all:
            environment.runner.send_message(STEP, {"step": step, "rate": rate}, client_id=client.id)


def _worker_step(msg: Any) -> None:
    """The master's new sweep step. Its first step comes before the worker's spawn message, so before its
    generator: kept, and applied when the generator is made (its requests were left untagged before, and a
    sweep over workers had an empty first step)."""
    STATE.worker_step = (int(msg.data["step"]), float(msg.data["rate"]))
    if STATE.generator is not None:
        STATE.generator.set_step(*STATE.worker_step)


def _worker_flush(environment: Any, msg: Any, **_kw: Any) -> None:
    """Master asked for the end of the run: drain, then ship the final numbers before Locust quits."""
    gen = STATE.generator
    if gen is not None:
        if not gen.drain(float(environment.parsed_options.drain_timeout)):
            log.warning("vllm-load: %d requests still in flight after the drain timeout", gen.in_flight)
        # Locust's and our final report, before the master quits: WorkerRunner._send_stats is private (checked
        # against Locust 2.40-2.47, setup.cfg's bounds; tests/test_sweep.py fails when it goes)
        environment.runner._send_stats()
    environment.runner.send_message(FLUSHED, None)


def _master_flushed(environment: Any, msg: Any, **_kw: Any) -> None:
    STATE.flushed.add(msg.node_id)


def _live_workers(runner: MasterRunner) -> set[str]:
    """Workers still heartbeating: Locust's heartbeat greenlet marks a silent one missing, then drops it."""
    return {c.id for c in runner.clients.all if c.state != "missing"}


def drain(environment: Any) -> None:
    """End the run without losing a request: this process (local) or every worker (master) starts no
    new request, lets in-flight streams finish (at most --drain-timeout) and reports them. Idempotent."""
    runner, col = environment.runner, STATE.collector
    if col is None or col.drained:
        return
    col.drained = True
    timeout = float(environment.parsed_options.drain_timeout) if environment.parsed_options else 30.0
    if isinstance(runner, MasterRunner):
        # a worker Locust marked missing (no heartbeat) cannot answer: do not wait for it, nor for one
        # Locust marks missing while we wait (a worker killed just before the stop; ~4 s, not the timeout)
        clients = _live_workers(runner)
        if clients:  # what the stop waits for, said (a stop that takes seconds said nothing)
            print(f"vllm-load: stopping: waiting for {len(clients)} worker(s) to finish their requests in flight "
                  f"and send their final numbers (at most --drain-timeout {timeout:g} s)", flush=True)
        STATE.flushed = set()
        for cid in clients:
            runner.send_message(FLUSH, None, client_id=cid)
        with gevent.Timeout(timeout + 10, False):
            while (clients & _live_workers(runner)) - STATE.flushed:
                gevent.sleep(0.05)  # the flushed messages arrive on the runner's own greenlet
        col.workers_lost = sorted((col.workers_seen | clients) - STATE.flushed)
        if col.workers_lost:
            log.warning("vllm-load: no final report from %d worker(s): %s", len(col.workers_lost), ", ".join(col.workers_lost))
    elif STATE.generator is not None:  # local
        if STATE.generator.in_flight:
            print(f"vllm-load: stopping: waiting for {STATE.generator.in_flight} request(s) in flight to finish "
                  f"(at most --drain-timeout {timeout:g} s)", flush=True)
        if not STATE.generator.drain(timeout):
            log.warning("vllm-load: %d requests still in flight after the drain timeout", STATE.generator.in_flight)


@events.test_stopping.add_listener
def _on_test_stopping(environment: Any, **_kw: Any) -> None:
    """Locust's quit() (-t) stops without telling workers and waits 0.5 s for their last report, which
    loses the requests finishing then: drain first."""
    drain(environment)


def decide_plan(environment: Any) -> RunPlan:
    """The master's (or local runner's) plan for the run that starts; workers get it before their spawn
    message (the same ordered channel), so their test_start has it."""
    opts, target = environment.parsed_options, STATE.target
    assert target is not None
    users = getattr(environment.runner, "target_user_count", 0) or getattr(opts, "num_users", 0) or 1
    processes = len(environment.runner.clients.all) if isinstance(environment.runner, MasterRunner) else 1
    plan = decide(opts, target, [s.text for s in STATE.slos], STATE.sidecar_url, users, processes)
    STATE.plan = plan
    if isinstance(environment.runner, MasterRunner):
        # the plan rides in every spawn message: Locust copies the master's custom options into each (the
        # decision, not an option the user gave). A message of its own raced a joining worker: Locust sends
        # the joiner its users as it connects, before the worker's init has registered any handler, and the
        # plan was dropped as an unknown message type (the joiner then never sent: 2 runs in 6 here).
        setattr(opts, PLAN, plan.to_wire())
    return plan


def worker_plan(environment: Any) -> RunPlan:
    """The plan that came with the master's spawn message (at the run's start, or when this worker joined)."""
    data = getattr(environment.parsed_options, PLAN, None)
    if not data:
        raise RuntimeError("vllm-load: a spawn came without the master's run plan (master and worker versions differ?)")
    STATE.plan = RunPlan.from_wire(data)
    return STATE.plan


@events.report_to_master.add_listener
def _on_report_to_master(data: dict, **_kw: Any) -> None:
    gen = STATE.generator
    if gen is not None:
        data["vllm_load"] = gen.stats.take_delta()
        steps = {str(k): v.take_delta() for k, v in gen.step_stats.items() if v.requests}
        if steps:
            data["vllm_load_steps"] = steps
        if gen.monitor is not None:
            data["vllm_load_client"] = gen.monitor.take()


@events.worker_report.add_listener
def _on_worker_report(client_id: str, data: dict, **_kw: Any) -> None:
    col = STATE.collector
    if col is not None and "vllm_load" in data:
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


def _worker_clock() -> run_clock.WorkerClock:
    gen = STATE.generator
    return gen.clock if gen is not None else run_clock.WorkerClock()  # a stray message before the run: dropped


def _master_clock() -> run_clock.MasterClock:
    return STATE.collector.clock if STATE.collector is not None else run_clock.MasterClock()


def register(environment: Any, role: str) -> None:
    """Register this process's end of the wire (at init)."""
    runner = environment.runner
    if role == "worker":
        runner.register_message(run_clock.PONG, lambda msg, **kw: _worker_clock().on_pong(msg.data))
        runner.register_message(run_clock.EPOCH, lambda msg, **kw: _worker_clock().on_epoch(msg.data))
        runner.register_message(FLUSH, lambda msg, **kw: _worker_flush(environment, msg), concurrent=True)
        runner.register_message(STEP, lambda msg, **kw: _worker_step(msg))
        runner.register_message(RESET, lambda msg, **kw: _worker_reset(environment))
    elif role == "master":
        runner.register_message(run_clock.PING, lambda msg, **kw: _master_clock().on_ping(runner, msg))
        runner.register_message(run_clock.READY, lambda msg, **kw: _master_clock().on_ready(runner, msg))
        runner.register_message(run_clock.REMEASURED, lambda msg, **kw: _master_clock().on_remeasured(msg))
        runner.register_message(FLUSHED, lambda msg, **kw: _master_flushed(environment, msg))
        runner.register_message(FATAL, lambda msg, **kw: fatal(environment, str(msg.data["message"]),
                                                                int(msg.data["code"])))
        runner.register_message(TRACE_DONE, lambda msg, **kw: trace_done(environment, (msg.data or {}).get("step")))
