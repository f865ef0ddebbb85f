"""One run clock for every load process: the instant a run's schedules (trace rows, open-loop arrivals) count
from, fixed by the master once every worker is ready, on the master's clock.

Each process used to start its own clock when its prompt pool was full: a trace split over two processes went
out 429 ms skewed, rows 1, 0, 3, 2, … (40 inversions in 80 rows), while send lag said p50 1.1 ms. Now:
1. a worker, its generator ready (pools primed), estimates its offset to the master's wall clock over Locust's
   message channel: PINGS round trips, keeping the one of least delay (offset = the master's stamp minus the
   midpoint of the worker's send and receive; uncertainty = half that round trip), then says READY;
   It re-estimates the offset every REMEASURE_S, and its schedules follow a move beyond the estimates'
   uncertainty (``clock`` in the summary says how far each worker's offset drifted);
2. once every load process of the plan is ready, the master fixes the epoch LEAD_S ahead on its clock and
   sends it (EPOCH) to all;
3. each worker turns the epoch into its own clock (minus its offset) and its schedules start there. A worker
   that was late to it sends late, and its send lag says so.
A local runner's epoch is its own start. The offsets and their uncertainty are in the summary (``clock``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import gevent
from gevent.event import AsyncResult, Event

log = logging.getLogger("vllm_load")

PING, PONG, READY, EPOCH = "vllm_load_clock_ping", "vllm_load_clock_pong", "vllm_load_ready", "vllm_load_epoch"
#: worker -> master: a re-estimate of its offset during the run
REMEASURED = "vllm_load_clock_remeasured"
PINGS = 8
#: how often a worker re-estimates its offset during a run: clocks of machines drift (tens of ppm without NTP:
#: about a millisecond a minute), and a schedule follows a move beyond the estimates' uncertainty
REMEASURE_S = 30.0
#: from the master's decision to the epoch: the EPOCH message's way to every worker (a few ms on a LAN)
LEAD_S = 0.2
#: the longest a schedule waits for its epoch before it starts on its own clock (and says so)
WAIT_S = 60.0


class WorkerClock:
    """A worker's (or local runner's) view of the run clock."""

    def __init__(self) -> None:
        self.offset = 0.0  # master clock minus this clock, seconds
        self.uncertainty = 0.0  # half the round trip of the sample kept
        self.epoch = AsyncResult()  # the epoch on the master's wall clock (a local run: its own)
        self._pongs: list[tuple[float, float, float]] = []
        self._pong = Event()
        self.keeper: Any = None  # the greenlet re-estimating the offset during the run
        self._perf_epoch: float | None = None  # the master's epoch on this process's perf clock, before the offset

    def start_local(self, wall: float, perf: float) -> None:
        """A local runner: one process, one clock; the epoch is its load's start (``wall``, ``perf`` on the
        perf_counter clock), exactly: the run's start and its schedules' count from the same instant."""
        self._perf_epoch = perf
        self.epoch.set(wall)

    def _estimate(self, runner: Any) -> tuple[float, float] | None:
        """(offset, uncertainty) from PINGS round trips: the one of least delay (None: no answer)."""
        self._pongs = []
        for _ in range(PINGS):
            self._pong.clear()
            runner.send_message(PING, {"t1": time.time()})
            if not self._pong.wait(5.0):
                break
        if not self._pongs:
            return None
        t1, tm, t2 = min(self._pongs, key=lambda p: p[2] - p[0])
        return tm - (t1 + t2) / 2, (t2 - t1) / 2

    def measure(self, runner: Any) -> None:
        """Estimate the offset, say READY, then re-estimate it every REMEASURE_S for the rest of the run (runs in
        its own greenlet)."""
        got = self._estimate(runner)
        if got is not None:
            self.offset, self.uncertainty = got
        runner.send_message(READY, {"offset": self.offset, "uncertainty": self.uncertainty})
        while True:
            gevent.sleep(REMEASURE_S)
            got = self._estimate(runner)
            if got is None:
                continue
            offset, uncertainty = got
            # the schedule moves only for a move beyond both estimates' uncertainty (not for their jitter)
            if abs(offset - self.offset) > uncertainty + self.uncertainty:
                self.offset, self.uncertainty = offset, uncertainty
            runner.send_message(REMEASURED, {"offset": offset, "uncertainty": uncertainty, "kept": self.offset})

    def on_pong(self, data: dict) -> None:
        self._pongs.append((float(data["t1"]), float(data["tm"]), time.time()))
        self._pong.set()

    def on_epoch(self, data: dict) -> None:
        self.epoch.set(float(data["epoch"]))

    def start_perf(self, fallback: float) -> float:
        """The epoch on the perf_counter clock (schedules count on it), with the offset as last estimated;
        waits for it. Without an epoch in WAIT_S (a master too old to send one), ``fallback`` (this process's own
        start), said once in the log."""
        try:
            epoch = self.epoch.get(timeout=WAIT_S)
        except gevent.Timeout:
            log.warning("vllm-load: no run epoch from the master in %.0f s: this worker's schedule starts on its "
                        "own clock", WAIT_S)
            self.epoch.set(None)
            return fallback
        if epoch is None:
            return fallback
        if self._perf_epoch is None:  # the epoch on the perf clock, read once: two clocks read at every call
            # differ by whatever preempted the process between the reads (ms on a loaded host), and an open loop
            # that follows its epoch would follow that noise
            self._perf_epoch = time.perf_counter() + (epoch - time.time())
        return self._perf_epoch - self.offset

    def stop(self) -> None:
        if self.keeper is not None:
            self.keeper.kill(block=False)


#: heartbeats (1 s each) a worker may miss while the run starts, before Locust marks it missing (its own 3 mark
#: a live worker missing at spawn on a crowded host: 32 workers starting on 2 cores were all marked missing 35 s
#: into their start-up, and Locust stopped the test before a request was sent)
STARTUP_LIVENESS = 60


class HeartbeatGrace:
    """Locust's master marks a worker missing after HEARTBEAT_LIVENESS (3) heartbeats without one, and stops the
    test once all are. A worker's start-up (its tokenizer, its prompt pools) is CPU work that a crowded host
    stretches past that; so from the run's start until every worker said READY the master allows
    STARTUP_LIVENESS, then Locust's own again. ``locust.runners.HEARTBEAT_LIVENESS`` is private: read at
    each heartbeat and each new worker (checked against Locust 2.40-2.47, setup.cfg's bounds;
    tests/test_run_clock.py fails when it goes)."""

    def __init__(self) -> None:
        self.normal: int | None = None
        self.timer: Any = None
        self.runner: Any = None

    def hold(self, runner: Any) -> None:
        import locust.runners as runners

        self.runner = runner
        if self.normal is None:
            self.normal = runners.HEARTBEAT_LIVENESS
        runners.HEARTBEAT_LIVENESS = STARTUP_LIVENESS
        for client in runner.clients.all:
            client.heartbeat = max(client.heartbeat, STARTUP_LIVENESS)
        if self.timer is not None:
            self.timer.kill(block=False)
        self.timer = gevent.spawn_later(STARTUP_LIVENESS, self.release)  # a worker never ready: not for ever

    def release(self) -> None:
        """Locust's own liveness again, for every worker at once: a worker's count left at the grace would let a
        loop held right after the start go unnoticed for a minute (each count falls to Locust's at the next
        heartbeat; a held worker sends none)."""
        import locust.runners as runners

        if self.normal is not None:
            runners.HEARTBEAT_LIVENESS, self.normal = self.normal, None
            for client in self.runner.clients.all if self.runner is not None else ():
                client.heartbeat = min(client.heartbeat, runners.HEARTBEAT_LIVENESS)
        if self.timer is not None and self.timer is not gevent.getcurrent():
            self.timer.kill(block=False)
        self.timer = None


class MasterClock:
    """The master's side: answers pings, collects READY, fixes and sends the epoch."""

    def __init__(self) -> None:
        self.ready: dict[str, dict] = {}  # worker -> its offset and uncertainty
        self.expected = 0
        self.epoch: float | None = None
        self.grace = HeartbeatGrace()

    def reset(self, expected: int, runner: Any = None) -> None:
        """A new run: ``expected`` workers to hear READY from (a master's ``runner``: they get the start-up
        heartbeat grace until then)."""
        self.ready, self.expected, self.epoch = {}, expected, None
        if runner is not None:
            self.grace.hold(runner)

    def on_ping(self, runner: Any, msg: Any) -> None:
        runner.send_message(PONG, {"t1": msg.data["t1"], "tm": time.time()}, client_id=msg.node_id)

    def on_remeasured(self, msg: Any) -> None:
        mine = self.ready.get(msg.node_id)
        if mine is not None:
            mine["last"] = float(msg.data["offset"])
            mine["kept"] = float(msg.data["kept"])
            mine["remeasured"] = mine.get("remeasured", 0) + 1

    def on_ready(self, runner: Any, msg: Any) -> None:
        self.ready[msg.node_id] = {"offset": float(msg.data["offset"]), "uncertainty": float(msg.data["uncertainty"])}
        if self.epoch is None and len(self.ready) >= self.expected:
            self.epoch = time.time() + LEAD_S
            runner.send_message(EPOCH, {"epoch": self.epoch})
            self.grace.release()
        elif self.epoch is not None:  # a worker that joins a running run starts on the run's epoch
            runner.send_message(EPOCH, {"epoch": self.epoch}, client_id=msg.node_id)

    def summary(self) -> dict:
        """``clock`` in the summary: each worker's offset to the master and its uncertainty, in ms."""
        def ms(x: float) -> float:
            return round(x * 1000, 3)
        return {w: {"offset_ms": ms(v["offset"]), "uncertainty_ms": ms(v["uncertainty"]),
                    **({"remeasured": v["remeasured"], "offset_last_ms": ms(v["last"]),
                        "drift_ms": ms(v["last"] - v["offset"]), "schedule_moved_ms": ms(v["kept"] - v["offset"])}
                       if v.get("remeasured") else {})}
                for w, v in sorted(self.ready.items())}
