"""--num-requests in one load process: its share of the run's (or a sweep step's) N requests, as tickets. A request
takes one before it starts and waits for one to come back once they are all taken; a warm-up or unsent request gives
its ticket back; the share is done once that many counted requests finished. With a floor (--min-duration, or a
scenario's by concurrency region) a share taken whole before the floor's end is taken once more, and again: the
point ends on whole passes of its requests once it has lasted the floor, as MLPerf Endpoints' points do (§6.2, §6.4)."""

from __future__ import annotations

import time
from typing import Any

import gevent.event


class Tickets:
    def __init__(self, share: int) -> None:
        self.share = share
        self.passes = 1
        self.floor_until = 0.0  # wall time before which a share taken whole is taken again (0: no floor)
        self.held = 0  # tickets held by requests started (a warm-up request's comes back)
        self.counted = 0  # counted requests finished, in the current step
        self.said = False  # the step's share was said done (once)
        self.back: Any = gevent.event.Event()

    @property
    def quota(self) -> int:
        return self.share * self.passes

    def restart(self, floor_s: float = 0.0, now: float | None = None) -> None:
        """A new sweep step (or the run's start): its share starts over, its floor counts from now."""
        self.counted = self.held = 0
        self.passes, self.said = 1, False
        self.floor_until = ((now if now is not None else time.time()) + floor_s) if floor_s > 0 else 0.0
        self.give_back(held=False)  # users that waited for a ticket of the last step take this one's

    def take(self) -> bool:
        """One ticket, if one is free: the share's next, or the next pass's while the floor lasts."""
        if self.held >= self.quota:
            if not (self.floor_until and time.time() < self.floor_until):
                return False
            self.passes += 1  # the floor has not passed: another whole pass
        self.held += 1
        return True

    def last_taken(self) -> bool:
        """The share's last ticket is taken and no pass follows: the users stop one by one from here."""
        return self.held == self.quota and not (self.floor_until and time.time() < self.floor_until)

    def give_back(self, held: bool = True) -> None:
        if held:
            self.held -= 1
        self.back, back = gevent.event.Event(), self.back
        back.set()

    def finished(self) -> bool:
        """A counted request finished: is the share (every pass of it) done now? True once a step."""
        self.counted += 1
        return self.finished_share()

    def finished_share(self) -> bool:
        """Every ticket of the last pass finished, and no pass follows: True once a step (the floor may pass after the
        last request finished, while the users wait for a ticket: they ask then)."""
        if self.said or self.counted != self.quota or not self.last_taken():
            return False
        self.said = True
        return True
