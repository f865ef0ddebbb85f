"""Pay one-off first-call costs at start-up, before any stream is open.

Chunks are stamped by the kernel, but a read the event loop comes to late returns every chunk that
queued meanwhile at once, with the stamp of the last: a stall longer than a token gap becomes one
long gap and some zero gaps in every open stream. Code that runs for the first time mid-run pays its
one-off costs right then, so run those paths once here. Measured before this existed: Locust's
``Runner.stop()`` logs its caller with ``inspect.stack()``, whose first call maps every loaded module
to its file (~1,250 modules with transformers: 54-81 ms, with every stream still open, before the
drain starts); the first fold of finished requests imported ``numpy.ma`` through ``np.unique``
(10-14 ms, a fraction of a second into the run).
"""

from __future__ import annotations

import inspect
import time

from vllm_load.client.record import RequestRecord
from vllm_load.metrics.stats import LLMStats


def warm_up() -> None:
    """Run the stop path's and the stats' first calls once (see above)."""
    inspect.stack()
    stats = LLMStats()  # thrown away: the run's own stats never see this record
    stats.add(RequestRecord(api="chat", start=time.time(), e2e=0.04, ok=True, ttft=0.01,
                            chunk_offsets=[0.01, 0.02, 0.03], chunk_tokens=[1, 1, 1],
                            input_tokens_asked=8, output_tokens_asked=3, input_tokens=8, output_tokens=3))
    stats.fold()
    stats.take_delta()  # a worker's report to the master
    stats.summary()
