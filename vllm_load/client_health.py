"""Is the load generator itself the bottleneck? Each worker measures and reports, the master judges.

Every second a load-generating process notes its CPU use (psutil), how late a 1 s gevent timer fires
(event-loop lag: what every stream's timing suffers) and the streams it holds. With each Locust report it
ships the maxima since the last one. A run is marked untrustworthy when any worker sat at >= 90 % CPU for
two reports in a row, its loop lagged by 50 ms or more, or (open loop) requests left 50 ms or more later
than planned at p99: then the numbers describe the client, not the server.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import gevent
import psutil

from vllm_load import gc_control

CPU_LIMIT = 90.0
LAG_LIMIT = 0.050
SEND_LAG_LIMIT = 0.050


@dataclass
class ClientMonitor:
    """Runs in each load-generating process."""

    in_flight: Callable[[], int]
    sink: Callable[[dict], None] | None = None  # local runner: hand a report over every 3 s
    cpu_max: float = 0.0
    lag_max: float = 0.0
    streams_max: int = 0
    _greenlet: gevent.Greenlet | None = None

    def start(self) -> None:
        proc = psutil.Process()
        proc.cpu_percent(None)

        def loop() -> None:
            ticks = 0
            while True:
                t = time.perf_counter()
                gevent.sleep(1.0)
                self.lag_max = max(self.lag_max, time.perf_counter() - t - 1.0)
                self.cpu_max = max(self.cpu_max, proc.cpu_percent(None))
                self.streams_max = max(self.streams_max, int(self.in_flight()))
                gc_control.collect_if_due(force=True)  # a loop too busy to idle still collects
                ticks += 1
                if self.sink is not None and ticks % 3 == 0:  # the same cadence as Locust's worker reports
                    self.sink(self.take())

        self._greenlet = gevent.spawn(loop)

    def take(self) -> dict:
        out = {"cpu": self.cpu_max, "lag": self.lag_max, "streams": self.streams_max}
        self.cpu_max, self.lag_max, self.streams_max = 0.0, 0.0, 0
        return out

    def stop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill(block=False)


@dataclass
class ClientHealth:
    """Kept by the master (or the local runner): every worker's reports, and the verdict."""

    reports: dict = field(default_factory=dict)  # worker -> list of {"cpu", "lag", "streams"}

    def add(self, worker: str, report: dict) -> None:
        self.reports.setdefault(worker, []).append(report)

    def verdict(self, send_lag_p99: float | None = None) -> dict:
        reasons = []
        for worker, rows in sorted(self.reports.items()):
            hot = [r["cpu"] >= CPU_LIMIT for r in rows]
            if any(a and b for a, b in zip(hot, hot[1:])):
                reasons.append(f"{worker}: CPU at or above {CPU_LIMIT:.0f}% for two reports in a row")
            lag = max((r["lag"] for r in rows), default=0.0)
            if lag >= LAG_LIMIT:
                reasons.append(f"{worker}: event loop lagged {lag * 1000:.0f} ms")
        if send_lag_p99 is not None and send_lag_p99 >= SEND_LAG_LIMIT:
            reasons.append(f"open loop: requests left {send_lag_p99 * 1000:.0f} ms late at p99")
        all_rows = [r for rows in self.reports.values() for r in rows]
        return {
            "saturated": bool(reasons),
            "reasons": reasons,
            "cpu_max": max((r["cpu"] for r in all_rows), default=0.0),
            "loop_lag_max": max((r["lag"] for r in all_rows), default=0.0),
            "streams_max": max((r["streams"] for r in all_rows), default=0),
        }
