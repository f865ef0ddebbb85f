"""A fault plan's ``drain``: the replicas of ``--host a,b`` that no new request goes to for now, in one load process.

A user whose own replica is drained sends to the next one that is not (in ``--host``'s order) and goes home when it
is back, as a load balancer that takes a replica out of rotation; with every replica drained, new requests wait for
one to come back. Requests in flight finish where they are. The master tells every worker (``wire.DRAIN``)."""

from __future__ import annotations

import gevent.event


class Drained:
    def __init__(self, targets: tuple[str, ...]) -> None:
        self.targets = targets  # --host's replicas, in its order
        self.out: set[str] = set()
        self.back = gevent.event.Event()  # clear while every replica is drained
        self.back.set()

    def set(self, target: str, drained: bool) -> None:
        (self.out.add if drained else self.out.discard)(target)
        if set(self.targets) <= self.out:
            self.back.clear()
        else:
            self.back.set()

    def route(self, home: str) -> str:
        """Where a request of a user at home on ``home`` goes now."""
        if home not in self.out:  # the run's whole life without a drain: one set lookup
            return home
        self.back.wait()
        targets = self.targets
        start = targets.index(home) if home in targets else 0
        for k in range(len(targets)):
            target = targets[(start + k) % len(targets)]
            if target not in self.out:
                return target
        return home
