"""Exact-enough latency histograms that merge losslessly across workers.

Locust's own stats round response times to about two significant figures. These use HdrHistogram
(3 significant figures: at most 0.1% relative error at any percentile) over integer nanoseconds,
and keep the exact count, sum, min and max beside it. Merging two of them is a bucket-wise sum, so
the master's histogram is exactly the union of the workers' histograms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from hdrh.histogram import HdrHistogram

from vllm_load.metrics.summary_parts import MetricSummary

try:  # a dozen record_many calls per fold: ~1 us each in C, ~30 us each through numpy (_hdrnative.c)
    from vllm_load.metrics._hdrnative import record as _record_native
except ImportError:  # built without a C compiler: the numpy path below
    _record_native = None

#: Range of a latency histogram, in nanoseconds: 1 ns .. 1 hour.
_LOWEST, _HIGHEST, _DIGITS = 1, 3_600_000_000_000, 3
PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)


def percentile_key(p: float) -> str:
    """A percentile's key in summaries and vLLM's JSON: p50, p99.9 (vLLM's ``p{int or float}``)."""
    return f"p{p:g}"


def parse_percentiles(text: str, flag: str = "--metric-percentiles") -> tuple[float, ...]:
    """vLLM's --metric-percentiles: a comma list, each above 0 and below 100 (the maximum is always shown)."""
    try:
        values = tuple(float(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or not all(0 < v < 100 for v in values):
        from vllm_load.errors import UsageError

        raise UsageError(f"{flag} {text!r} must list percentiles between 0 and 100, e.g. {flag} 25,50,99,99.9")
    return tuple(sorted(set(values)))
_SMALL = 12


def _new_hdr() -> HdrHistogram:
    return HdrHistogram(_LOWEST, _HIGHEST, _DIGITS)


def _release(hdr: HdrHistogram | None) -> None:
    """hdrh's histogram and its encoder point at each other: dropped, 265 KB of counters would wait
    for a full cyclic GC (the master decodes one per worker report and histogram: hundreds of MB of
    garbage between collections). Breaking the cycle frees them on the spot."""
    if hdr is not None:
        hdr.encoder = None


@dataclass
class Histogram:
    """Values in seconds (or any unit: ``scale`` maps one unit to integer ticks)."""

    scale: float = 1e9
    hdr: HdrHistogram | None = field(default_factory=_new_hdr)  # None while packed
    count: int = 0
    total: float = 0.0
    min: float = math.inf
    max: float = -math.inf
    packed: bytes | None = field(default=None, repr=False)  # HdrHistogram's compressed encoding

    def pack(self) -> None:
        """Keep only the compressed encoding (~1 KB instead of 265 KB of counters) of a histogram that
        is done filling, like the per-window ones of a long run; it unpacks itself if written again."""
        if self.hdr is not None and self.count:
            self.packed = self.hdr.encode()
            _release(self.hdr)
            self.hdr = None

    def _live(self) -> HdrHistogram:
        if self.hdr is None:
            self.hdr = self.counters()
            self.packed = None
        return self.hdr

    def counters(self) -> HdrHistogram:
        """The counters, decoded for reading when packed (without keeping them)."""
        if self.hdr is not None:
            return self.hdr
        return HdrHistogram.decode(self.packed) if self.packed else _new_hdr()

    def __del__(self) -> None:
        _release(self.hdr)

    def record(self, value: float, times: int = 1) -> None:
        ticks = int(round(value * self.scale))
        self._live().record_value(min(max(ticks, _LOWEST), _HIGHEST), times)
        self.count += times
        self.total += value * times
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value

    def record_many(self, values: Sequence[float] | np.ndarray, times: Sequence[int] | np.ndarray | None = None) -> None:
        """``record`` for a whole request's values in one vectorised step (a 512-token stream's gaps
        in ~20 us instead of ~1 ms of per-value Python on the event loop). Same buckets as ``record``:
        in C where it was built, else vectorised with numpy."""
        if _record_native is not None:
            hdr = self._live()
            got = _record_native(hdr.counts, values, times, self.scale, _LOWEST, _HIGHEST, hdr.unit_magnitude,
                                 hdr.sub_bucket_half_count_magnitude, hdr.sub_bucket_mask, hdr.sub_bucket_half_count)
            if got is not None:
                self._recorded(hdr, *got)
            return
        self._record_numpy(values, times)

    def _record_numpy(self, values: Sequence[float] | np.ndarray, times: Sequence[int] | np.ndarray | None) -> None:
        if len(values) <= _SMALL:  # numpy's fixed cost is larger than a few Python records
            if times is None:
                for x in values:
                    self.record(float(x))
            else:
                for x, k in zip(values, times):
                    self.record(float(x), int(k))
            return
        v = np.asarray(values, dtype=np.float64)
        w = np.ones(v.size, dtype=np.uint64) if times is None else np.asarray(times, dtype=np.uint64)
        ticks = np.minimum(np.maximum(np.rint(v * self.scale), _LOWEST), _HIGHEST).astype(np.int64)
        hdr = self._live()
        # HdrHistogram's counts index, as hdrh computes it per value (exact: ticks < 2**53)
        pow2ceiling = np.frexp((ticks | hdr.sub_bucket_mask).astype(np.float64))[1]
        bucket = pow2ceiling - hdr.unit_magnitude - (hdr.sub_bucket_half_count_magnitude + 1)
        sub_bucket = ticks >> (bucket + hdr.unit_magnitude)
        index = ((bucket + 1) << hdr.sub_bucket_half_count_magnitude) + sub_bucket - hdr.sub_bucket_half_count
        counts = np.ctypeslib.as_array(hdr.counts)
        if v.size < 2048:
            np.add.at(counts, index, w)
        else:  # one pass over the counts beats add.at's per-value cost for big batches
            counts += np.bincount(index, weights=w, minlength=counts.size).astype(np.uint64)
        self._recorded(hdr, int(w.sum()), float(np.dot(v, w.astype(np.float64))), float(v.min()), float(v.max()),
                       int(ticks.min()), int(ticks.max()))

    def _recorded(self, hdr: HdrHistogram, n: int, total: float, lo: float, hi: float, lo_ticks: int,
                  hi_ticks: int) -> None:
        """The totals beside the counters, once a batch's counts are in."""
        hdr.total_count += n
        hdr.min_value = min(hdr.min_value, lo_ticks)
        hdr.max_value = max(hdr.max_value, hi_ticks)
        self.count += n
        self.total += total
        if lo < self.min:
            self.min = lo
        if hi > self.max:
            self.max = hi

    def merge(self, other: Histogram) -> None:
        if other.count:
            counters = other.counters()
            self._live().add(counters)
            if counters is not other.hdr:
                _release(counters)  # a decoded temporary
            self.count += other.count
            self.total += other.total
            self.min = min(self.min, other.min)
            self.max = max(self.max, other.max)

    def percentile(self, p: float, _hdr: HdrHistogram | None = None) -> float:
        """Value at percentile ``p`` (0..100); 0.0 for an empty histogram. p100 is the exact max."""
        if not self.count:
            return 0.0
        if p >= 100.0:
            return self.max
        hdr = _hdr or self.counters()
        value = hdr.get_value_at_percentile(p) / self.scale
        if hdr is not self.hdr and hdr is not _hdr:
            _release(hdr)
        return min(max(value, self.min), self.max)

    def percentiles(self, ps: list[float]) -> list[float]:
        """``percentile`` at each of ``ps`` (0..100), in one walk over the buckets (a chart's hundred points)."""
        if not self.count:
            return [0.0] * len(ps)
        hdr = self.counters()
        values = hdr.get_percentile_to_value_dict([p for p in ps if p < 100.0])
        if hdr is not self.hdr:
            _release(hdr)
        return [self.max if p >= 100.0 else min(max(values[p] / self.scale, self.min), self.max) for p in ps]

    def at_most_1ns(self) -> int:
        """How many values were 0 (or 1 ns: one bucket at this range): for chunk gaps, chunks under one stamp."""
        return self.counters().get_count_at_value(1) if self.count else 0

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def summary(self, percentiles: tuple[float, ...] = PERCENTILES) -> MetricSummary:
        out = MetricSummary({"count": self.count, "mean": self.mean, "min": self.min if self.count else 0.0})
        hdr = self.counters() if self.count else None
        out["std"] = hdr.get_stddev() / self.scale if hdr is not None else 0.0
        for p in percentiles:
            out[percentile_key(p)] = self.percentile(p, hdr)
        out["max"] = self.max if self.count else 0.0
        return out

    def to_wire(self) -> dict:
        """A msgpack/JSON-safe form (HdrHistogram's compressed base64 encoding)."""
        return {
            "scale": self.scale,
            "hdr": (self.packed or self.counters().encode()).decode("ascii") if self.count else "",
            "count": self.count,
            "total": self.total,
            "min": self.min if self.count else None,
            "max": self.max if self.count else None,
        }

    @classmethod
    def from_wire(cls, data: dict) -> Histogram:
        """Stays packed (no 265 KB decode) until something writes into it or merges it."""
        h = cls(scale=float(data["scale"]))
        if data["count"]:
            h.hdr = None
            h.packed = data["hdr"].encode("ascii")
            h.count = int(data["count"])
            h.total = float(data["total"])
            h.min = float(data["min"])
            h.max = float(data["max"])
        return h
