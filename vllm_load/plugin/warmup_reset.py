"""The warm-up's end for Locust's own table: its numbers start over then, as the LLM metrics leave out every
request started during ``--warmup`` (Locust's table counted 48 requests where the LLM table, without the warm-up,
counted 36). Locust's table counts a request when it ends, so the requests in flight at that moment (at most one
per user in a closed loop) still count there; the LLM tables are exact."""

from __future__ import annotations

import time
from typing import Any, Callable

import gevent


def reset_after(environment: Any, start_wall: Callable[[], float], seconds: float, say: bool) -> gevent.Greenlet | None:
    """Every process resets its own table when its measured window opens, ``seconds`` after ``start_wall()`` (the
    wall time the LLM metrics count the warm-up from, read again on each wake: a swarm's epoch may move it); a
    worker's deltas after that hold only the measured part, and the master's merged table starts over then too."""
    if seconds <= 0:
        return None

    def reset() -> None:
        while (wait := start_wall() + seconds - time.time()) > 0:
            gevent.sleep(min(wait, 0.5))
        environment.runner.stats.reset_all()
        if say:
            print(f"vllm-load: warm-up over ({seconds:g} s): Locust's table starts over now; the LLM metrics leave "
                  "out every request started during it", flush=True)
    return gevent.spawn(reset)
