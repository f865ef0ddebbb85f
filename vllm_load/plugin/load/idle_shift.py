"""--system-idle-cap S: a replay's idle time capped system-wide, as AgentX's rules ask (AIPerf's
``system_idle_gap_cap_seconds``: "pending request timers shift uniformly only when no request is active"). While no
request of this process is in flight and the earliest pending turn is due more than S seconds from now, every
pending turn's due time moves earlier by the same amount, so the next comes S seconds after the system went idle and
the recorded spacing between the pending turns is kept.

Why not a per-turn cap (--max-idle): the rules forbid it, because "independently clamping parent and subagent delays
can distort their relative timing"; a shift of every pending timer at once keeps it.

What is idle is this load process's own requests (a swarm's other processes are not seen: each shifts its own)."""

from __future__ import annotations

import math
import time
from typing import Any

import gevent
import gevent.event

from vllm_load.client.record import RequestRecord


class Pending:
    """A session's next turn, pending from the moment its predecessor ended: ``at`` is its due wall-clock time, -inf
    until it is known (a turn waiting on its subagents, or being built, is imminent: it blocks a shift)."""

    __slots__ = ("at",)

    def __init__(self, at: float = -math.inf) -> None:
        self.at = at


class IdleShift:
    """The pending turns of one process and the shifts made to them (a generator's watch: each finished request is
    told to it, and the last one in flight may leave the system idle)."""

    def __init__(self, cap_s: float, in_flight: Any) -> None:
        self.cap_s = cap_s
        self.in_flight = in_flight  # () -> this process's requests in flight
        self._pending: dict[int, Pending] = {}
        self._moved = gevent.event.Event()
        self.shifts = 0  # how often the pending timers were moved, and by how much in all
        self.shifted_s = 0.0

    def timer(self, at: float = -math.inf) -> Pending:
        """A turn pending from now, due at ``at`` (set later when not yet known)."""
        pending = Pending(at)
        self._pending[id(pending)] = pending
        return pending

    def cancel(self, pending: Pending) -> None:
        """A pending turn that will not be sent (its share is replayed, the run ends)."""
        self._pending.pop(id(pending), None)

    def wait(self, pending: Pending) -> float:
        """Block until the turn's due time (as shifted meanwhile) and return it: its intended start."""
        try:
            self.shift_if_idle()
            while True:
                delay = pending.at - time.time()
                if delay <= 0:
                    return pending.at
                self._moved.wait(timeout=delay)
        finally:
            self.cancel(pending)

    def add(self, rec: RequestRecord) -> None:
        """A request ended: the system may be idle now. Its sender holds its next turn's ``Pending`` already (taken
        before its send returned), so the check, once the loop gets to it, sees every turn still to come."""
        gevent.spawn(self.shift_if_idle)

    def shift_if_idle(self) -> None:
        """While no request is in flight: every pending turn earlier by one amount, the first due ``cap_s`` from
        now."""
        if self.in_flight() > 0 or not self._pending:
            return
        gap = min(p.at for p in self._pending.values()) - time.time() - self.cap_s
        if not 0 < gap < math.inf:  # a turn is imminent, or every one waits on another's end
            return
        for pending in self._pending.values():
            pending.at -= gap
        self.shifts += 1
        self.shifted_s += gap
        moved, self._moved = self._moved, gevent.event.Event()
        moved.set()  # every waiter reads its new due time
