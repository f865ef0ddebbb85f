"""Open-loop arrivals: when each request *should* be sent, independent of how the server keeps up.

Inter-arrival times are gamma-distributed with shape ``burstiness`` and mean 1/rate, as in
``vllm bench serve`` (burstiness 1 is a Poisson process; below 1 burstier, above 1 more regular).
The total rate R is split over every user of the run (so over every worker): each of U users runs its
own process at R/U, and independent processes add up to rate R.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from vllm_load.errors import UsageError


@dataclass
class ArrivalProcess:
    rate: float  # requests/s of this process
    burstiness: float = 1.0
    rng: random.Random = random.Random(0)
    ramp_up: float = 0.0  # seconds over which the rate grows linearly from 1 % to ``rate``

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise UsageError(f"--request-rate must be positive, got {self.rate}")
        if self.burstiness <= 0:
            raise UsageError(f"--burstiness must be positive, got {self.burstiness}")

    def rate_at(self, elapsed: float) -> float:
        if self.ramp_up <= 0 or elapsed >= self.ramp_up:
            return self.rate
        return self.rate * max(0.01, elapsed / self.ramp_up)

    def next_gap(self, elapsed: float = float("inf")) -> float:
        """The gap after an arrival at ``elapsed`` seconds into the run (the rate of that moment)."""
        rate = self.rate_at(elapsed)
        if math.isinf(self.burstiness):  # vLLM's meaning: the gamma's limit, a constant rate
            return 1.0 / rate
        theta = 1.0 / (rate * self.burstiness)
        return self.rng.gammavariate(self.burstiness, theta)


RAMP_STRATEGIES = ("linear", "exponential")


def ramp_rate(strategy: str, start: float, end: float, progress: float) -> float:
    """vLLM's --ramp-up-strategy: the total rate at ``progress`` (0..1) through the run, from ``start`` to ``end``
    req/s: linear start + (end - start)·x, exponential start·(end/start)^x (vLLM's request i of N: x = i/(N-1)). A
    rate of 0 (a linear ramp from 0) is 1 % of ``end``: a process at rate 0 would never send its next request."""
    x = min(1.0, max(0.0, progress))
    if strategy == "exponential":
        rate = start * (end / start) ** x
    else:
        rate = start + (end - start) * x
    return max(rate, 0.01 * end)


def ramp_users(strategy: str, start: int, end: int, progress: float) -> int:
    """The closed loop's --ramp-up-strategy: the user count at ``progress`` (0..1), from ``start`` to ``end`` users,
    with the rate ramp's curves, rounded; never below 1 (a run of 0 users would measure nothing)."""
    x = min(1.0, max(0.0, progress))
    users = start * (end / start) ** x if strategy == "exponential" else start + (end - start) * x
    return max(1, round(users))
