"""The built-in completions user plus a probe of the event loop, for ``turnover.py``: a greenlet asks to
wake every 1 ms and records how late it woke (a stall of the loop); every finished request's time and
every garbage collection (``gc.callbacks``) are kept; all are written to $TURNOVER_PROBE when the run ends.
The probe's own series are arrays, not lists: a list of 37,000 finish times (15 s at 2,500 requests/s) is one
container the collector walks element by element at every full collection: with lists, full collections
in the probed process took 1.97-3.20 ms, with arrays 1.76-2.60 ms (6 samples each)."""

import array
import gc
import json
import os
import time

import gevent
from locust import events

from vllm_load.locustfiles.completions import *  # noqa: F401,F403  the shipped user, unchanged

STALL_AT = array.array("d")  # wall time of each probe wake
STALL_LATE = array.array("d")  # how late it woke (seconds)
#: with $TURNOVER_ATTRIBUTE set, each wake over 1.5 ms late: (CLOCK_MONOTONIC at the wake, which
#: ``perf sched record -k CLOCK_MONOTONIC`` shares; how late; the loop thread's own CPU meanwhile)
BIG: list[tuple[float, float, float]] = []
ATTRIBUTE = bool(os.environ.get("TURNOVER_ATTRIBUTE"))
FINISHED = array.array("d")
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
        cpu = time.thread_time() if ATTRIBUTE else 0.0  # a syscall per wake: only when asked
        gevent.sleep(0.001)
        late = time.perf_counter() - t - 0.001
        STALL_AT.append(time.time())
        STALL_LATE.append(max(0.0, late))
        if ATTRIBUTE and late > 0.0015:
            BIG.append((time.monotonic(), late, time.thread_time() - cpu))


@events.request.add_listener
def _finished(**_kw) -> None:
    FINISHED.append(time.time())


@events.test_start.add_listener
def _start(**_kw) -> None:
    gevent.spawn(probe)


@events.quitting.add_listener
def _write(**_kw) -> None:
    with open(os.environ["TURNOVER_PROBE"], "w") as fh:
        json.dump({"stalls": list(zip(STALL_AT, STALL_LATE)), "finished": FINISHED.tolist(),
                   "collections": COLLECTIONS, "big": BIG}, fh)
