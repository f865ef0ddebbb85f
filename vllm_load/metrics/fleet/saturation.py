"""Over-saturation in one run: when did the server stop keeping up, and at what load?

A server that keeps up holds its queue and its time to first token level while the load grows; one that does not
lets both grow for as long as the load stays (in an open loop the queue grows without bound). So the run is
over-saturated once, over the last ``WINDOW_S`` seconds, the queue (the server's waiting requests when the sidecar
or Prometheus reads them, else the client's requests in flight) and the mean TTFT per second both rise with a
slope that is positive beyond its 95 % margin of error, and each has grown by a real amount (the queue by
``QUEUE_GROWTH`` requests and half its level, TTFT by ``TTFT_GROWTH``x). Long prompts whose TTFT is long but flat do
not stop a run: a flat TTFT has no significant slope (GuideLLM's detector had to learn that, too; its own signals
are the client's concurrency and TTFT slopes, without the server's queue).

What it reports: the server's capacity, as the completions per second since the queue left its level (a saturated
server completes at its capacity, whatever is offered: 11.5-12.0 req/s in six ramps on a 12 req/s emulator, where
the load offered at the onset read 12.2-18.1: a queue shows late under a fast ramp), when that was (the onset: the
break that best fits a level followed by a straight rise) and the load offered then.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

#: seconds of evidence a finding needs, and the least points (seconds with data) within them
WINDOW_S = 12.0
MIN_POINTS = 8
#: the slope's margin of error (t · standard error, at 95 %) must stay below this share of the slope
MAX_RELATIVE_MOE = 0.5
QUEUE_GROWTH = 4.0
TTFT_GROWTH = 1.5

#: two-sided 95 % critical values of Student's t by degrees of freedom (beyond the table: 1.96 and a little)
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t95(df: int) -> float:
    if df <= 0:
        return math.inf
    known = [d for d in _T95 if d <= df]
    return _T95[max(known)] if df <= 30 else 1.96 + 2.4 / df


def slope(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares slope of (x, y) and its 95 % margin of error (inf when it cannot be estimated)."""
    n = len(points)
    if n < 3:
        return 0.0, math.inf
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx <= 0:
        return 0.0, math.inf
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    rss = max(0.0, sum((y - my - b * (x - mx)) ** 2 for x, y in points))
    return b, t95(n - 2) * math.sqrt(rss / (n - 2) / sxx)


def rising(points: list[tuple[float, float]]) -> bool:
    b, moe = slope(points)
    return b > 0 and moe < MAX_RELATIVE_MOE * b


@dataclass(frozen=True)
class Finding:
    at_s: float  # seconds into the run when the evidence was complete
    onset_s: float  # the window's start: the queue and TTFT rise from here
    offered: float | None  # the load offered at the onset (req/s in an open loop, users in a closed one)
    offered_unit: str
    capacity_rps: float  # completions per second within the window: the server at its limit
    queue_from: float
    queue_to: float
    queue_source: str  # "server waiting" or "client in flight"
    ttft_from: float
    ttft_to: float

    @property
    def text(self) -> str:
        load = f"{self.offered:.3g} {self.offered_unit}" if self.offered is not None else "the load of the time"
        return (f"the server stopped keeping up at {self.capacity_rps:.2f} req/s (what it completed while saturated: "
                f"its capacity), {self.onset_s:.0f} s into the run with {load} offered: over {self.at_s - self.onset_s:.0f} s "
                f"its queue ({self.queue_source}) grew {self.queue_from:.0f} -> {self.queue_to:.0f} and mean TTFT "
                f"{self.ttft_from * 1000:.0f} -> {self.ttft_to * 1000:.0f} ms")

    def to_json(self) -> dict:
        return {**asdict(self), "detected": True, "text": self.text}


def _level(points: list[tuple[float, float]], at_start: bool) -> float:
    """The level at one end of a series: the mean of its first (or last) quarter, which one noisy point cannot set."""
    k = max(1, len(points) // 4)
    part = points[:k] if at_start else points[-k:]
    return sum(y for _, y in part) / len(part)


def detect(queue: list[tuple[float, float]], ttft: list[tuple[float, float]], done: list[tuple[float, float]],
           offered: list[tuple[float, float]], now: float, queue_source: str, offered_unit: str,
           window_s: float = WINDOW_S) -> Finding | None:
    """The finding over the window ending at ``now`` (seconds into the run), or None. ``queue``: (t, requests
    waiting or in flight); ``ttft``: (t, mean TTFT of the requests whose first token came in that second);
    ``done``: (t, requests finished in that second); ``offered``: (t, load level offered)."""
    start = now - window_s
    q = [p for p in queue if start <= p[0] <= now]
    f = [p for p in ttft if start <= p[0] <= now]
    if len(q) < MIN_POINTS or len(f) < MIN_POINTS or start < 0:
        return None
    q0, q1 = _level(q, True), _level(q, False)
    f0, f1 = _level(f, True), _level(f, False)
    if not (rising(q) and q1 - q0 >= max(QUEUE_GROWTH, 0.5 * q0)):
        return None
    if not (rising(f) and f1 >= TTFT_GROWTH * f0):
        return None
    onset = _onset(q)
    span = max(3.0, now - onset)  # completions per second while saturated (at least 3 s of them)
    seconds = [n for t, n in done if now - span <= t < now]
    before = [level for t, level in offered if t <= onset]
    return Finding(at_s=now, onset_s=onset, offered=before[-1] if before else (offered[0][1] if offered else None),
                   offered_unit=offered_unit, capacity_rps=sum(seconds) / len(seconds) if seconds else 0.0, queue_from=q0, queue_to=q1,
                   queue_source=queue_source, ttft_from=f0, ttft_to=f1)


def _onset(queue: list[tuple[float, float]]) -> float:
    """When the queue left its level: the break that best splits the window into a level (before) and a straight
    rise (after), by least squares over every break. A threshold crossing was set off by single samples: the
    waiting count jumps by a batch's admissions, and onsets fell from 7.6 to 15.9 req/s for a 12 req/s server."""
    best, onset = math.inf, queue[0][0]
    for k in range(2, len(queue) - 2):
        before, after = queue[:k], queue[k:]
        level = sum(y for _, y in before) / len(before)
        sse = sum((y - level) ** 2 for _, y in before)
        b, _ = slope(after)
        mx = sum(x for x, _ in after) / len(after)
        my = sum(y for _, y in after) / len(after)
        sse += sum((y - my - b * (x - mx)) ** 2 for x, y in after)
        if sse < best:
            best, onset = sse, queue[k][0]
    return onset
