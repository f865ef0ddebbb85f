"""Keep Python's garbage collector from freezing the event loop mid-stream.

Measured in a load-generating process at 256 streams: with the default collector, full (gen 2)
collections paused every stream for 50-116 ms (everything Locust, transformers and the tokenizer
allocate is re-scanned each time) and gen 0/1 ones for up to 15 ms: the p99 of every timing went
with them. Here the start-up heap is frozen (never scanned again), automatic collection is off,
and the run's own garbage is collected by ``collect_if_due`` from a greenlet that only runs while
the loop is idle, with a hard bound (``collect_if_due(force=True)`` once a second) for a loop that
never idles.
"""

from __future__ import annotations

import gc

#: allocations (minus deallocations) that make a young collection due
YOUNG = 10_000
#: young collections per middle one, middle ones per full one (CPython's defaults are 10 and 10)
RATIO = 10


def freeze_startup_heap() -> None:
    """Collect once, move every surviving object out of the collector's reach, stop auto-collection."""
    gc.collect()
    gc.freeze()
    gc.disable()


def collect_if_due(force: bool = False) -> int:
    """Run the collection CPython would have run by now (the generation collected, or -1)."""
    young, middle, old = gc.get_count()
    limit = YOUNG * (20 if force else 1)  # when forced, only a real backlog is collected
    if young < limit:
        return -1
    generation = 2 if old >= RATIO else 1 if middle >= RATIO else 0
    gc.collect(generation)
    return generation


def restore() -> None:
    """The run is over: the collector runs by itself again, over the whole heap (the next run freezes its own)."""
    gc.unfreeze()
    gc.enable()
