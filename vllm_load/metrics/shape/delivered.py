"""Was the load asked for the load delivered? An open loop's actual sends (every process's, on the run's clock) against
the asked rate and inter-arrival distribution, with each figure's sampling interval; a closed loop's requests in
flight against its users. A run that sent something else is flagged (and is invalid with ``--strict-load``).

Last round's gamma defect (every user drew its own process: CV 0.88 where gamma(8) gives 0.35) was found only by
measuring by hand; here it is measured every run. For gaps gamma(k) with mean 1/R (vLLM's ``--burstiness k``: 1
Poisson, ``inf`` constant), n gaps give:

- the rate R' = n / span: its relative standard error is CV / sqrt(n) (a renewal process's count over its span);
- the gaps' CV = s / m, expected 1/sqrt(k): by the delta method its standard error is sqrt((k + 1) / (2 n)) / k
  (Var(s^2) = (2k^2 + 6k) / n, Var(m) = k / n, Cov = 2k / n, at scale 1).

A figure is as asked within ``Z`` standard errors, widened by a floor for what no client can deliver exactly (a
constant rate's gaps jitter by the sender's timer: 0.05 of a gap in CV, 2 % in rate), and judged only past
``MIN_GAPS`` gaps. A send's lateness is part of the delivered load, so a client that fell behind shows here too.
"""

from __future__ import annotations

import bisect
import math
from array import array
from dataclasses import dataclass
from typing import Any, Sequence

from vllm_load.workload.rate_schedule import RateSchedule

#: standard errors a figure may stray (4: a false flag in ~1 of 16,000 runs per figure)
Z = 4.0
#: floors of the bands: a constant rate's sender jitters, and a rate is read off a finite span
CV_FLOOR, RATE_FLOOR = 0.05, 0.02
#: fewer gaps than this are too few to judge (the delta method's band is loose below it, more so for k < 1)
MIN_GAPS = 100
#: sends a process keeps for this (8 bytes each: 8 MB); the first ones, the judgement then covers those
MAX_SENDS = 1_000_000
#: a closed loop's requests in flight may fall this far short of its users before it is flagged
IN_FLIGHT_SHARE = 0.9


def expected_cv(burstiness: float) -> float:
    """The inter-arrival CV of gamma(k) gaps: 1/sqrt(k); 0 for a constant rate (``inf``)."""
    return 0.0 if math.isinf(burstiness) else 1.0 / math.sqrt(burstiness)


def cv_error(burstiness: float, gaps: int) -> float:
    """The standard error of the sample CV of ``gaps`` gamma(k) gaps (see the module)."""
    if math.isinf(burstiness):
        return 0.0
    k = burstiness
    return math.sqrt((k + 1.0) / (2.0 * gaps)) / k


@dataclass(frozen=True)
class Delivered:
    """An open loop's delivered load against the asked: its gaps' count, rate and CV, each with its band."""

    gaps: int
    rate: float
    rate_asked: float
    rate_band: float
    cv: float
    cv_asked: float
    cv_band: float
    #: Kolmogorov-Smirnov of the gaps (over their own mean) against the asked gamma(k) shape: D and its p-value (None:
    #: a constant rate, or too few gaps); beside the CV, not in the verdict (at 10^5 gaps a timer's quantisation
    #: alone gives p ~ 0; D says how far the shape is)
    ks_d: float | None = None
    ks_p: float | None = None

    @property
    def judged(self) -> bool:
        return self.gaps >= MIN_GAPS

    @property
    def rate_ok(self) -> bool:
        return abs(self.rate - self.rate_asked) <= self.rate_band

    @property
    def cv_ok(self) -> bool:
        return abs(self.cv - self.cv_asked) <= self.cv_band

    @property
    def as_asked(self) -> bool | None:
        """True or False when judged, None when there were too few arrivals to judge."""
        return (self.rate_ok and self.cv_ok) if self.judged else None

    def describe(self) -> str:
        """One line: the figures, their bands, and what differs."""
        line = (f"{self.rate:.3g} req/s sent of {self.rate_asked:.3g} asked (±{self.rate_band:.2g}), inter-arrival "
                f"CV {self.cv:.2f} where the asked arrivals give {self.cv_asked:.2f} (±{self.cv_band:.2f}), "
                f"{self.gaps} gaps" + (f", KS D {self.ks_d:.3f} (p {self.ks_p:.2g}) against the asked shape"
                                       if self.ks_d is not None and self.ks_p is not None else ""))
        if not self.judged:
            return f"{line}: too few to judge (at least {MIN_GAPS})"
        wrong = [w for w, ok in (("rate", self.rate_ok), ("burstiness", self.cv_ok)) if not ok]
        return f"{line}: {'as asked' if not wrong else 'NOT as asked (' + ' and '.join(wrong) + ')'}"

    def to_json(self) -> dict[str, Any]:
        return {"gaps": self.gaps, "rate": self.rate, "rate_asked": self.rate_asked, "rate_band": self.rate_band,
                "cv": self.cv, "cv_asked": self.cv_asked, "cv_band": self.cv_band, "ks_d": self.ks_d, "ks_p": self.ks_p,
                "as_asked": self.as_asked,
                "detail": self.describe()}


def delivered(sends: Sequence[float], rate: float, burstiness: float) -> Delivered | None:
    """The delivered load of these actual send times (any order, every process's) against ``rate`` req/s of
    gamma(``burstiness``) gaps; None with fewer than 3 sends."""
    times = sorted(sends)
    n = len(times) - 1
    if n < 2 or times[-1] <= times[0]:
        return None
    span = times[-1] - times[0]
    mean = span / n
    var = sum((b - a - mean) ** 2 for a, b in zip(times, times[1:])) / (n - 1)
    cv = math.sqrt(var) / mean
    cv0 = expected_cv(burstiness)
    rate_band = rate * max(Z * cv0 / math.sqrt(n), RATE_FLOOR)
    ks_d, ks_p = shape_test([b - a for a, b in zip(times, times[1:])], burstiness)
    return Delivered(n, n / span, rate, rate_band, cv, cv0, max(Z * cv_error(burstiness, n), CV_FLOOR), ks_d, ks_p)


def shape_test(gaps: Sequence[float], burstiness: float) -> tuple[float | None, float | None]:
    """Kolmogorov-Smirnov (scipy.stats.kstest) of ``gaps`` over their mean against gamma(k) of mean 1: (D, p);
    (None, None) for a constant rate or fewer than ``MIN_GAPS`` gaps (inference-perf #633 asks for it)."""
    if math.isinf(burstiness) or len(gaps) < MIN_GAPS:
        return None, None
    from scipy import stats

    mean = sum(gaps) / len(gaps)
    if mean <= 0:
        return None, None
    found = stats.kstest([g / mean for g in gaps], stats.gamma(burstiness, scale=1.0 / burstiness).cdf)
    return float(found.statistic), float(found.pvalue)


def in_flight(requests: int, mean_e2e: float, window_s: float) -> float:
    """A closed loop's mean requests in flight over a window (Little's law: arrivals per second times the time each
    spends in flight), from the window's requests and their mean E2E."""
    return requests * mean_e2e / window_s if window_s > 0 else 0.0


def in_flight_finding(mean: float, users: int) -> dict[str, Any]:
    """The closed loop's plateau against its users: flagged below ``IN_FLIGHT_SHARE`` of them."""
    ok = mean >= IN_FLIGHT_SHARE * users
    detail = (f"{mean:.1f} requests in flight on average in the steady window, of {users} users"
              + ("" if ok else ": NOT as asked (users waited between requests: a wait_time, a slow task, or a "
                                "client that fell behind)"))
    return {"in_flight": mean, "users": users, "as_asked": ok, "detail": detail}


class Sends:
    """A process's actual send times (open loop, past the schedule's start-up), at most ``MAX_SENDS``; shipped and
    merged as the other totals are."""

    def __init__(self) -> None:
        self.times = array("d")

    def add(self, t: float) -> None:
        if len(self.times) < MAX_SENDS:
            self.times.append(t)

    def extend(self, times: Sequence[float]) -> None:
        self.times.extend(times[:max(0, MAX_SENDS - len(self.times))])


#: a rate schedule's segment is judged once its rate asks this many arrivals (fewer: too few to say)
MIN_SEGMENT_ASKED = 20


def by_segment(sends: Sequence[float], schedule: RateSchedule, until: float, burstiness: float) -> list[dict]:
    """Each segment of a rate schedule up to ``until`` (the run's end; both in seconds from the epoch): the sends in
    it (every process's) against the arrivals its rate asks (the rate's integral over it). A renewal process's count
    of N expected arrivals has a standard deviation of CV·sqrt(N) (the schedule stretches a unit-rate one), so the
    band is Z of those, floored at ``RATE_FLOOR`` of N, plus one for an arrival on the edge."""
    times = sorted(sends)
    out = []
    for k, point in enumerate(schedule.points):
        a = point.at
        b = min(until, schedule.points[k + 1].at) if k + 1 < len(schedule.points) else until
        if b <= a:
            break
        asked = schedule.area(a, b)
        sent = bisect.bisect_left(times, b) - bisect.bisect_left(times, a)
        band = max(Z * expected_cv(schedule.burstiness_at(a, burstiness)) * math.sqrt(asked), RATE_FLOOR * asked) + 1
        out.append({"segment": k, "from_s": a, "to_s": b, "asked": asked, "sent": sent,
                    "rate_asked": asked / (b - a), "rate": sent / (b - a), "rate_band": band / (b - a),
                    "as_asked": abs(sent - asked) <= band if asked >= MIN_SEGMENT_ASKED else None})
    return out


def schedule_finding(segments: list[dict]) -> dict[str, Any]:
    """The schedule's delivered load in one finding: as asked when every judged segment was (None: none judged)."""
    judged = [g for g in segments if g["as_asked"] is not None]
    wrong = [g for g in judged if not g["as_asked"]]
    as_asked = (not wrong) if judged else None
    if as_asked is None:
        detail = (f"rate schedule: {len(segments)} segments, each too short to judge (at least {MIN_SEGMENT_ASKED} "
                  "asked)")
    else:
        detail = (f"rate schedule: {len(judged)} of {len(segments)} segments judged, "
                  + ("each sent as asked" if not wrong else "NOT as asked in segment " + ", ".join(
                      f"{g['segment']} ({g['rate']:.3g} req/s sent of {g['rate_asked']:.3g})" for g in wrong)))
    return {"as_asked": as_asked, "detail": detail, "segments": segments}


def segment_lines(finding: dict) -> list[str]:
    """A rate schedule's segments, one line each: asked and sent, and what its requests took (the console's)."""
    out = []
    for g in finding.get("segments") or []:
        mark = {True: "as asked", False: "NOT as asked", None: "too few to judge"}[g["as_asked"]]
        took = (f"; {g['requests']} requests, TTFT p50 {g['ttft_p50'] * 1000:.1f} ms p99 "
                f"{g['ttft_p99'] * 1000:.1f} ms, E2E p99 {g['e2e_p99']:.2f} s" if g.get("ttft_p99") is not None else "")
        out.append(f"  segment {g['segment']} ({g['from_s']:g}-{g['to_s']:.3g} s): {g['rate']:.3g} req/s sent of "
                   f"{g['rate_asked']:.3g} asked (±{g['rate_band']:.2g}), {mark}{took}")
    return out
