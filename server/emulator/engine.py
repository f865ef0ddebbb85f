"""The emulator's timing model: when each output token of a request is produced.

This first engine gives every request its own fixed schedule (TTFT, then one token every ITL,
optionally several tokens per chunk), independent of load, so that tests and the timing benchmark
can compare what the client measures with the truth. ``jitter`` draws each gap from a uniform
spread around ITL (seeded per request, so the schedule is known); ``lockstep`` puts every due time
on one global ITL grid, so that all running streams emit at once like one batched decode step of a
real engine. KV usage and running counts still move with the load.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Iterator

import gevent


@dataclass
class EngineConfig:
    ttft: float = 0.05  # seconds from arrival to the first token
    itl: float = 0.01  # seconds between tokens
    prefill_per_token: float = 0.0  # extra TTFT per prompt token
    tokens_per_chunk: int = 1
    num_gpu_blocks: int = 8192
    block_size: int = 16
    jitter: float = 0.0  # each TTFT/ITL drawn uniformly from value * (1 +- jitter)
    lockstep: bool = False  # due times rounded up to a global grid of ITL: all streams emit together
    seed: int = 0
    #: a GPU's decode steps are not all alike: the token gaps cycle through these (seconds) instead of ITL;
    #: with lockstep the global grid's steps do (every stream emits at the same step ends)
    itl_cycle: tuple[float, ...] = ()


@dataclass
class Emission:
    """A chunk of ``tokens`` output tokens, produced at ``offset`` seconds after arrival."""

    offset: float
    tokens: int
    at: float  # perf_counter() when it was produced, so arrival = at - offset holds exactly
    queue_time: float = 0.0  # seconds the request waited before it was first scheduled
    due: float | None = None  # when the schedule wanted it (seconds after arrival), if there is one


class FixedScheduleEngine:
    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self.running = 0
        self.waiting = 0  # never queues: every request runs on its own schedule
        self.preemptions = 0
        self.kv_tokens = 0
        self._requests = 0

    def _grid_at(self, due: float) -> float:
        """The first global step end at or after ``due`` (the grid starts at the clock's zero, so every
        stream, whenever it arrived, emits at the same step ends)."""
        cfg = self.cfg
        if cfg.itl_cycle:
            period = sum(cfg.itl_cycle)
            k, r = divmod(due, period)
            acc = 0.0
            for step in cfg.itl_cycle:
                acc += step
                if acc >= r - 1e-12:
                    return k * period + acc
            return (k + 1) * period
        return math.ceil(due / cfg.itl) * cfg.itl

    @property
    def kv_usage(self) -> float:
        cap = self.cfg.num_gpu_blocks * self.cfg.block_size
        return min(1.0, self.kv_tokens / cap) if cap else 0.0

    def fits(self, tokens: int) -> bool:
        return True

    def generate(self, prompt_tokens: int, max_tokens: int, cached_tokens: int = 0) -> Iterator[Emission]:
        """Yield each chunk when it is due (sleeping cooperatively until then)."""
        cfg = self.cfg
        arrival = time.perf_counter()
        self._requests += 1
        rng = random.Random(cfg.seed * 1_000_003 + self._requests) if cfg.jitter else None

        def spread(value: float) -> float:
            return value * (1.0 + cfg.jitter * (2.0 * rng.random() - 1.0)) if rng else value

        first = spread(cfg.ttft + cfg.prefill_per_token * prompt_tokens)
        k = max(1, cfg.tokens_per_chunk)
        self.running += 1
        self.kv_tokens += prompt_tokens
        try:
            produced = 0
            due = arrival + first
            while produced < max_tokens:
                n = min(k, max_tokens - produced)
                if produced:
                    if cfg.itl_cycle:
                        due += sum(cfg.itl_cycle[(produced + j) % len(cfg.itl_cycle)] for j in range(n))
                    else:
                        due += sum(spread(cfg.itl) for _ in range(n))  # chunk of k tokens: k gaps of ITL
                at = due
                if cfg.lockstep and (cfg.itl > 0 or cfg.itl_cycle):
                    at = self._grid_at(due)
                # never before it is due by this clock, whatever the loop timer's resolution
                while (now := time.perf_counter()) < at:
                    gevent.sleep(at - now)
                produced += n
                self.kv_tokens += n
                yield Emission(now - arrival, n, now, due=at - arrival)
        finally:
            self.running -= 1
            self.kv_tokens -= prompt_tokens + produced
