"""The emulator's timing model: when each output token of a request is produced.

This first engine gives every request its own fixed schedule (TTFT, then one token every ITL,
optionally several tokens per chunk), independent of load, so that tests can compare what the
client measures with the truth. KV usage and running counts still move with the load.
"""

from __future__ import annotations

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


@dataclass
class Emission:
    """A chunk of ``tokens`` output tokens, produced at ``offset`` seconds after arrival."""

    offset: float
    tokens: int
    queue_time: float = 0.0  # seconds the request waited before it was first scheduled


class FixedScheduleEngine:
    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self.running = 0
        self.waiting = 0  # never queues: every request runs on its own schedule
        self.preemptions = 0
        self.kv_tokens = 0

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
        first = cfg.ttft + cfg.prefill_per_token * prompt_tokens
        k = max(1, cfg.tokens_per_chunk)
        self.running += 1
        self.kv_tokens += prompt_tokens
        try:
            produced = 0
            while produced < max_tokens:
                n = min(k, max_tokens - produced)
                # chunk j (k tokens) is due at TTFT + j*k*ITL: true per-token ITL is ITL
                due = arrival + first + produced * cfg.itl
                delay = due - time.perf_counter()
                if delay > 0:
                    gevent.sleep(delay)
                produced += n
                self.kv_tokens += n
                yield Emission(time.perf_counter() - arrival, n)
        finally:
            self.running -= 1
            self.kv_tokens -= prompt_tokens + produced
