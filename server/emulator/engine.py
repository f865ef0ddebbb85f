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
from dataclasses import dataclass, field
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
    spec_tokens: int = 0  # speculative decoding: draft tokens proposed per decode step (0: off)
    spec_acceptance: float = 0.7  # the chance that each draft position is accepted, given the ones before it were


@dataclass
class SpecDecode:
    """Speculative decoding's arithmetic and vLLM's counters for it. Each decode step drafts ``tokens`` tokens;
    position j is accepted with probability ``acceptance`` if every position before it was, so a step yields
    1 + accepted tokens (the target model's own plus the accepted drafts) in the time of one step, as vLLM's
    emits them in one chunk. Counted as vLLM counts them (vllm:spec_decode_num_drafts, _num_draft_tokens,
    _num_accepted_tokens, _num_accepted_tokens_per_pos{position}); a step cut short by max_tokens counts the
    tokens it emitted."""

    tokens: int
    acceptance: float
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.per_pos = [0] * self.tokens

    def step(self, rng: random.Random, remaining: int) -> int:
        """One decode step: how many tokens it yields (at most ``remaining``)."""
        accepted = 0
        while accepted < self.tokens and rng.random() < self.acceptance:
            accepted += 1
        n = min(1 + accepted, remaining)
        self.drafts += 1
        self.draft_tokens += self.tokens
        self.accepted += n - 1
        for j in range(n - 1):
            self.per_pos[j] += 1
        return n


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
        self.spec = SpecDecode(cfg.spec_tokens, cfg.spec_acceptance) if cfg.spec_tokens > 0 else None
        self.power = None  # dcgm.PowerModel (--dcgm): told before the running count changes

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

    def generate(self, prompt_tokens: int, max_tokens: int, cached_tokens: int = 0,
                 remote: bool = False, priority: int = 0) -> Iterator[Emission]:
        """Yield each chunk when it is due (sleeping cooperatively until then). ``remote``: the prompt's KV came from
        a prefill instance (P/D): no prefill here, the first token takes one decode step. Nothing queues on a fixed
        schedule, so ``priority`` changes nothing."""
        cfg = self.cfg
        arrival = time.perf_counter()
        self._requests += 1
        rng = random.Random(cfg.seed * 1_000_003 + self._requests) if cfg.jitter else None

        def spread(value: float) -> float:
            return value * (1.0 + cfg.jitter * (2.0 * rng.random() - 1.0)) if rng else value

        first = spread(cfg.itl if remote else cfg.ttft + cfg.prefill_per_token * prompt_tokens)
        spec = self.spec
        drafts = random.Random(f"{cfg.seed}/spec/{self._requests}") if spec is not None else None
        k = 1 if spec is not None else max(1, cfg.tokens_per_chunk)  # with drafts a chunk is one step's tokens
        if self.power is not None:
            self.power.advance(self.running + 1)
        self.running += 1
        self.kv_tokens += prompt_tokens
        try:
            produced = 0
            due = arrival + first
            while produced < max_tokens:
                n = min(k, max_tokens - produced)
                if produced and spec is not None and drafts is not None:  # one decode step, whatever its drafts added
                    n = spec.step(drafts, max_tokens - produced)
                    due += cfg.itl_cycle[produced % len(cfg.itl_cycle)] if cfg.itl_cycle else spread(cfg.itl)
                elif produced:
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
            if self.power is not None:
                self.power.advance(self.running - 1)
            self.running -= 1
            self.kv_tokens -= prompt_tokens + produced
