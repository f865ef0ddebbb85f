"""The built-in completions user plus a probe of the event loop, for ``turnover.py``: a greenlet asks to
wake every 1 ms and records how late it woke (a stall of the loop); every finished request's time and
every garbage collection (``gc.callbacks``) are kept; all are written to $TURNOVER_PROBE when the run ends."""

import gc
import json
import os
import time

import gevent
from locust import events

from vllm_load.locustfiles.completions import *  # noqa: F401,F403  the shipped user, unchanged

STALLS: list[tuple[float, float]] = []
FINISHED: list[float] = []
COLLECTIONS: list[tuple[float, int, float]] = []  # (wall time at its start, generation, seconds): gc.callbacks
_gc_start: list[float] = []


def _collection(phase: str, info: dict) -> None:
    if phase == "start":
        _gc_start[:] = [time.time(), time.perf_counter()]
    elif _gc_start:
        COLLECTIONS.append((_gc_start[0], info["generation"], time.perf_counter() - _gc_start[1]))


gc.callbacks.append(_collection)


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
        json.dump({"stalls": STALLS, "finished": FINISHED, "collections": COLLECTIONS}, fh)
