"""Open-loop arrivals: when each request *should* be sent, independent of how the server keeps up.

The run has one arrival sequence, as ``vllm bench serve`` does: request 0 at the schedule's start, then each gap
gamma-distributed with shape ``burstiness`` and mean 1/rate (burstiness 1 a Poisson process, below 1 burstier,
above 1 more regular, ``inf`` constant gaps). Every load process draws the same sequence from the run's seed and
sends the arrivals i with i mod P equal to its index (as trace rows are dealt); its users take them in turn.

Splitting the rate instead (each of U users its own gamma process at R/U) gave the sum of U independent renewal
processes: Poisson-like whatever the burstiness (``--burstiness 8 -u 8``: an inter-arrival CV of 0.99 where
vLLM's gamma(8) gives 0.35), and constant-rate users in phase (``--burstiness inf -u 4`` at 4 req/s: 4 requests
at once every second).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable

from vllm_load.errors import UsageError


def unit_gap(rng: random.Random, burstiness: float) -> float:
    """One gap of a rate-1 process: gamma(shape k, scale 1/k), mean 1 (1 exactly for vLLM's ``inf``)."""
    if math.isinf(burstiness):
        return 1.0
    return rng.gammavariate(burstiness, 1.0 / burstiness)


def time_ramp_gap(strategy: str, start: float, end: float, seconds: float, t: float, unit: float) -> float:
    """The gap after an arrival at ``t`` under a rate that goes from ``start`` to ``end`` req/s over ``seconds``
    (then stays at ``end``), for a unit gap ``unit``: the time over which the rate's integral reaches ``unit``
    (a ramp from 0 sends as soon as the rate's area allows, where a gap drawn at the rate of its start never
    would)."""
    if t >= seconds or seconds <= 0:
        return unit / end
    x = t / seconds
    if strategy == "exponential":
        k = math.log(end / start)
        rate = start * math.exp(k * x)
        to_end = (end - rate) * seconds / k if abs(k) > 1e-12 else rate * (seconds - t)
    else:
        slope = (end - start) / seconds
        rate = start + slope * t
        to_end = (rate + end) / 2 * (seconds - t)
    if unit >= to_end:
        return (seconds - t) + (unit - to_end) / end
    if strategy == "exponential":
        return unit / rate if abs(k) < 1e-12 else seconds / k * math.log1p(unit * k / (rate * seconds))
    if abs(slope) < 1e-12:
        return unit / rate
    return (math.sqrt(max(0.0, rate * rate + 2 * slope * unit)) - rate) / slope


@dataclass
class ArrivalSequence:
    """The run's one arrival sequence (see the module), of which this process takes every ``processes``-th
    arrival from its ``index``; times in seconds from the schedule's start. ``gap(t, i, unit)``: the gap after
    arrival ``i`` at ``t`` for a unit gap."""

    gap: Callable[[float, int, float], float]
    burstiness: float
    seed: str
    index: int = 0
    processes: int = 1
    offset: float = 0.0  # when arrival 0 is due (a sweep step's sequence starts at the step)
    #: the gamma shape of a gap drawn at t (a --rate-schedule segment's own); None: ``burstiness`` throughout
    shape: Callable[[float], float] | None = None
    rng: random.Random = field(init=False)
    i: int = field(init=False, default=-1)  # the last arrival drawn (any process's)
    t: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        if self.burstiness <= 0:
            raise UsageError(f"--burstiness must be positive, got {self.burstiness}")
        self.rng = random.Random(self.seed)
        self.t = self.offset

    def next(self) -> float:
        """When this process's next arrival is due."""
        while True:
            if self.i >= 0:
                at = self.t - self.offset
                k = self.shape(at) if self.shape is not None else self.burstiness
                self.t += self.gap(at, self.i, unit_gap(self.rng, k))
            self.i += 1
            if self.i % self.processes == self.index % self.processes:
                return self.t


def constant_gap(rate: float) -> Callable[[float, int, float], float]:
    if not rate > 0:
        raise UsageError(f"--request-rate must be positive, got {rate}")
    return lambda _t, _i, unit: unit / rate


def index_ramp_gap(strategy: str, start: float, end: float, count: int) -> Callable[[float, int, float], float]:
    """vLLM's ramp over a request count: the gap after request i drawn at request i's rate (x = i/(N-1)); a
    request whose rate is 0 (a linear ramp from 0) takes the next request's, where vLLM's would never send again."""
    def gap(_t: float, i: int, unit: float) -> float:
        rate = ramp_rate(strategy, start, end, i / max(1, count - 1), floor=False)
        if rate <= 0:
            rate = ramp_rate(strategy, start, end, (i + 1) / max(1, count - 1), floor=False)
        return unit / rate
    return gap


RAMP_STRATEGIES = ("linear", "exponential")


def ramp_rate(strategy: str, start: float, end: float, progress: float, floor: bool = True) -> float:
    """vLLM's --ramp-up-strategy: the total rate at ``progress`` (0..1) through the run, from ``start`` to ``end``
    req/s: linear start + (end - start)·x, exponential start·(end/start)^x (vLLM's request i of N: x = i/(N-1)).
    With ``floor``, a rate of 0 (a linear ramp from 0) reads as 1 % of ``end`` (what a display or a check shows)."""
    x = min(1.0, max(0.0, progress))
    if strategy == "exponential":
        rate = start * (end / start) ** x
    else:
        rate = start + (end - start) * x
    return max(rate, 0.01 * end) if floor else rate


def ramp_users(strategy: str, start: int, end: int, progress: float) -> int:
    """The closed loop's --ramp-up-strategy: the user count at ``progress`` (0..1), from ``start`` to ``end`` users,
    with the rate ramp's curves, rounded; never below 1 (a run of 0 users would measure nothing)."""
    x = min(1.0, max(0.0, progress))
    users = start * (end / start) ** x if strategy == "exponential" else start + (end - start) * x
    return max(1, round(users))
