"""The capacity search: grow the load geometrically until an SLO misses, then bisect between the last level
that met every SLO and the first that did not, down to a relative tolerance.

With growth factor 2 from ``start``, g probes reach the first miss at hi = start * 2**(g-1) with lo = hi / 2;
bisection then halves the gap each probe, and since every later hi is at least that lo, it stops within
ceil(log2((hi - lo) / (tolerance * lo))) = ceil(log2(1 / tolerance)) more probes (4 at 10 %; integers: also
when no level is left between lo and hi)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CapacitySearch:
    start: float = 1.0
    max_level: float = 1024.0
    tolerance: float = 0.10  # stop when (hi - lo) <= tolerance * hi
    integer: bool = True  # concurrency: whole users; request rate: any positive number
    factor: float = 2.0
    lo: float | None = None  # the highest level that met every SLO
    hi: float | None = None  # the lowest level that missed one
    probes: list[tuple[float, bool]] = field(default_factory=list)
    growing: bool = True

    def next_level(self) -> float | None:
        """The next level to probe, or None when the search is over."""
        if not self.probes:
            return self._round(self.start)
        if self.growing:
            if self.lo is None:  # the very first level missed: no capacity at all
                return None
            if self.hi is None:
                if self.lo >= self.max_level:
                    return None
                return self._round(min(self.max_level, self.lo * self.factor))
            self.growing = False
        assert self.lo is not None and self.hi is not None
        if self.hi - self.lo <= self.tolerance * self.hi:
            return None
        mid = self._round((self.lo + self.hi) / 2)
        if mid <= self.lo or mid >= self.hi:
            return None
        return mid

    def record(self, level: float, passed: bool) -> None:
        self.probes.append((level, passed))
        if passed:
            self.lo = level if self.lo is None else max(self.lo, level)
        else:
            self.hi = level if self.hi is None else min(self.hi, level)
            self.growing = False if self.lo is not None else self.growing

    @property
    def capacity(self) -> float | None:
        """The largest level that met every SLO (None: not even the first)."""
        return self.lo

    def _round(self, level: float) -> float:
        if self.integer:
            return float(max(1, int(level)))
        return round(level, 3)
