"""What generates load, in a local runner or a worker: its requests (``RequestSource``), the requests in flight
and their drain (and --num-requests' tickets), this process's stats and request log, the open-loop schedule,
the client's own health monitor. A master has none."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

import gevent.event

from vllm_load.client.direct import Connections
from vllm_load.client.record import RequestRecord
from vllm_load.errors import EXIT_BAD_INPUT, EXIT_OUTPUT, OutputError
from vllm_load.metrics.judge.client_monitor import ClientMonitor
from vllm_load.metrics.judge.slo import goodput_thresholds, parse_slo_option
from vllm_load.metrics.stats import LLMStats
from vllm_load.runtime import gc_control
from vllm_load.plugin.load.drain import Drained
from vllm_load.plugin.load.open_loop import ScheduleEnd, arrival_sequence, is_open_loop
from vllm_load.plugin.prepare.plan import RunPlan
from vllm_load.plugin.load.failed_share import FailedShare
from vllm_load.plugin.load.idle_shift import IdleShift
from vllm_load.plugin.load.refusals import Refusals
from vllm_load.plugin.requests.request_source import RequestSource
from vllm_load.plugin.swarm.run_clock import WorkerClock
from vllm_load.plugin.load.tickets import Tickets
from vllm_load.plugin.load.steady import SteadyWindow
from vllm_load.plugin.prepare.target import class_headers, request_headers
from vllm_load.plugin.load.warmup import warm_up
from vllm_load.rundir.reqlog import RequestLog
from vllm_load.workload.arrivals import ArrivalSequence
from vllm_load.workload.rate_schedule import NEVER_S
from vllm_load.workload.scenarios import scenario_of
from vllm_load.workload.tokenizer import encode_in_calling_thread

#: GIL switch interval in load-generating processes (seconds)
SWITCH_INTERVAL = 0.0005


@dataclass
class Generator:
    log_name: str | None  # this process's request log's name (None: a local run's requests.jsonl; a worker's own)
    opts: Any  # Locust's parsed options, read only
    plan: RunPlan
    worker_id: str
    #: this process's place in the swarm (Locust's worker index; 0 for a local run): what its prompts' content
    #: and its random draws derive from, the same run after run (the worker id is new every time)
    worker_index: int = 0
    stats: LLMStats = field(default_factory=LLMStats)
    reqlog: RequestLog | None = None
    headers: dict[str, str] = field(default_factory=dict)
    session_header: str = "X-Session-ID"  # --session-header: where a session's id goes (self.llm.session)
    class_headers: dict = field(default_factory=dict)  # --class-header: a request name -> the headers it carries
    start_wall: float = field(default_factory=time.time)
    start_perf: float = field(default_factory=time.perf_counter)  # start_wall on the perf_counter clock
    slos: list = field(default_factory=list)  # the run's SLOs, parsed: each request's goodput limits come from them
    goodput_limits: dict = field(default_factory=dict)  # by request name: its tier's limits, made at its first request
    arrivals: ArrivalSequence | None = None  # this process's share of the run's open-loop arrivals (made at first use)
    step: int | None = None  # current sweep step
    step_rate: float = 0.0  # open-loop rate of the current sweep step
    rate_changed: Any = None  # gevent Event, set (and replaced) when a sweep step changes the open-loop rate
    step_stats: dict = field(default_factory=dict)  # step -> LLMStats of this process's requests
    monitor: ClientMonitor | None = None  # this process's CPU, loop lag and CPU wait
    draining: bool = False  # set at the end of a run: users start no new request
    drain_over: bool = False  # the end's wait for the requests in flight is over: a request cut from here failed
    fold_slice: int = 256  # chunks per fold slice, by the reader the run's target gets (FOLD_SLICE_*)
    in_flight: int = 0
    idle: Any = None  # gevent Event, set while no request is in flight
    idle_shift: IdleShift | None = None  # --system-idle-cap: a replay's pending turns, shifted while none is in flight
    folder: Any = None  # greenlet folding finished requests into the stats while the loop is idle
    #: a failure every request would repeat (prompts cannot be built): the plugin stops the run with it
    on_fatal: Any = field(default=lambda message, code=EXIT_BAD_INPUT: None)
    watches: tuple = ()  # its answers, watched to stop the run: ``Refusals``, a scenario's ``FailedShare``
    #: told once the share's rows are sent and back, or its --num-requests finished (its sweep step, or None)
    on_trace_done: Any = field(default=lambda step=None: None)
    step_started: float = 0.0  # wall time the current sweep step began (its warm-up counts from there)
    tickets: Tickets = field(default_factory=lambda: Tickets(0))  # --num-requests: this process's share of N
    requests: RequestSource | None = None  # what it sends (plugin/requests/request_source.py)
    clock: WorkerClock = field(default_factory=WorkerClock)  # the run's epoch, shared by every load process
    users_made: int = 0  # this process's users so far: with the worker index, a user's number in the swarm
    steady: SteadyWindow = field(default_factory=lambda: SteadyWindow(False))  # the run's steady window here
    shared: dict = field(default_factory=dict)  # what this process's users share in the run (``LLM.shared``)
    drained: Drained = field(default_factory=lambda: Drained(()))  # the replicas a fault plan's drain took out
    schedule_end: ScheduleEnd | None = None  # a rate schedule that ends the run (no -t): this process's share

    def target_for_new_user(self) -> str | None:
        """--host a,b: the replica of the next user made here, round robin from a start of this process's own
        (its index): each process spreads its users over every replica, and processes with one user each (or
        any count the replicas do not divide) start on different ones, so the swarm splits evenly (within one
        user per process). None with one target."""
        number = self.users_made + self.worker_index
        self.users_made += 1
        return self.plan.target_of(number)

    @property
    def source(self) -> str:
        return f"w{self.worker_index}"

    @classmethod
    def create(cls, log_name: str | None, opts: Any, plan: RunPlan, worker_id: str, apis: frozenset[str] = frozenset(),
               on_fatal: Any = None, health_sink: Any = None, worker_index: int = 0,
               on_trace_done: Any = None) -> Generator:
        """Fills the prompt pools of ``apis`` (the users' APIs) first: its users never wait for a first prompt."""
        rt = cls(log_name=log_name, opts=opts, plan=plan, worker_id=worker_id, worker_index=worker_index)
        rt.fold_slice = cls.FOLD_SLICE_NATIVE if Connections.reads_natively(plan.urls[0]) else cls.FOLD_SLICE_PYTHON
        if on_fatal is not None:  # before the pools start: their first prompts may already fail
            rt.on_fatal = on_fatal
        rt._watch(opts, plan)
        if on_trace_done is not None:
            rt.on_trace_done = on_trace_done
        rt.tickets = Tickets(plan.share(worker_index) if plan.num_requests else 0)
        rt.steady, rt.drained = SteadyWindow(plan.steady), Drained(plan.hosts)
        if plan.schedule is not None and plan.rate_schedule_ends:
            rt.schedule_end = ScheduleEnd(plan.schedule.end, lambda: rt.on_trace_done(), rt.schedule_start)
        plan.files.path.mkdir(parents=True, exist_ok=True)
        rt.idle = gevent.event.Event()
        rt.idle.set()
        rt.rate_changed = gevent.event.Event()
        # the prompt thread holds the GIL in turns of 5 ms by default; a stream read behind it is as late
        sys.setswitchinterval(SWITCH_INTERVAL)
        rt._prepare_generation()
        rt.requests = RequestSource(opts, plan, worker_index, rt.on_fatal, rt.on_trace_done, rt.idle)
        rt.requests.fill_pools(apis)
        encode_in_calling_thread()  # the prompt thread's encodes at its own (low) priority from here on
        warm_up()  # before the heap is frozen: what it loads is start-up heap too
        # before the loop-lag monitor starts: the one full collection here takes ~0.1 s
        gc_control.freeze_startup_heap()  # collections run from _fold_when_idle instead
        # this process's load starts now, once it is ready (its pools full, its heap frozen: on a busy host that
        # took 0.5 s, and a local run's schedule, started after it, lagged the run's start by as much)
        rt.start_wall, rt.start_perf = time.time(), time.perf_counter()  # one instant, on the schedules' clock too
        floor = plan.floor_of(plan.total_users) if not plan.sweep_kind else 0.0  # a floored run's: from its start
        rt.tickets.restart(floor + plan.warmup if floor else 0.0, rt.start_wall)
        # local: reports go straight to the collector; each second a loop too busy to idle still collects
        rt.monitor = ClientMonitor(lambda: rt.in_flight, health_sink, tick=lambda: gc_control.collect_if_due(force=True))
        rt.monitor.start()
        rt.folder = gevent.spawn(rt._fold_when_idle)
        return rt

    def _watch(self, opts: Any, plan: RunPlan) -> None:
        """What watches every finished request: refusals, a scenario's failed share, --system-idle-cap's shift."""
        cap = float(getattr(opts, "system_idle_cap", 0.0) or 0.0)
        self.idle_shift = IdleShift(cap, lambda: self.in_flight) if cap > 0 else None
        self.watches = (
            Refusals(self.on_fatal, bool(getattr(opts, "worker", False)), bool(getattr(opts, "api_key", ""))),
            *([FailedShare(scenario_of(plan.scenario).failed_share, plan.scenario, self.on_fatal)]
              if plan.scenario else []), *([self.idle_shift] if self.idle_shift is not None else []))

    def _prepare_generation(self) -> None:
        self.headers = request_headers(self.opts)
        self.session_header = str(getattr(self.opts, "session_header", "") or "X-Session-ID")
        self.class_headers = class_headers(getattr(self.opts, "class_header", None))
        self.slos = parse_slo_option(list(self.plan.slos))
        self.reqlog = RequestLog(self.plan.files.requests(self.log_name))

    def set_step(self, step: int, rate: float, floor_s: float = 0.0) -> None:
        """Enter a sweep step (``floor_s``: its duration floor); open-loop users waiting on a gap drawn at the old
        rate wake and redraw."""
        changed = rate != self.step_rate
        self.step, self.step_rate = step, rate
        self.step_started = time.time()
        if self.plan.num_requests:  # --num-requests counts each step apart: its share starts over
            # the floor is the measured window's: it counts from the step's warm-up end
            self.tickets.restart(floor_s + self.plan.warmup if floor_s else 0.0, self.step_started)
        if changed:
            self.arrivals = None  # the step's own sequence, from its start
            self.rate_changed, old = gevent.event.Event(), self.rate_changed
            old.set()

    def schedule_start(self) -> float:
        """When this process's schedules (trace rows, open-loop arrivals) count from, on the perf_counter clock:
        the run's epoch, once the master fixed it (a local run: its own start)."""
        return self.clock.start_perf(self.start_perf)

    def open_loop(self) -> bool:
        """Does this run (or sweep step) send on an arrival schedule: a rate sweep's step, a ramp, a rate schedule,
        --request-rate?"""
        return is_open_loop(self.plan, self.opts, self.step, self.step_rate)

    def take_arrival(self) -> float:
        """When this process's next open-loop arrival is due, on the perf_counter clock: its share of the run's
        one arrival sequence (plugin/load/open_loop.py), which a sweep step's new rate starts over."""
        if self.arrivals is None:
            step = self.step if self.plan.sweep_kind == "rate" else None
            offset = time.perf_counter() - self.schedule_start() if step is not None else 0.0
            self.arrivals = arrival_sequence(self.plan, self.opts, step, self.step_rate, offset, self.worker_index)
        t = self.arrivals.next()
        if self.schedule_end is not None and not self.schedule_end.take(t):
            return self.schedule_start() + NEVER_S  # past the schedule's last row: the user waits for the run's end
        return self.schedule_start() + t

    def begin_request(self) -> None:
        """A request is about to start. With --num-requests it first takes one of this process's tickets, and
        waits for one to come back (a warm-up request's) once they are all taken."""
        t = self.tickets
        if self.plan.num_requests:
            if t.share == 0:  # more processes than requests: this one sends none
                self.park()
            while not t.take():
                if t.finished_share():  # the floor passed while every ticket was held and done: the share is done
                    gevent.spawn(self.on_trace_done, self.step)
                t.back.wait()
                if self.draining:
                    self.park()
            if t.last_taken():  # the share's last request: the users stop one by one from here
                self.steady.close(time.time())
        self.in_flight += 1
        self.idle.clear()

    @staticmethod
    def park() -> None:
        """Block until Locust stops this user (a user that stopped itself would leave Locust a dead
        greenlet it logs as an error)."""
        gevent.event.Event().wait()

    def end_request(self, sent: bool = True) -> None:
        """A request counted by begin_request is over (recorded, or never sent: its ticket comes back): a drain
        may be waiting."""
        if not sent and self.plan.num_requests:
            self.tickets.give_back()
        self.in_flight -= 1
        if self.in_flight <= 0:
            self.in_flight = 0
            self.idle.set()

    def drain(self, timeout: float, cut: gevent.event.Event | None = None) -> bool:
        """Start no new request; wait (at most ``timeout`` s, or until ``cut`` is set) for those in flight to end."""
        self.draining = True
        self.steady.close(time.time())  # every stop drains (a master's tells its workers to): the users wind down
        gevent.wait([self.idle, *([cut] if cut is not None else [])], timeout=timeout, count=1)
        drained, self.drain_over = self.idle.is_set(), True
        self.flush_log()  # what the end of the run reads is all written
        return drained

    def flush_log(self, wait: bool = True) -> None:
        """Write the request log's kept records (its writer thread takes them in batches); ``wait``: until
        they are in the file."""
        if self.reqlog:
            try:
                self.reqlog.flush(wait)
            except OutputError as exc:  # said at once; the run stops and still gives its verdict
                self.on_fatal(str(exc), EXIT_OUTPUT)

    def in_warmup(self, rec: RequestRecord) -> bool:
        """Started within --warmup of the run's start, or of its sweep step's (a new level's first seconds)."""
        w = self.plan.warmup
        if w <= 0:
            return False
        return rec.start < self.start_wall + w or (rec.step is not None and rec.step == self.step
                                                   and rec.start < self.step_started + w)

    def _exclude(self, rec: RequestRecord, counter: str) -> None:
        """A request logged but left out of every metric, counted under ``counter``; its --num-requests ticket
        comes back (a past step's ticket is not this step's)."""
        if self.plan.num_requests and rec.step == self.step:
            self.tickets.give_back()
        for stats in (self.stats, *([self.step_stats.setdefault(rec.step, LLMStats())] if rec.step is not None
                                    else [])):
            setattr(stats, counter, getattr(stats, counter) + 1)
        if self.reqlog:
            self.reqlog.write(rec)

    def _count_send(self, rec: RequestRecord) -> None:
        """Sent: the load delivered, whatever became of it (metrics/shape/delivered.py): a constant rate's sends past its
        start-up (wall clock); a rate schedule's every send and its request's segment (seconds from the epoch)."""
        if self.plan.schedule is not None:
            epoch = self.start_wall + self.schedule_start() - self.start_perf  # the run's epoch on this wall clock
            rec.segment = self.plan.schedule.segment_of(rec.start - epoch)
            self.stats.sends.add(rec.start + rec.send_lag - epoch)
        elif self.plan.constant_rate and not rec.startup:
            self.stats.sends.add(rec.start + rec.send_lag)

    def on_record(self, rec: RequestRecord) -> None:
        self.end_request()
        for watch in self.watches:
            watch.add(rec)
        rec.warmup = rec.warmup or self.in_warmup(rec)
        if rec.send_lag is not None and not rec.warmup:
            self._count_send(rec)
        if rec.removed or rec.abandoned:  # its user was removed mid-run, or it gave up (--cancel): logged, no metric
            self._exclude(rec, "removed_excluded" if rec.removed else "abandoned_excluded")
            return
        if rec.warmup:
            self._exclude(rec, "warmup_excluded")
            return
        if (limits := self.goodput_limits.get(rec.name)) is None:
            limits = self.goodput_limits[rec.name] = goodput_thresholds(self.slos, rec.name)
        if limits:
            rec.good = rec.ok and all((value := getattr(rec, metric)) is not None and value <= limit
                                      for metric, limit in limits.items())
        rec.steady = self.steady.holds(rec)
        self.stats.add(rec)
        if rec.step is not None:
            self.step_stats.setdefault(rec.step, LLMStats()).add(rec)
        if self.reqlog:
            self.reqlog.write(rec)
        if self.plan.num_requests and rec.step == self.step:  # a request of a past sweep step counts there only
            if self.tickets.finished():  # this process's share finished: the run (or the sweep step) ends once
                gevent.spawn(self.on_trace_done, self.step)  # every share has

    #: chunks folded per slice: the longest a slice holds the loop. With the Python reader (no native
    #: build, or a TLS target) a slice delays the chunks that land meanwhile (256: ~0.5 ms); with the native
    #: reader their stamps are already taken, so slices can be 8x larger (~1 ms), which numpy folds for a
    #: quarter of the CPU per request
    FOLD_SLICE_PYTHON = 256
    FOLD_SLICE_NATIVE = 2048
    #: requests pending before a fold is worth its fixed cost (numpy's per-call overhead: folding 4
    #: requests at a time costs 66 us per request, 64 at a time 15 us; with the histograms' C recorder,
    #: _hdrnative.c, 15 and 1.9 us, 32 at a time 2.7 us), unless FOLD_EVERY_S passed
    FOLD_BATCH = 32
    FOLD_EVERY_S = 0.25

    def _fold_when_idle(self) -> None:
        """Fold finished requests into the stats in short slices, only when the event loop has nothing
        else to run: the reading greenlets (and their timestamps) always go first. Whatever is still
        pending when the stats are read (every report) is folded then."""
        last = time.monotonic()
        while True:
            gevent.idle()
            self.flush_log(wait=False)
            if gc_control.collect_if_due() >= 0:
                continue
            busy = [s for s in (self.stats, *self.step_stats.values()) if s.pending]
            if not busy or (sum(s.pending for s in busy) < self.FOLD_BATCH
                            and time.monotonic() - last < self.FOLD_EVERY_S):
                gevent.sleep(0.05)
                continue
            busy[0].fold(self.fold_slice)
            last = time.monotonic()

    def reset_metrics(self) -> None:
        """Locust's --reset-stats / the web UI's Reset: this process's LLM metrics start over, in place (the
        folder and the collector of a local run hold these objects), the instant Locust resets its table."""
        for s in (self.stats, *self.step_stats.values()):
            s.__init__()  # type: ignore[misc]
        if self.monitor is not None:
            self.monitor.take()

    def close(self) -> None:
        self.clock.stop()
        if self.folder is not None:
            self.folder.kill(block=False)
            gc_control.restore()
        if self.monitor is not None:
            self.monitor.stop()
        if self.requests is not None:
            self.requests.close()
        if self.reqlog:
            self.reqlog.close()
