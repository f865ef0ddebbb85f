"""Exact-enough latency histograms that merge losslessly across workers.

Locust's own stats round response times to about two significant figures. These use HdrHistogram
(3 significant figures: at most 0.1% relative error at any percentile) over integer nanoseconds,
and keep the exact count, sum, min and max beside it. Merging two of them is a bucket-wise sum, so
the master's histogram is exactly the union of the workers' histograms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hdrh.histogram import HdrHistogram

#: Range of a latency histogram, in nanoseconds: 1 ns .. 1 hour.
_LOWEST, _HIGHEST, _DIGITS = 1, 3_600_000_000_000, 3
PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)


def _new_hdr() -> HdrHistogram:
    return HdrHistogram(_LOWEST, _HIGHEST, _DIGITS)


@dataclass
class Histogram:
    """Values in seconds (or any unit: ``scale`` maps one unit to integer ticks)."""

    scale: float = 1e9
    hdr: HdrHistogram = field(default_factory=_new_hdr)
    count: int = 0
    total: float = 0.0
    min: float = math.inf
    max: float = -math.inf

    def record(self, value: float, times: int = 1) -> None:
        ticks = int(round(value * self.scale))
        self.hdr.record_value(min(max(ticks, _LOWEST), _HIGHEST), times)
        self.count += times
        self.total += value * times
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value

    def merge(self, other: Histogram) -> None:
        if other.count:
            self.hdr.add(other.hdr)
            self.count += other.count
            self.total += other.total
            self.min = min(self.min, other.min)
            self.max = max(self.max, other.max)

    def percentile(self, p: float) -> float:
        """Value at percentile ``p`` (0..100); 0.0 for an empty histogram. p100 is the exact max."""
        if not self.count:
            return 0.0
        if p >= 100.0:
            return self.max
        value = self.hdr.get_value_at_percentile(p) / self.scale
        return min(max(value, self.min), self.max)

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def summary(self) -> dict[str, float]:
        out = {"count": self.count, "mean": self.mean, "min": self.min if self.count else 0.0}
        for p in PERCENTILES:
            out[f"p{p:g}"] = self.percentile(p)
        out["max"] = self.max if self.count else 0.0
        return out

    def to_wire(self) -> dict:
        """A msgpack/JSON-safe form (HdrHistogram's compressed base64 encoding)."""
        return {
            "scale": self.scale,
            "hdr": self.hdr.encode().decode("ascii") if self.count else "",
            "count": self.count,
            "total": self.total,
            "min": self.min if self.count else None,
            "max": self.max if self.count else None,
        }

    @classmethod
    def from_wire(cls, data: dict) -> Histogram:
        h = cls(scale=float(data["scale"]))
        if data["count"]:
            h.hdr.add(HdrHistogram.decode(data["hdr"].encode("ascii")))
            h.count = int(data["count"])
            h.total = float(data["total"])
            h.min = float(data["min"])
            h.max = float(data["max"])
        return h
