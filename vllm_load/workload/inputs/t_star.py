"""AgentX's t*: the instant of a recorded trace from which a lane measures it, drawn as AIPerf draws it.

AIPerf (``rust/runtime/src/graph/tstar.rs``, byte-exact with its ``graph_ir_source.py:_sample_t_star`` and
``_seed_for_trace_lane``): t* is uniform over ``[min, max] × the trace's duration`` (its latest call's recorded
time, subagents' included), from NumPy's ``default_rng`` seeded by SHA-256 of ``"{seed}:{trace_id}:{lane}"`` (its
first 8 bytes, big-endian); a trace without a duration, or a window of no width, gives its lower end without a draw.
The calls recorded before t* are the warm-up prefix, the rest are measured (``start``). AIPerf's runner salts lane 0 today
("a lane-0 baseline"), and so does this. Sessions without recorded times (a sessions JSONL, synthetic ones) are
split by their turns' share instead, drawn per session id: the same start every run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random
from dataclasses import dataclass

import numpy as np

from vllm_load.workload.inputs.sessions import Fork, Session, Step, Turn


def seed_for_trace_lane(base_seed: int, trace_id: str, lane: int = 0) -> int:
    """AIPerf's per-(trace, lane) seed: SHA-256 of ``"{base_seed}:{trace_id}:{lane}"``, its low 8 bytes big-endian."""
    return int.from_bytes(hashlib.sha256(f"{base_seed}:{trace_id}:{lane}".encode()).digest()[:8], "big")


def sample_t_star(lo_ratio: float, hi_ratio: float, seed: int, trace_id: str, duration_us: float,
                  lane: int = 0) -> float:
    """t* in microseconds of the trace's clock (AIPerf's WindowTStarSampler)."""
    if duration_us <= 0.0:
        return 0.0
    lo, hi = lo_ratio * duration_us, hi_ratio * duration_us
    if hi <= lo:
        return max(lo, 0.0)
    return max(float(np.random.default_rng(seed_for_trace_lane(seed, trace_id, lane)).uniform(lo, hi)), 0.0)


def _us(turn: Turn) -> float:
    """A call's recorded time in microseconds (AIPerf's arrival_offset_us)."""
    return round((turn.at or 0.0) * 1e6)


def recorded_times(session: Session) -> list[float] | None:
    """Every call's recorded time in microseconds, its subagents' included; None when a call has none."""
    out: list[float] = []
    for step in session.steps:
        if isinstance(step, Fork):
            inner = recorded_times(step.session)
            if inner is None:
                return None
            out += inner
        elif step.at is None:
            return None
        else:
            out.append(_us(step))
    return out


@dataclass(frozen=True)
class Start:
    """A session cut at t*: the warm-ups to send first (each chain's id and its boundary turn), what is measured,
    and t* in seconds of the trace's clock (None: cut by the turns' share)."""

    warm: tuple[tuple[str, Turn], ...]
    rest: Session
    at: float | None


def start(session: Session, ratios: tuple[float, float], seed: int) -> Start:
    """The session from t*, as AIPerf's snapshot cuts a trace (rust/runtime/src/graph/snapshot.rs): every chain (the
    root and each subagent: one conversation each) live at t*, with calls before it and at or after it, is warmed
    with its last call before t* (its prompt holds the chain's history so far); a chain wholly before t* is not sent;
    a chain's first call kept after a dropped one is due ``its t - t*`` after the start (AIPerf re-roots it there),
    the rest as recorded. Without recorded times: from a turn drawn in that share of the session's own turns, warmed
    with the one before it (its subagents before it not sent)."""
    times = recorded_times(session)
    if times is None:
        return _by_share(session, ratios)
    t_star = sample_t_star(ratios[0], ratios[1], seed, session.id, max(times, default=0.0))
    warm: list[tuple[str, Turn]] = []
    rest = _cut(session, t_star, warm, dropped=False)
    assert rest is not None  # t* is at most the duration: the latest call, the root's or a subagent's, is kept
    return Start(tuple(warm), rest, t_star / 1e6)


def _cut(session: Session, t_star: float, warm: list[tuple[str, Turn]], dropped: bool) -> Session | None:
    """``session`` from ``t_star`` (microseconds), its live chains' boundary turns added to ``warm``; ``dropped``: the
    call before it in its parent's chain was not sent (its first kept call is then due from the start)."""
    turns = [step for step in session.steps if isinstance(step, Turn)]
    before = [t for t in turns if _us(t) < t_star]
    if before and len(before) < len(turns):
        warm.append((session.id, before[-1]))
    steps: list[Step] = []
    for step in session.steps:
        if isinstance(step, Fork):
            child = _cut(step.session, t_star, warm, dropped)
            if child is not None:
                steps.append(Fork(child, step.join))
        elif _us(step) < t_star:
            dropped = True
        else:
            steps.append(dataclasses.replace(step, delay=max(0.0, (_us(step) - t_star) / 1e6)) if dropped else step)
            dropped = False
    if not steps:
        return None
    return Session(session.id, tuple(steps), session.block_size)


def _by_share(session: Session, ratios: tuple[float, float]) -> Start:
    turns = [i for i, step in enumerate(session.steps) if isinstance(step, Turn)]
    draw = random.Random(f"t*/{session.id}").uniform(*ratios)  # the same start run after run
    k = min(len(turns) - 1, math.floor(draw * len(turns)))
    if k <= 0:
        return Start((), session, None)
    before = session.steps[turns[k - 1]]
    assert isinstance(before, Turn)
    return Start(((session.id, before),), Session(session.id, session.steps[turns[k]:], session.block_size), None)
