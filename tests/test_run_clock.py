"""The run clock's offset estimate against a master whose clock is a known offset away, re-estimated during
the run: a move beyond the estimates' uncertainty moves the schedule, jitter does not, and the master's
summary says how far each worker drifted."""

from __future__ import annotations

import time

import gevent
import pytest

from vllm_load.plugin import run_clock
from vllm_load.plugin.run_clock import MasterClock, WorkerClock


class Msg:
    def __init__(self, data: dict, node_id: str = "w1") -> None:
        self.data, self.node_id = data, node_id


class Wire:
    """Both ends in one process: the worker's messages reach a MasterClock whose wall clock is ``offset``
    seconds ahead, over a link of ``delay`` seconds each way."""

    def __init__(self, worker: WorkerClock, master: MasterClock, offset: float, delay: float = 0.001) -> None:
        self.worker, self.master, self.offset, self.delay = worker, master, offset, delay

    def send_message(self, kind: str, data: dict, client_id: str | None = None) -> None:
        if kind == run_clock.PING:
            def answer() -> None:
                gevent.sleep(self.delay)
                tm = time.time() + self.offset
                gevent.sleep(self.delay)
                self.worker.on_pong({"t1": data["t1"], "tm": tm})
            gevent.spawn(answer)
        elif kind == run_clock.READY:
            self.master.on_ready(self, Msg(data))
        elif kind == run_clock.EPOCH:
            self.worker.on_epoch(data)
        elif kind == run_clock.REMEASURED:
            self.master.on_remeasured(Msg(data))


def test_the_offset_is_measured_then_followed_when_it_moves_and_not_for_jitter(monkeypatch):
    monkeypatch.setattr(run_clock, "REMEASURE_S", 0.05)
    worker, master = WorkerClock(), MasterClock()
    master.reset(1)
    wire = Wire(worker, master, offset=0.5)
    worker.keeper = gevent.spawn(worker.measure, wire)
    gevent.sleep(0.03)  # the first estimate (8 round trips of ~2 ms) and READY: the master fixes the epoch
    assert master.epoch is not None and worker.epoch.ready()
    assert abs(worker.offset - 0.5) <= worker.uncertainty + 1e-4, (worker.offset, worker.uncertainty)
    first = worker.start_perf(0.0)
    # the master's epoch (on its clock), on this process's perf clock: less the offset
    assert first == pytest.approx(time.perf_counter() + master.epoch - 0.5 - time.time(), abs=2e-3)
    gevent.sleep(0.12)  # re-estimates at the same offset: the schedule stays where it was
    assert master.ready["w1"]["remeasured"] >= 1
    assert worker.start_perf(0.0) == pytest.approx(first, abs=2e-4)
    wire.offset = 0.52  # the worker's clock fell 20 ms behind the master's
    gevent.sleep(0.15)
    worker.stop()
    assert abs(worker.offset - 0.52) <= worker.uncertainty + 1e-4
    assert worker.start_perf(0.0) == pytest.approx(first - 0.02, abs=2e-3)  # its schedules start 20 ms earlier
    clock = master.summary()["w1"]
    assert clock["drift_ms"] == pytest.approx(20.0, abs=2.0) and clock["schedule_moved_ms"] == pytest.approx(20.0, abs=2.0)
    assert clock["remeasured"] >= 2


def test_the_start_up_heartbeat_grace_holds_until_every_worker_is_ready_and_is_locusts_own_after():
    """Locust's private HEARTBEAT_LIVENESS (read at each heartbeat) is raised while the run starts and given
    back when the last worker says READY; this test fails when Locust drops or renames it."""
    import locust.runners as runners

    normal = runners.HEARTBEAT_LIVENESS
    assert isinstance(normal, int) and normal > 0

    class Client:
        heartbeat = normal

    class Runner:
        clients = type("Clients", (), {"all": [Client(), Client()]})()
        sent: list = []

        def send_message(self, kind: str, data: dict, client_id: str | None = None) -> None:
            self.sent.append(kind)

    runner, master = Runner(), MasterClock()
    master.reset(2, runner)
    try:
        assert runners.HEARTBEAT_LIVENESS == run_clock.STARTUP_LIVENESS
        assert all(c.heartbeat == run_clock.STARTUP_LIVENESS for c in runner.clients.all)
        master.on_ready(runner, Msg({"offset": 0.0, "uncertainty": 0.001}, "w1"))
        assert runners.HEARTBEAT_LIVENESS == run_clock.STARTUP_LIVENESS  # one of two: still starting
        master.on_ready(runner, Msg({"offset": 0.0, "uncertainty": 0.001}, "w2"))
        assert runners.HEARTBEAT_LIVENESS == normal and runner.sent == [run_clock.EPOCH]
        # every worker's count is Locust's again at once (a worker held right now must be missed in 3 s, not 60)
        assert all(c.heartbeat == normal for c in runner.clients.all)
    finally:
        master.grace.release()
    assert runners.HEARTBEAT_LIVENESS == normal
