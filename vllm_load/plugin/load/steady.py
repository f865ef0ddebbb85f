"""The run's steady state in one load process: the requests that ran while every user was sending, apart from the
ramp's (fewer users in flight) and the drain's (users stopping one by one)."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_load.client.record import RequestRecord


@dataclass
class SteadyWindow:
    """From the moment Locust says every user is spawned (its spawning_complete, which a master passes on to its
    workers) until this process's load starts to wind down (the stop, the drain, its last --num-requests ticket
    taken). A request counts in it when it started and ended inside; in a closed loop every user then has a
    request in flight (or is between two), in an open loop the arrivals run at their one rate."""

    enabled: bool
    begin: float | None = None  # wall clock (time.time(), as a record's start)
    end: float | None = None

    def open(self, now: float) -> None:
        if self.enabled and self.begin is None:
            self.begin = now

    def close(self, now: float) -> None:
        if self.begin is not None and self.end is None:
            self.end = now

    def holds(self, rec: RequestRecord) -> bool:
        return (self.begin is not None and rec.start >= self.begin
                and (self.end is None or rec.start + rec.e2e <= self.end))
