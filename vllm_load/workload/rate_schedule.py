"""--rate-schedule FILE: an open loop's total rate as a function of the run's time (a daily curve compressed, a
morning rise, a batch window), and the arrival shape in each part of it.

The file is CSV with a header, one row per point of the curve, times from the run's start:

    at,rate,between,burstiness
    0,2,linear
    60,12,step,0.5
    120,4

``at`` seconds (or 90s, 5m, 1h), the first row at 0, each after the last; ``rate`` req/s (0 pauses); ``between``
how the rate goes from this row to the next: ``step`` (holds, the default) or ``linear``; ``burstiness`` the gamma
shape of the gaps drawn in that segment (default --burstiness). The last row's rate holds until the run ends (a run
with no -t ends at the last row). Segment k runs from row k to row k+1; the report gives each its delivered rate
and latencies.

The run keeps its one arrival sequence (``workload/arrivals.py``): a unit gap drawn with the shape of the segment it
starts in, then stretched over the schedule's rate: the gap after an arrival at t is the time over which the rate's
integral from t reaches the unit gap. A segment of rate 0 is passed over (its area is 0), so arrivals resume at the
next segment's start as if the pause were not there.
"""

from __future__ import annotations

import bisect
import csv
import functools
import math
from dataclasses import dataclass
from typing import Any

from vllm_load.errors import UsageError
from vllm_load.workload.inputs.input_files import read_text
from vllm_load.workload.lengths import parse_duration

BETWEEN = ("step", "linear")
#: the gap after the last arrival a schedule that ends at rate 0 allows: never within a run (finite, for gevent)
NEVER_S = 1e9


@dataclass(frozen=True)
class Point:
    at: float  # seconds from the run's start (its epoch)
    rate: float  # req/s
    between: str = "step"  # how the rate goes from here to the next point
    burstiness: float | None = None  # gamma shape of the gaps drawn in the segment from here (None: --burstiness)


@dataclass(frozen=True)
class RateSchedule:
    points: tuple[Point, ...]

    @classmethod
    def read(cls, path: str) -> RateSchedule:
        """The schedule in ``path`` (the module's format); UsageError with the row at fault."""
        text = read_text(path, "--rate-schedule", "--rate-schedule", 64 * 1024)
        try:
            rows = [r for r in csv.reader(line for line in text.splitlines() if line.strip() and not line.startswith("#"))]
        except csv.Error as exc:
            raise UsageError(f"--rate-schedule {path}: not CSV this reader takes ({exc})") from None
        if not rows or [c.strip() for c in rows[0][:2]] != ["at", "rate"]:
            raise UsageError(f"--rate-schedule {path}: its first line must be the header at,rate[,between,burstiness]")
        header = [c.strip() for c in rows[0]]
        unknown = [c for c in header if c not in ("at", "rate", "between", "burstiness")]
        if unknown:
            raise UsageError(f"--rate-schedule {path}: unknown column {unknown[0]!r} (at, rate, between, burstiness)")
        return cls.of([_point(path, n, dict(zip(header, (c.strip() for c in row))))
                       for n, row in enumerate(rows[1:], start=2)], path)

    @classmethod
    def of(cls, points: Any, where: str = "--rate-schedule") -> RateSchedule:
        """From points (or their wire form, lists of at, rate, between, burstiness), checked."""
        pts = tuple(p if isinstance(p, Point) else Point(float(p[0]), float(p[1]), str(p[2]), p[3]) for p in points)
        if not pts:
            raise UsageError(f"{where}: no rows: give at least one (at,rate)")
        if pts[0].at != 0:
            raise UsageError(f"{where}: the first row is at {pts[0].at:g} s: the schedule starts at 0")
        for a, b in zip(pts, pts[1:]):
            if b.at <= a.at:
                raise UsageError(f"{where}: the row at {b.at:g} s does not come after the one at {a.at:g} s")
        if not any(p.rate > 0 for p in pts):
            raise UsageError(f"{where}: every rate is 0: nothing would be sent")
        return cls(pts)

    def to_wire(self) -> list:
        return [[p.at, p.rate, p.between, p.burstiness] for p in self.points]

    @property
    def end(self) -> float:
        """The last row's time: where a run with no -t ends."""
        return self.points[-1].at

    @functools.cached_property
    def _ats(self) -> list[float]:
        return [p.at for p in self.points]

    def segment_of(self, t: float) -> int:
        """The segment ``t`` (seconds from the run's start) falls in: k for [at_k, at_k+1), the last one's open."""
        return max(0, bisect.bisect_right(self._ats, t) - 1)

    def rate_at(self, t: float) -> float:
        return self._rate_in(self.segment_of(t), t)

    def burstiness_at(self, t: float, default: float) -> float:
        given = self.points[self.segment_of(t)].burstiness
        return float(given) if given is not None else default

    def area(self, a: float, b: float) -> float:
        """The arrivals asked from ``a`` to ``b`` seconds: the rate's integral."""
        total, t = 0.0, a
        while t < b:
            k = self.segment_of(t)
            stop = min(b, self.points[k + 1].at) if k + 1 < len(self.points) else b
            total += (self._rate_in(k, t) + self._rate_in(k, stop)) / 2 * (stop - t)
            t = stop
        return total

    def gap(self, t: float, _i: int, unit: float) -> float:
        """The gap after an arrival at ``t`` for a unit gap: the time over which the rate's integral reaches it."""
        start = t
        while True:
            k = self.segment_of(t)
            last = k + 1 >= len(self.points)
            r0 = self._rate_in(k, t)
            if last:
                return (t - start) + unit / r0 if r0 > 0 else NEVER_S
            stop = self.points[k + 1].at
            r1 = self._rate_in(k, stop)
            area = (r0 + r1) / 2 * (stop - t)
            if unit <= area and area > 0:
                slope = (r1 - r0) / (stop - t)
                if abs(slope) < 1e-12:
                    return (t - start) + unit / r0
                return (t - start) + (math.sqrt(max(0.0, r0 * r0 + 2 * slope * unit)) - r0) / slope
            unit -= area
            t = stop

    def _rate_in(self, k: int, t: float) -> float:
        """Segment k's rate at ``t`` (up to its end: a step's holds to it, a linear one reaches the next row's)."""
        p = self.points[k]
        if p.between == "linear" and k + 1 < len(self.points):
            q = self.points[k + 1]
            return p.rate + (q.rate - p.rate) * (t - p.at) / (q.at - p.at)
        return p.rate


def _point(path: str, line: int, row: dict[str, str]) -> Point:
    where = f"--rate-schedule {path} line {line}"
    try:
        at = parse_duration(row.get("at", ""), f"{where}: at")
        rate = float(row.get("rate", ""))
    except ValueError:
        raise UsageError(f"{where}: rate {row.get('rate', '')!r} is not a number (req/s)") from None
    between = row.get("between") or "step"
    if not rate >= 0 or math.isinf(rate):
        raise UsageError(f"{where}: rate {rate:g} must be a finite number >= 0 (req/s)")
    if between not in BETWEEN:
        raise UsageError(f"{where}: between {between!r} is not step or linear")
    shape = row.get("burstiness") or None
    try:
        burstiness = float(shape) if shape is not None else None
    except ValueError:
        raise UsageError(f"{where}: burstiness {shape!r} is not a number") from None
    if burstiness is not None and not burstiness > 0:
        raise UsageError(f"{where}: burstiness must be > 0, got {shape}")
    return Point(at, rate, between, burstiness)
