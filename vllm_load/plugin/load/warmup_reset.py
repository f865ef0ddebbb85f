"""The warm-up's end for Locust's own table: its numbers start over then, and count a request by the LLM metrics'
rule, so that the two tables agree exactly. The LLM metrics leave out every request *started* during ``--warmup``;
Locust's table counts a request when it *ends*. A reset on a timer alone left both kinds of edge request wrong (48
against 36 requests before any reset; 287 against 288 with one, under load: a request started after the end was
answered before the reset's greenlet ran, and cleared with the warm-up). Now, on the requests this plugin reports
itself (its direct connections: every plain-HTTP target):
- the first request started after the warm-up's end resets the table before it is counted (if the timer has not);
- a request started during the warm-up and answered after the reset is not counted.
Locust's own session (https:// targets) reports its requests itself: there, the requests in flight at the reset
still count (at most one per user in a closed loop)."""

from __future__ import annotations

import time
from typing import Any, Callable

import gevent


class WarmupGate:
    """One run's warm-up end for this process's Locust table (``admit`` is asked before each request is counted)."""

    def __init__(self, environment: Any, start_wall: Callable[[], float], seconds: float, say: bool) -> None:
        self.environment, self.start_wall, self.seconds, self.say = environment, start_wall, seconds, say
        self.over = False
        self.timer = gevent.spawn(self._at_end)

    def end(self) -> float:
        """The wall time the LLM metrics count from (read again each time: a swarm's epoch may move it)."""
        return self.start_wall() + self.seconds

    def admit(self, start_wall: float) -> bool:
        """Whether Locust's table counts a request that started at ``start_wall``, now that it is answered."""
        if start_wall >= self.end():
            self.reset()
            return True
        return not self.over  # a warm-up request: counted while the warm-up lasts (the reset clears it), not after

    def reset(self) -> None:
        if self.over:
            return
        self.over = True
        self.environment.runner.stats.reset_all()
        if self.say:
            print(f"vllm-load: warm-up over ({self.seconds:g} s): Locust's table starts over now; like the LLM "
                  "metrics, it leaves out every request started during it", flush=True)

    def kill(self, block: bool = False) -> None:
        self.timer.kill(block=block)

    def _at_end(self) -> None:
        while (wait := self.end() - time.time()) > 0:
            gevent.sleep(min(wait, 0.5))
        self.reset()


def reset_after(environment: Any, start_wall: Callable[[], float], seconds: float, say: bool) -> WarmupGate | None:
    """Every process resets its own table when its measured window opens, ``seconds`` after ``start_wall()``; a
    worker's deltas after that hold only the measured part, and the master's merged table starts over then too."""
    return WarmupGate(environment, start_wall, seconds, say) if seconds > 0 else None
