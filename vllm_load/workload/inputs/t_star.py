"""AgentX's t*: the instant of a recorded trace from which a lane measures it, drawn as AIPerf draws it.

AIPerf (``rust/runtime/src/graph/tstar.rs``, byte-exact with its ``graph_ir_source.py:_sample_t_star`` and
``_seed_for_trace_lane``): t* is uniform over ``[min, max] × the trace's duration`` (its latest call's recorded
time, subagents' included), from NumPy's ``default_rng`` seeded by SHA-256 of ``"{seed}:{trace_id}:{lane}"`` (its
first 8 bytes, big-endian); a trace without a duration, or a window of no width, gives its lower end without a draw.
The calls recorded before t* are the warm-up prefix, the rest are measured. AIPerf's runner salts lane 0 today
("a lane-0 baseline"), and so does this. Sessions without recorded times (a sessions JSONL, synthetic ones) are
split by their turns' share instead, drawn per session id: the same start every run.
"""

from __future__ import annotations

import hashlib
import math
import random

import numpy as np

from vllm_load.workload.inputs.sessions import Fork, Session, Turn


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
            out.append(round(step.at * 1e6))  # AIPerf's arrival_offset_us
    return out


def first_measured(session: Session, ratios: tuple[float, float], seed: int) -> tuple[int, float | None]:
    """The index (among the session's own turns) of its first measured turn, and t* in seconds of the trace's clock
    (None: split by the turns' share, the session having no recorded times)."""
    turns = [step for step in session.steps if isinstance(step, Turn)]
    times = recorded_times(session)
    if times is None:
        draw = random.Random(f"t*/{session.id}").uniform(*ratios)
        return min(len(turns) - 1, math.floor(draw * len(turns))), None
    t_star = sample_t_star(ratios[0], ratios[1], seed, session.id, max(times, default=0.0))
    k = next((i for i, turn in enumerate(turns) if round((turn.at or 0.0) * 1e6) >= t_star), len(turns) - 1)
    return k, t_star / 1e6
