"""The client's own evidence, measured in each load-generating process (``metrics/judge/client_health`` judges it):
every second its CPU use (psutil), how late a 1 s gevent timer fires (event-loop lag), the streams it holds, how
long its loop thread sat runnable waiting for a CPU (``/proc/self/schedstat``), the host's steal time and the
reader's late reads; shipped with each Locust report as the maxima since the last."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import gevent
import psutil

from vllm_load.client import native, reader_choice


def _run_delay() -> float:
    """Seconds the main (event-loop) thread has spent runnable but waiting for a CPU, since it began."""
    try:
        with open("/proc/self/schedstat", "rb") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):  # not Linux, or no schedstat
        return 0.0


@dataclass
class ClientMonitor:
    """Runs in each load-generating process."""

    in_flight: Callable[[], int]
    sink: Callable[[dict], None] | None = None  # local runner: hand a report over every 3 s
    tick: Callable[[], None] = lambda: None  # each second's chore of the process (its garbage collection)
    cpu_max: float = 0.0
    lag_max: float = 0.0
    streams_max: int = 0
    wait_max: float = 0.0  # largest run-queue wait of the loop thread in one second
    steal_max: float = 0.0
    cpu_at_lag: float = 0.0  # own CPU in the second of the largest lag
    wait_at_lag: float = 0.0  # the loop thread's wait for a CPU in that second
    read_lag_max: float = 0.0  # the reader's latest read after a segment landed (native or Python)
    reads: int = 0
    late_reads: int = 0  # reads more than 1 ms after landing
    _greenlet: gevent.Greenlet | None = None

    def start(self) -> None:
        proc = psutil.Process()
        proc.cpu_percent(None)
        psutil.cpu_times_percent(None)

        def loop() -> None:
            ticks = 0
            waited = _run_delay()
            while True:
                t = time.perf_counter()
                gevent.sleep(1.0)
                lag = time.perf_counter() - t - 1.0
                cpu = proc.cpu_percent(None)
                now_waited = _run_delay()
                wait, waited = now_waited - waited, now_waited
                if lag >= self.lag_max:
                    self.lag_max, self.cpu_at_lag, self.wait_at_lag = lag, cpu, wait
                self.cpu_max = max(self.cpu_max, cpu)
                self.wait_max = max(self.wait_max, wait)
                self.steal_max = max(self.steal_max, float(getattr(psutil.cpu_times_percent(None), "steal", 0.0)))
                self.streams_max = max(self.streams_max, int(self.in_flight()))
                self._take_reads()
                self.tick()
                ticks += 1
                if self.sink is not None and ticks % 3 == 0:  # the same cadence as Locust's worker reports
                    self.sink(self.take())

        self._greenlet = gevent.spawn(loop)

    def _take_reads(self) -> None:
        read_lag, reads, late = native.take_lag()
        self.read_lag_max = max(self.read_lag_max, read_lag)
        self.reads += reads
        self.late_reads += late

    def take(self) -> dict:
        self._take_reads()  # up to now, not only to the last tick
        used = reader_choice.take_used()  # what read this interval's answers (none read: the process's choice)
        out = {"t": time.time(), "reader": reader_choice.reader_name(), "readers": used or [reader_choice.reader_name()],
               "read_lag": self.read_lag_max,
               "reads": self.reads, "late_reads": self.late_reads, "cpu": self.cpu_max, "lag": self.lag_max,
               "streams": self.streams_max, "in_flight": int(self.in_flight()), "wait": self.wait_max,
               "steal": self.steal_max, "cpu_at_lag": self.cpu_at_lag, "wait_at_lag": self.wait_at_lag}
        self.cpu_max = self.lag_max = self.wait_max = self.steal_max = self.cpu_at_lag = self.wait_at_lag = 0.0
        self.streams_max = self.reads = self.late_reads = 0
        self.read_lag_max = 0.0
        return out

    def stop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill(block=False)
