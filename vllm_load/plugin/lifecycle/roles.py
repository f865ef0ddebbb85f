"""The runner that generates its own load (``LocalProcess``) and the master of a swarm (``MasterProcess``); with
``WorkerProcess`` (``worker.py``) one class per Locust role, chosen once by the runner Locust made."""

from __future__ import annotations

import logging
import time
from typing import Any

import gevent
from locust.runners import MasterRunner, WorkerRunner

from vllm_load.errors import EXIT_BAD_INPUT, EXIT_INVALID, EXIT_OUTPUT
from vllm_load.features import FEATURES
from vllm_load.plugin.swarm import run_clock, swarm_auth, wire, worker_secrets
from vllm_load.plugin.lifecycle import run_timer
from vllm_load.plugin.webui import ui_guard
from vllm_load.redact import printable
from vllm_load.plugin.lifecycle.controller import Controller
from vllm_load.plugin.load.generator import Generator
from vllm_load.plugin.lifecycle.process import Process
from vllm_load.plugin.lifecycle.run import Run
from vllm_load.plugin.lifecycle.worker import WorkerProcess

log = logging.getLogger("vllm_load")


class LocalProcess(Controller):
    """One process: it decides, generates and judges the run."""

    role = "local"

    def _start_load(self, run: Run) -> None:
        col = run.collector
        assert col is not None
        run.generator = gen = Generator.create(None, self.opts, run.plan, "local", self.apis(),
                                               on_fatal=self.fatal, health_sink=lambda r: col.health.add("local", r),
                                               on_trace_done=self.share_done)
        col.totals, col.start_wall = gen.stats, gen.start_wall  # the collector's totals are the generator's own
        if col.sweep is not None:  # and each step's stats its own per-step stats
            col.sweep.stats_source = gen.step_stats
        gen.clock.start_local(gen.start_wall, gen.start_perf)
        for feature in FEATURES:  # what a feature sends before the load (and beside it): before any user starts
            hook = feature.hook("before_load")
            beside = hook(self.environment, run) if hook is not None else None
            if beside is not None:
                run.beside.append(beside)
        # -t from here: the generator is ready, and what a feature sent alone before the load is done
        run.timed = run_timer.arm(self.environment, time.time())

    def _window(self, run: Run) -> Any:
        gen = run.generator
        return lambda: gen.start_wall

    def _drain(self, timeout: float) -> None:
        gen = self.generator
        if gen is None:
            return
        if gen.in_flight:
            print(f"vllm-load: stopping: waiting for {gen.in_flight} request(s) in flight to finish "
                  f"(at most --drain-timeout {timeout:g} s)", flush=True)
        self.drain_or_cut(gen, timeout, self.end.cut)


class MasterProcess(Controller):
    """A swarm's master: it decides and judges the run; its workers generate the load."""

    role = "master"

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        runner = environment.runner
        self.listen(environment.events.worker_report, self._on_worker_report)
        self.on_message(run_clock.PING, lambda msg: self._clock().on_ping(runner, msg))
        self.on_message(run_clock.READY, self._on_ready)
        self.on_message(run_clock.REMEASURED, lambda msg: self._clock().on_remeasured(msg))
        self.on_message(wire.FLUSHED, self._on_flushed)
        self.on_message(wire.FATAL, self._on_fatal)
        self.on_message(wire.TRACE_DONE, lambda msg: self.share_done((msg.data or {}).get("step")))

    def _guard_role(self, opts: Any) -> None:
        worker_secrets.guard_spawn_messages()
        warning = ui_guard.master_warning(opts.master_bind_host, int(opts.master_bind_port))
        if warning:
            print(warning, flush=True)
        print(swarm_auth.open_line(int(opts.master_bind_port)), flush=True)
        swarm_auth.watch_refusals(self.environment.runner)

    def _on_fatal(self, msg: Any) -> None:
        """A worker's failure stops the run; its words are printed escaped, and the exit code is never the wire's
        to choose freely: a worker's fatal is bad input (2), a scenario's abort (4) or a file it could not write (6),
        anything else is taken as 2 (a peer sent ``code: 0`` and the run exited 0)."""
        data = msg.data if isinstance(msg.data, dict) else {}
        code = data.get("code")
        self.fatal(printable(str(data.get("message", "")))[:2000],
                   code if code in (EXIT_BAD_INPUT, EXIT_INVALID, EXIT_OUTPUT) else EXIT_BAD_INPUT)

    def _master_runner(self) -> Any:
        return self.environment.runner

    def _start_load(self, run: Run) -> None:
        """Its workers generate the load: -t is armed at the epoch (``_on_ready``), or, should a worker never say it
        is ready, once the workers' own schedules stop waiting for one (``run_clock.WAIT_S``): a run still ends."""
        gevent.spawn_later(run_clock.WAIT_S, self._arm_late, run)

    def _arm_late(self, run: Run) -> None:
        if self.run is run and not run.timed:
            run.timed = run_timer.arm(self.environment, time.time())

    def _on_ready(self, msg: Any) -> None:
        """A worker's generator is ready: its offset for the epoch, and the drains in force (it may join late)."""
        clock = self._clock()
        clock.on_ready(self.environment.runner, msg)
        if self.run is not None:
            wire.tell_drained(self.run, self.environment.runner, msg.node_id)
            if clock.epoch is not None and not self.run.timed:  # -t from the epoch: every worker is ready
                self.run.timed = run_timer.arm(self.environment, clock.epoch)

    def _clock(self) -> run_clock.MasterClock:
        col = self.run.collector if self.run is not None else None
        return col.clock if col is not None else run_clock.MasterClock()

    def _on_worker_report(self, client_id: str, data: dict, **_kw: Any) -> None:
        col = self.run.collector if self.run is not None else None
        if col is not None:
            wire.merge_report(col, client_id, data)

    def _on_flushed(self, msg: Any) -> None:
        if self.run is not None:
            self.run.flushed.add(msg.node_id)

    def reset_metrics(self) -> None:
        """Here and in every worker, whose pending deltas go at the same instant as Locust's own pending worker
        stats, so both tables keep agreeing."""
        self._reset_own()
        for client in self.environment.runner.clients.all:
            self.environment.runner.send_message(wire.RESET, None, client_id=client.id)

    def _announce_step(self, step: int, rate: float, floor_s: float = 0.0) -> None:
        for client in self.environment.runner.clients.all:
            self.environment.runner.send_message(wire.STEP, {"step": step, "rate": rate, "floor": floor_s},
                                                 client_id=client.id)

    def hurry(self) -> None:
        """A second Ctrl-C: every worker cuts its requests in flight and sends its final numbers at once."""
        super().hurry()
        runner = self.environment.runner
        for cid in wire.live_workers(runner):
            runner.send_message(wire.CUT, None, client_id=cid)

    def _drain(self, timeout: float) -> None:
        """Every worker drains and sends its final numbers. A worker Locust marked missing (no heartbeat) cannot
        answer: not waited for, nor one Locust marks missing while we wait (killed just before the stop: ~4 s)."""
        runner, run = self.environment.runner, self.run
        assert run is not None and run.collector is not None
        col = run.collector
        clients = wire.live_workers(runner)
        if clients:  # what the stop waits for, said (a stop that takes seconds said nothing)
            print(f"vllm-load: stopping: waiting for {len(clients)} worker(s) to finish their requests in flight "
                  f"and send their final numbers (at most --drain-timeout {timeout:g} s)", flush=True)
        run.flushed = set()
        for cid in clients:
            runner.send_message(wire.FLUSH, None, client_id=cid)
        with gevent.Timeout(timeout + 10, False):
            while (clients & wire.live_workers(runner)) - run.flushed:
                gevent.sleep(0.05)  # the flushed messages arrive on the runner's own greenlet
        col.workers_lost = sorted((col.workers_seen | clients) - run.flushed)
        if col.workers_lost:
            log.warning("vllm-load: no final report from %d worker(s): %s", len(col.workers_lost),
                        ", ".join(col.workers_lost))


def make(environment: Any) -> Process:
    """This process's object, of the class of the runner Locust made (a worker's runner may still be in the making
    when its first spawn comes: its options say then)."""
    runner, opts = environment.runner, environment.parsed_options
    worker = isinstance(runner, WorkerRunner) if runner is not None else bool(getattr(opts, "worker", False))
    master = isinstance(runner, MasterRunner) if runner is not None else bool(getattr(opts, "master", False))
    cls = WorkerProcess if worker else MasterProcess if master else LocalProcess
    return cls(environment)
