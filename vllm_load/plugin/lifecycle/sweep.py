"""A sweep's steps, owned in one place (the master's or local runner's collector): each step's level, its measured
window, its merged stats and its verdict. The shape (``shapes.SweepShape``) says when a step begins; the workers'
per-step deltas merge here; the run's end writes one run directory per step (``rundir/steps.py``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from vllm_load.errors import UsageError
from vllm_load.metrics.stats import LLMStats
from vllm_load.metrics.summary import RunSummary
from vllm_load.metrics.judge.verdict import Verdict, judge


def parse_levels(text: str) -> list[float]:
    """Comma-separated levels; ``LEVELxN`` repeats one N times in a row (its steps are repeats of one load: the
    sweep says their spread, metrics/judge/repeats.py)."""
    levels: list[float] = []
    try:
        for part in (x.strip().lower() for x in str(text).split(",")):
            if not part:
                continue
            level, _, times = part.partition("x")
            count = int(times) if times else 1
            if not 1 <= count <= 1000:
                raise ValueError(part)
            levels += [float(level)] * count
    except ValueError:
        levels = []
    if not levels or not all(0 < v < float("inf") for v in levels):
        raise UsageError(f"--sweep {text!r} must list positive levels, e.g. --sweep 64,128,256 (16x5: 16 five times)")
    return levels


@dataclass(frozen=True)
class SweepSpec:
    """What --sweep asks, read from the options once: the shape ticks through it, the run plan carries its kind
    and levels to the workers and the run directory."""

    kind: str  # "users": a level is a user count (closed loop); "rate": requests/s over ``users`` users
    levels: tuple[float, ...]
    users: int  # --sweep-users (rate sweeps)
    step_duration: float  # seconds per step (with --num-requests a step ends on its count instead)
    stop_on_miss: bool  # --stop-on-slo-miss

    @classmethod
    def of(cls, opts: object) -> SweepSpec | None:
        """None without --sweep; one line (UsageError) for bad levels."""
        text = getattr(opts, "sweep", "")
        if not text:
            return None
        return cls(kind=str(getattr(opts, "sweep_mode", "users")), levels=tuple(parse_levels(text)),
                   users=int(getattr(opts, "sweep_users", 1)), step_duration=float(getattr(opts, "step_duration", 0)),
                   stop_on_miss=bool(getattr(opts, "stop_on_slo_miss", False)))

    def users_at(self, level: float) -> int:
        """A step's user count: the level itself, or --sweep-users for a rate step."""
        return int(level) if self.kind == "users" else self.users


@dataclass
class Step:
    """One level of a sweep: ``start`` is after its warm-up (its requests before that are in no number); ``end``
    None while it runs; ``verdict`` once judged (once: ``Sweep.judge``)."""

    level: float
    start: float
    end: float | None = None
    stats: LLMStats = field(default_factory=LLMStats)
    verdict: Verdict | None = None

    def summary(self, percentiles: tuple[float, ...], now: float | None = None) -> RunSummary:
        return self.stats.summary(duration=max((self.end or now or time.time()) - self.start, 1e-9),
                                  percentiles=percentiles)


@dataclass
class Sweep:
    """``kind``: "users" (closed loop, a level is a user count) or "rate" (open loop, a level is req/s)."""

    kind: str
    steps: dict[int, Step] = field(default_factory=dict)
    current: int | None = None  # the step announced last
    #: step -> its LLMStats: the merged deltas of the workers (a master), or the generator's own (a local run)
    stats_source: dict = field(default_factory=dict)

    @property
    def unit(self) -> str:
        return "req/s" if self.kind == "rate" else "users"

    def begin(self, step: int, level: float, now: float, warmup: float) -> bool:
        """A step begins (the previous one ends now); False when ``step`` is the one already running."""
        if self.current == step:
            return False
        if self.current is not None and self.current in self.steps:
            self.steps[self.current].end = now
        self.steps[step] = Step(level, now + warmup, stats=self.stats_source.setdefault(step, LLMStats()))
        self.current = step
        return True

    def merge(self, step: int, delta: LLMStats) -> None:
        """A worker's (or the local generator's) requests of ``step``: merged exactly, as the run's totals."""
        self.stats_of(step).merge(delta)

    def stats_of(self, step: int) -> LLMStats:
        if step not in self.steps:  # a delta of a step this runner has not announced yet (a late report)
            self.steps[step] = Step(0.0, time.time(), stats=self.stats_source.setdefault(step, LLMStats()))
        return self.steps[step].stats

    def current_level(self) -> float | None:
        s = self.steps.get(self.current) if self.current is not None else None
        return s.level if s is not None else None

    def judge(self, step: int, slos: list, percentiles: tuple[float, ...]) -> Verdict:
        """A finished step's verdict on its SLOs (client metrics), judged once and kept with the step."""
        s = self.steps.setdefault(step, Step(0.0, 0.0))
        if s.verdict is None:
            s.verdict = judge(s.summary(percentiles), list(slos), min_requests=0, allow_untrustworthy=True)
        return s.verdict

    def reset(self) -> None:
        """Locust's --reset-stats: every step's numbers start over with the run's."""
        for s in self.steps.values():
            s.stats.__init__()  # type: ignore[misc]  (in place: a local run's generator holds the same objects)
