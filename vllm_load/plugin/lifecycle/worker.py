"""A Locust worker's part: it generates its share of the load with the master's plan, and answers the master's
messages (clock, step, reset, flush)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import gevent
import gevent.event
from locust import runners

from vllm_load import lifeline
from vllm_load.errors import EXIT_BAD_INPUT, UsageError, die
from vllm_load.plugin.swarm import run_clock, swarm_auth, wire, worker_secrets
from vllm_load.plugin.load import warmup_reset
from vllm_load.plugin.load.generator import Generator
from vllm_load.plugin.lifecycle.process import Process
from vllm_load.plugin.lifecycle.run import Run
from vllm_load.workload.lengths import parse_duration

#: seconds without the master's heartbeat (sent every second) before a worker stops: a killed master's remote
#: workers kept sending for Locust's 60 s; a master busy writing a report goes quiet for well under this
MASTER_SILENCE_S = 15
#: the same while this worker starts its run: Locust fires test_start in the greenlet that reads the master's
#: messages, so its heartbeats wait unread while the tokenizer loads and the pools fill (off the loop, but waited
#: for there); beside the full suite that took over 15 s, and both workers of a --processes 2 run quit at spawn
START_SILENCE_S = 120
#: the master's silence a remote worker says on its console, long before it stops at MASTER_SILENCE_S (a killed
#: master's workers sent for 15 s more and said nothing until Locust's "Didn't get heartbeat" as they quit)
SILENCE_SAID_S = 5.0
_starting = 0  # this process's workers starting a run now (the limit above holds while any does)


class WorkerProcess(Process):
    role = "worker"

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        #: the sweep step (and its rate) the master announced last: it comes before the spawn message, so before
        #: the run's generator, which takes it when made (a sweep over workers had an empty first step)
        self.step: tuple[int, float, float] | None = None  # the sweep step announced: (step, rate, floor)
        self.own_headers: worker_secrets.OwnHeaders | None = None
        #: set by the first parent-death signal: the kernel sends one each time the thread it is parented to exits,
        #: and a killed master's threads exit one by one (a worker said it was stopping twice)
        self.master_gone = False
        self.listen(environment.events.report_to_master, self._on_report_to_master)
        self.on_message(run_clock.PONG, lambda msg: self._clock().on_pong(msg.data))
        self.on_message(run_clock.EPOCH, lambda msg: self._clock().on_epoch(msg.data))
        self.on_message(wire.FLUSH, self._on_flush, concurrent=True)
        self.cut = gevent.event.Event()  # the master's CUT: its end stops waiting for the requests in flight
        self.on_message(wire.CUT, lambda _msg: self.cut.set(), concurrent=True)
        self.on_message(wire.STEP, self._on_step)
        self.on_message(wire.RESET, self._on_reset)
        self.on_message(wire.DRAIN, self._on_drain)

    def start_up(self) -> None:
        """A worker reads its own secrets (the master sends none) and dies with a --processes master."""
        opts = self.opts
        if opts is None:  # Locust used as a library, without parsed options
            return
        try:
            worker_secrets.read_key_file(opts)
        except UsageError as exc:
            die(str(exc))
        self.own_headers = worker_secrets.OwnHeaders(opts)
        said = swarm_auth.worker_line()
        if said and not getattr(opts, "workers_of_this_master", False):  # a remote worker says how it joins
            print(said, flush=True)
        if getattr(opts, "processes", None):  # a fork of the master: it goes when the master goes, however killed
            gevent.signal_handler(signal.SIGUSR2, self._master_gone)
            lifeline.die_with_parent(os.getppid(), signal.SIGUSR2)
        if getattr(opts, "workers_of_this_master", False):
            # a process group of its own: a terminal's Ctrl-C goes to the whole foreground group, and the workers quit
            # without their final reports (a summary of 6 requests beside logs of 10); the master stops them after
            # their drain, and Locust's exit signals each one itself
            os.setpgid(0, 0)
        # a remote worker whose master went silent stops after this long, not Locust's 60 s (its own line says so)
        runners.MASTER_HEARTBEAT_TIMEOUT = MASTER_SILENCE_S
        self.environment.runner.greenlet.spawn(self._watch_master)  # Locust's runner kills its group as it quits

    def start_run(self) -> None:
        # Locust's limit is one for the process: while any worker here starts (vllm_load.testing runs several in one
        # process) it stays long; the first to finish once set it back under the others, and one still loading its
        # tokenizer was stopped (1 run in the fast selection)
        global _starting
        _starting += 1
        runners.MASTER_HEARTBEAT_TIMEOUT = START_SILENCE_S
        try:
            self._start_run()
        finally:
            # the master's heartbeats queued meanwhile are read once this returns: the silence counts from here
            # (Locust's attribute, bounded as its version is in setup.cfg)
            self.environment.runner.last_heartbeat_timestamp = time.time()
            _starting -= 1
            if not _starting:
                runners.MASTER_HEARTBEAT_TIMEOUT = MASTER_SILENCE_S

    def _start_run(self) -> None:
        env, opts = self.environment, self.opts
        if self.own_headers is not None:  # the spawn message replaced --header without them
            self.own_headers.restore(opts)
        plan = wire.worker_plan(opts)
        self._close_run()
        runner = env.runner
        index = max(runner.worker_index, 0)
        # its request log is named by its index in the swarm and its host (its records carry Locust's worker id)
        host = runner.client_id.rsplit("_", 1)[0] if "_" in runner.client_id else runner.client_id
        gen = Generator.create(f"w{index}-{host}", opts, plan, runner.client_id, self.apis(), on_fatal=self.fatal,
                               worker_index=index, on_trace_done=self.share_done)
        self.run = Run(plan, generator=gen)
        if self.step is not None and env.shape_class is not None:
            gen.set_step(*self.step)  # announced before this generator was made
        gen.clock.keeper = gevent.spawn(gen.clock.measure, runner)  # its offset to the master's clock, then READY
        self.run.warmup = warmup_reset.reset_after(env, lambda: gen.start_wall, plan.warmup, say=False)
        self.configure_users()

    def fatal(self, message: str, code: int = EXIT_BAD_INPUT) -> None:
        """A failure every request would repeat: the master stops the run with it."""
        self.environment.runner.send_message(wire.FATAL, {"message": message, "code": code})

    def share_done(self, step: int | None = None) -> None:
        self.environment.runner.send_message(wire.TRACE_DONE, {"step": step})

    def _clock(self) -> run_clock.WorkerClock:
        gen = self.generator
        return gen.clock if gen is not None else run_clock.WorkerClock()  # a stray message before the run: dropped

    def _on_step(self, msg: Any) -> None:
        self.step = (int(msg.data["step"]), float(msg.data["rate"]), float(msg.data.get("floor") or 0.0))
        if self.generator is not None:
            self.generator.set_step(*self.step)

    def _on_drain(self, msg: Any) -> None:
        gen = self.generator
        if gen is not None:
            gen.drained.set(str(msg.data["target"]), bool(msg.data["drained"]))

    def _on_reset(self, _msg: Any) -> None:
        """The master's reset: Locust's pending worker stats and ours in the same greenlet step (the tables agree)."""
        self.environment.runner.stats.reset_all()
        self._reset_own()

    def _on_flush(self, _msg: Any) -> None:
        """The master asked for the end of the run: drain, then ship the final numbers before Locust quits."""
        runner, gen = self.environment.runner, self.generator
        if gen is not None:
            self.drain_or_cut(gen, parse_duration(self.opts.drain_timeout, "--drain-timeout"), self.cut)
            # Locust's and our final report, before the master quits: WorkerRunner._send_stats is private (checked
            # against Locust 2.40-2.47, setup.cfg's bounds; tests/test_sweep.py fails when it goes)
            runner._send_stats()
        runner.send_message(wire.FLUSHED, None)

    def _on_report_to_master(self, data: dict, **_kw: Any) -> None:
        if self.generator is not None:
            wire.add_report(self.generator, data)

    def _watch_master(self) -> None:
        """Say once when the master has gone silent (killed, or its host busy), how long its users go on sending
        and when this worker stops; and once when it is heard again."""
        runner, said = self.environment.runner, False
        while True:
            gevent.sleep(1.0)
            last = getattr(runner, "last_heartbeat_timestamp", None)  # Locust's (bounded as setup.cfg says)
            silent = time.time() - last if last and not _starting else 0.0
            if silent >= SILENCE_SAID_S and not said:
                print(f"vllm-load: worker: no word from the master for over {SILENCE_SAID_S:g} s (killed, or its host "
                      f"busy): its users go on sending until {MASTER_SILENCE_S} s of silence, then this worker stops",
                      flush=True)
            elif said and silent < SILENCE_SAID_S:
                print("vllm-load: worker: the master is heard again", flush=True)
            said = silent >= SILENCE_SAID_S

    def _master_gone(self) -> None:
        """The --processes master died (the kernel's parent-death signal): the request log kept, one line, gone at
        once (its numbers have no master to go to; Locust's shutdown would wait for it)."""
        if self.master_gone:
            return
        self.master_gone = True
        print("vllm-load: worker: its --processes master is gone: stopping", flush=True)
        try:
            if self.generator is not None:
                self.generator.flush_log()
        finally:
            os._exit(1)
