"""The histograms' batch recorder (``_hdrnative.c``): values into an HdrHistogram's counters, as
``Histogram.record`` would record them one by one."""

from typing import Any

def record(counts: Any, values: Any, times: Any, scale: float, lowest: int, highest: int, unit_magnitude: int,
           sub_bucket_half_count_magnitude: int, sub_bucket_mask: int, sub_bucket_half_count: int,
           /) -> tuple[int, int, int, int, int, int] | None:
    """(n, total, min, max, min_ticks, max_ticks) of what it recorded, or None for no values."""
