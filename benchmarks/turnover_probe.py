"""The built-in completions user plus a probe of the event loop, for ``turnover.py``: a greenlet asks to
wake every 1 ms and records how late it woke (a stall of the loop); every finished request's time is
kept; both are written to $TURNOVER_PROBE when the run ends."""

import json
import os
import time

import gevent
from locust import events

from vllm_load.locustfiles.completions import *  # noqa: F401,F403  the shipped user, unchanged

STALLS: list[tuple[float, float]] = []
FINISHED: list[float] = []


def probe() -> None:
    while True:
        t = time.perf_counter()
        gevent.sleep(0.001)
        late = time.perf_counter() - t - 0.001
        STALLS.append((time.time(), max(0.0, late)))


@events.request.add_listener
def _finished(**_kw) -> None:
    FINISHED.append(time.time())


@events.test_start.add_listener
def _start(**_kw) -> None:
    gevent.spawn(probe)


@events.quitting.add_listener
def _write(**_kw) -> None:
    with open(os.environ["TURNOVER_PROBE"], "w") as fh:
        json.dump({"stalls": STALLS, "finished": FINISHED}, fh)
