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


class _Layout:
    """Each counter's value range, as hdrh computes it per index (lowest, highest and median equivalent value),
    for every counter at once: hdrh's own percentile and stddev walks are Python loops over 33,792 counters (90 ms
    for one histogram's summary; the web UI's poll read dozens, 2.5-3.1 s with the load's loop blocked), these are
    numpy passes (~0.1 ms). Every histogram here has one layout (_LOWEST, _HIGHEST, _DIGITS): computed once."""

    _cache: dict[tuple[int, int, int], "_Layout"] = {}

    def __init__(self, hdr: HdrHistogram) -> None:
        m, u = hdr.sub_bucket_half_count_magnitude, hdr.unit_magnitude
        index = np.arange(hdr.counts_len, dtype=np.int64)
        bucket = (index >> m) - 1
        sub = (index & (hdr.sub_bucket_half_count - 1)) + hdr.sub_bucket_half_count
        sub = np.where(bucket < 0, sub - hdr.sub_bucket_half_count, sub)
        bucket = np.maximum(bucket, 0)
        self.lowest = sub << (bucket + u)
        size = np.int64(1) << (bucket + u)  # the equivalent range's size (a sub-bucket index never overflows here)
        self.highest = self.lowest + size - 1
        self.median = (self.lowest + (size >> 1)).astype(np.float64)

    @classmethod
    def of(cls, hdr: HdrHistogram) -> "_Layout":
        key = (hdr.counts_len, hdr.unit_magnitude, hdr.sub_bucket_half_count_magnitude)
        layout = cls._cache.get(key)
        if layout is None:
            layout = cls._cache[key] = cls(hdr)
        return layout


def _counts(hdr: HdrHistogram) -> np.ndarray:
    """The counters as an array, without a copy (a decoded payload may hold fewer than the layout: hdrh reads 0)."""
    return np.ctypeslib.as_array(hdr.counts)[:min(hdr.counts_len, hdr.encoder.payload.counts_len)]


def _held(hdr: HdrHistogram) -> tuple[np.ndarray, np.ndarray]:
    """The counters that hold values (hundreds of the 33,792): their indices and counts."""
    counts = _counts(hdr)
    index = np.flatnonzero(counts)
    return index, counts[index]


Held = tuple[np.ndarray, np.ndarray]


def hdr_percentiles(hdr: HdrHistogram, ps: Sequence[float], held: Held | None = None) -> list[int]:
    """hdrh's ``get_value_at_percentile`` at each of ``ps``, in ticks (the same values: its target count, the first
    counter whose running total reaches it, that counter's highest equivalent value, its lowest for p0)."""
    if not hdr.total_count:
        return [0] * len(ps)
    index, counts = held if held is not None else _held(hdr)
    layout = _Layout.of(hdr)
    running = np.cumsum(counts, dtype=np.uint64)  # over the counters that hold values: the empty ones add nothing
    targets = np.array([max(int(min(p, 100.0) * hdr.total_count / 100 + 0.5), 1) for p in ps], dtype=np.uint64)
    found = np.searchsorted(running, targets, side="left")
    return [0 if k >= index.size else int(layout.highest[index[k]] if p else layout.lowest[index[k]])
            for p, k in zip(ps, found.tolist())]


def hdr_stddev(hdr: HdrHistogram, held: Held | None = None) -> float:
    """hdrh's ``get_stddev`` (over each counter's median equivalent value, around their mean) in one pass."""
    if not hdr.total_count:
        return 0.0
    index, counts = held if held is not None else _held(hdr)
    weights, median = counts.astype(np.float64), _Layout.of(hdr).median[index]
    total = float(hdr.total_count)
    # sums, not np.dot: BLAS's threads took 3-5 ms a call beside a busy loop (its hand-offs), a sum takes microseconds
    mean = float((weights * median).sum()) / total
    dev = median - mean
    return math.sqrt(float((weights * dev * dev).sum()) / total)


def hdr_recorded(hdr: HdrHistogram) -> tuple[np.ndarray, np.ndarray]:
    """The counters that hold values: each one's highest equivalent value (in ticks, as hdrh's recorded iterator
    reports ``value_iterated_to``) and its count."""
    index, counts = _held(hdr)
    return _Layout.of(hdr).highest[index], counts


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

    def percentile(self, p: float) -> float:
        """Value at percentile ``p`` (0..100); 0.0 for an empty histogram. p100 is the exact max."""
        return self.percentiles([p])[0]

    def percentiles(self, ps: list[float]) -> list[float]:
        """``percentile`` at each of ``ps`` (0..100), in one walk over the buckets (a chart's hundred points)."""
        if not self.count:
            return [0.0] * len(ps)
        hdr = self.counters()
        values = self._at(hdr, ps)
        if hdr is not self.hdr:
            _release(hdr)
        return values

    def _at(self, hdr: HdrHistogram, ps: Sequence[float], held: Held | None = None) -> list[float]:
        """The percentiles of a non-empty histogram from its counters, within its exact min and max (p100: the max)."""
        return [self.max if p >= 100.0 else min(max(v / self.scale, self.min), self.max)
                for p, v in zip(ps, hdr_percentiles(hdr, ps, held))]

    def recorded(self) -> tuple[np.ndarray, np.ndarray]:
        """The values held (each counter's highest equivalent value, in this histogram's unit) and their counts."""
        if not self.count:
            return np.zeros(0), np.zeros(0, dtype=np.uint64)
        hdr = self.counters()
        ticks, counts = hdr_recorded(hdr)
        counts = counts.copy()  # a view of counters a decoded temporary owns
        if hdr is not self.hdr:
            _release(hdr)
        return ticks / self.scale, counts

    def at_most_1ns(self) -> int:
        """How many values were 0 (or 1 ns: one bucket at this range): for chunk gaps, chunks under one stamp."""
        return self.counters().get_count_at_value(1) if self.count else 0

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def summary(self, percentiles: tuple[float, ...] = PERCENTILES) -> MetricSummary:
        out = MetricSummary({"count": self.count, "mean": self.mean, "min": self.min if self.count else 0.0})
        hdr = self.counters() if self.count else None
        held = _held(hdr) if hdr is not None else None
        out["std"] = hdr_stddev(hdr, held) / self.scale if hdr is not None else 0.0
        values = self._at(hdr, percentiles, held) if hdr is not None else [0.0] * len(percentiles)
        for p, v in zip(percentiles, values):
            out[percentile_key(p)] = v
        if hdr is not None and hdr is not self.hdr:
            _release(hdr)
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
