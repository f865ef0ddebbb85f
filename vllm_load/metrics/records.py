"""Reading the request logs' records after a run (``requests.jsonl``): which were measured, and an exact
nearest-rank percentile of their values. The verdicts that judge records one by one (the disruption, the protected
class, the tail's breakdown) read them the same way."""

from __future__ import annotations

import math


def measured(r: dict) -> bool:
    """The record counts in the run's numbers: not the warm-up's, not cut by a shape's removal, not abandoned."""
    return not (r.get("warmup") or r.get("removed") or r.get("abandoned"))


def nearest_rank(values: list[float], q: float) -> float:
    """The q-th percentile of ``values`` (sorted, not empty), nearest rank: one of the values, never interpolated."""
    return values[max(0, math.ceil(q / 100.0 * len(values)) - 1)]
