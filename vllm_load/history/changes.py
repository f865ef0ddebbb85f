"""Change points in a metric's series across runs: where the runs' level moved, and by how much.

ruptures' PELT finds the candidate points (the exact optimum of a mean-shift model under a penalty: the L2 cost, run
as ``KernelCPD`` with the linear kernel, which is the same cost in ruptures' C: the same points as ``Pelt(model="l2")``
on 200 random series, 1.2 s → 0.7 ms on 500 runs), and each is
kept only when the runs on either side differ beyond their own noise: a Welch t-test between the two segments
(scipy) at ``ALPHA`` shared among the candidates (Bonferroni), and a shift of at least ``MIN_SHIFT``. The
penalty is ``PENALTY σ² log n`` (the BIC's is 2), with σ the series' noise estimated from the differences of
consecutive runs (their median absolute deviation, which a shift moves little), so that a noisy machine's series
needs a larger shift to show one. Measured on Gaussian series (benchmarks/history.py, 300 series each): 20 or 50
runs of 5 % noise without a change show one in 5 % and 4 % of series; a 15 % shift after 10 runs of 20 is found
in 98 % (at its run in 75 %, a run or two off in the rest), after 6 of 11 runs of 2 % noise at its run in 100 %, and
a 5 % shift in 2 % noise in 97 %.

Why ruptures: maintained, numpy and scipy only; MongoDB's signal-processing-algorithms (E-divisive means) pins
gevent < 25 and numpy < 2, Apache Otava numpy 2.2 and scipy < 1.17, and Locust's stack needs newer of each. PELT with
a confirming test is the detection Otava (formerly Hunter) itself runs after its E-divisive pass."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: a shift is a change only when the t-test between the segments says so at this level
ALPHA = 0.01
#: and when it is at least this large, relative to the level before (the histograms' error is 0.1 %)
MIN_SHIFT = 0.01
#: runs on each side of a change, at least (one run is no level)
MIN_SEGMENT = 3
#: the penalty per change point, in σ² log n (2 is the BIC's: it let 9 % of 20-run series without a change show one)
PENALTY = 3.0


@dataclass(frozen=True)
class Change:
    index: int  # the first run of the new level (its position in the series)
    before: float  # the mean of the segment before
    after: float  # and of the one from ``index`` on
    p_value: float

    @property
    def shift(self) -> float:
        """Relative: +0.15 is 15 % higher from ``index`` on."""
        return (self.after - self.before) / self.before if self.before else math.inf

    def to_json(self) -> dict[str, float | int]:
        return {"index": self.index, "before": self.before, "after": self.after, "shift": round(self.shift, 6),
                "p_value": self.p_value}


def noise(values: list[float]) -> float:
    """The series' run-to-run noise (a standard deviation), from consecutive differences: robust to a shift."""
    if len(values) < 3:
        return 0.0
    d = np.diff(np.asarray(values, dtype=float))
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / math.sqrt(2))


def find(values: list[float]) -> list[Change]:
    """The series' change points, confirmed; none for a series too short to have two levels."""
    n = len(values)
    if n < 2 * MIN_SEGMENT:
        return []
    import ruptures
    from scipy import stats

    x = np.asarray(values, dtype=float)
    scale = float(np.median(np.abs(x))) or 1.0
    y = x / scale  # relative: the penalty's σ and the floor are in fractions of the level
    sigma = max(noise(list(y)), 1e-3)
    ends = ruptures.KernelCPD(kernel="linear", min_size=MIN_SEGMENT).fit(y.reshape(-1, 1)).predict(
        pen=PENALTY * sigma ** 2 * math.log(n))
    bounds = [0, *(int(e) for e in ends)]  # the last is n
    alpha = ALPHA / max(1, len(bounds) - 2)
    out: list[Change] = []
    for i in range(1, len(bounds) - 1):
        left, right = x[bounds[i - 1]:bounds[i]], x[bounds[i]:bounds[i + 1]]
        before, after = float(left.mean()), float(right.mean())
        if before and abs(after - before) / abs(before) < MIN_SHIFT:
            continue
        if left.std() == 0 and right.std() == 0:
            p = 0.0 if before != after else 1.0
        else:
            p = float(stats.ttest_ind(left, right, equal_var=False).pvalue)
        if p <= alpha:
            out.append(Change(bounds[i], before, after, p))
    return out
