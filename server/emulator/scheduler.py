"""A continuous-batching engine model of vLLM's scheduler, so the emulator behaves like vLLM under load.

Every step the scheduler runs the running sequences first (one decode token each, or the next chunk of a
prefill), then admits waiting sequences first-come-first-served while ``max_num_seqs``, the token budget
``max_num_batched_tokens`` (chunked prefill) and free KV blocks allow. KV lives in ``num_gpu_blocks``
blocks of ``block_size`` tokens; when a running sequence needs a block and none is free, the most
recently admitted sequence is preempted (recompute: its blocks are freed and it goes back to the front of
the queue), as in vLLM V1. With vLLM's ``--scheduling-policy priority`` the waiting are admitted by (priority,
arrival), lower first, and the victim of a preemption is the running sequence last by that order
(``vllm/v1/core/sched/scheduler.py``, ``request_queue.py``); a running one is never preempted to admit another. A step lasts ``overhead + prefill_per_token * prefill tokens + decode_per_seq *
decoding sequences + decode_per_kv_token * their context``, times ``time_scale``. So throughput
saturates and latency grows with batch size the way vLLM's do.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Iterator

import gevent
from gevent.event import Event
from gevent.queue import Queue

from .engine import Emission


@dataclass(frozen=True)
class CostModel:
    overhead: float  # seconds per step
    prefill_per_token: float
    decode_per_seq: float
    decode_per_kv_token: float = 0.0


#: Named profiles. a100-llama8b is fitted to a published A100 sweep (max_num_seqs 64 -> 512 at matching
#: concurrency: 9.9 -> 11.5 req/s while mean latency rose 6 -> 37 s): step = 5 ms + 0.42 ms per sequence.
PROFILES = {
    "a100-llama8b": CostModel(overhead=0.005, prefill_per_token=0.00005, decode_per_seq=0.00042),
    "h100-llama8b": CostModel(overhead=0.004, prefill_per_token=0.00003, decode_per_seq=0.00025),
    "cpu-tiny": CostModel(overhead=0.002, prefill_per_token=0.00002, decode_per_seq=0.0003),
    # the embedded default (vllm-load's no --host): a GPU server scaled to what a 2-core machine can emulate beside
    # its client, 8 ms a step plus 0.5 ms per sequence (with 32 at a time: ITL 8.5 -> 24 ms from 1 to 32 users,
    # then a queue), so that a first run already shows latency rising with load
    "small-gpu": CostModel(overhead=0.008, prefill_per_token=0.00005, decode_per_seq=0.0005),
}


@dataclass
class SchedulerConfig:
    cost: CostModel = PROFILES["a100-llama8b"]
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    num_gpu_blocks: int = 8192
    block_size: int = 16
    time_scale: float = 1.0
    policy: str = "fcfs"  # vLLM's --scheduling-policy: "fcfs" or "priority"


@dataclass(eq=False)
class Seq:
    prompt_tokens: int
    max_tokens: int
    arrival: float
    computed: int = 0  # tokens whose KV is computed
    generated: int = 0
    blocks: int = 0
    queue_time: float | None = None
    aborted: bool = False
    priority: int = 0  # lower is handled earlier (under the priority policy)
    out: Queue = field(default_factory=Queue)

    @property
    def target(self) -> int:
        """Tokens that must be in the KV cache before the next token can be produced."""
        return self.prompt_tokens + self.generated


def _order(seq: Seq) -> tuple[int, float]:
    """The priority policy's order: priority, then arrival (vLLM's request queue)."""
    return seq.priority, seq.arrival


class BatchingEngine:
    def __init__(self, cfg: SchedulerConfig) -> None:
        self.cfg = cfg
        # the interface the emulator reads (same as FixedScheduleEngine)
        self.running_seqs: list[Seq] = []
        self.waiting_seqs: list[Seq] = []
        self.free_blocks = cfg.num_gpu_blocks
        self.preemptions = 0
        self.steps = 0
        self.model_time = 0.0  # sum of unscaled step times: the engine's own clock, free of host jitter
        self.tokens_out = 0
        self.power = None  # dcgm.PowerModel (--dcgm): told the running count at every step
        self._wake = Event()
        self._loop = gevent.spawn(self._run)

    @property
    def running(self) -> int:
        return len(self.running_seqs)

    @property
    def waiting(self) -> int:
        return len(self.waiting_seqs)

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks / self.cfg.num_gpu_blocks

    def fits(self, tokens: int) -> bool:
        """Whether a request of this many tokens can ever fit the KV cache (else vLLM refuses it)."""
        return self._blocks_for(tokens) <= self.cfg.num_gpu_blocks

    def generate(self, prompt_tokens: int, max_tokens: int, cached_tokens: int = 0,
                 remote: bool = False, priority: int = 0) -> Iterator[Emission]:
        """``remote``: the prompt's KV came from a prefill instance (P/D): all of it computed but its last token."""
        computed = prompt_tokens - 1 if remote else min(cached_tokens, prompt_tokens - 1)
        seq = Seq(prompt_tokens, max_tokens, time.perf_counter(), computed=computed, priority=priority)
        self.waiting_seqs.append(seq)
        self._wake.set()
        try:
            while True:
                em = seq.out.get()
                if em is None:
                    return
                yield em
        finally:
            seq.aborted = True  # the client went away, or we are done: the loop frees its blocks

    # -- the engine loop ---------------------------------------------------------------------------
    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.cfg.block_size)

    def _free(self, seq: Seq) -> None:
        self.free_blocks += seq.blocks
        seq.blocks = 0

    def _grow(self, seq: Seq, tokens: int) -> bool:
        need = self._blocks_for(tokens) - seq.blocks
        if need <= self.free_blocks:
            self.free_blocks -= max(0, need)
            seq.blocks += max(0, need)
            return True
        return False

    def _preempt(self, victim: Seq) -> None:
        self.running_seqs.remove(victim)
        self._free(victim)
        victim.computed = 0  # recompute: prompt and generated tokens are prefilled again
        self.waiting_seqs.insert(0, victim)
        self.preemptions += 1

    def _schedule(self) -> list[tuple[Seq, int]]:
        cfg = self.cfg
        budget = cfg.max_num_batched_tokens
        batch: list[tuple[Seq, int]] = []
        for seq in [s for s in self.running_seqs if s.aborted]:
            self.running_seqs.remove(seq)
            self._free(seq)
        self.waiting_seqs = [s for s in self.waiting_seqs if not s.aborted]
        for seq in list(self.running_seqs):
            if seq not in self.running_seqs or budget <= 0:
                continue
            n = min(seq.target - seq.computed, budget)
            while not self._grow(seq, seq.computed + n):
                victim = (max(self.running_seqs, key=_order) if self.cfg.policy == "priority"
                          else self.running_seqs[-1])
                self._preempt(victim)
                batch = [(s, k) for s, k in batch if s is not victim]
                if victim is seq:
                    n = 0
                    break
            if n:
                batch.append((seq, n))
                budget -= n
        while self.waiting_seqs and len(self.running_seqs) < cfg.max_num_seqs and budget > 0:
            seq = min(self.waiting_seqs, key=_order) if cfg.policy == "priority" else self.waiting_seqs[0]
            n = min(seq.target - seq.computed, budget)
            if not self._grow(seq, seq.computed + n):
                break
            self.waiting_seqs.remove(seq)
            self.running_seqs.append(seq)
            if seq.queue_time is None:
                seq.queue_time = time.perf_counter() - seq.arrival
            batch.append((seq, n))
            budget -= n
        return batch

    def _step_time(self, batch: list[tuple[Seq, int]]) -> float:
        c = self.cfg.cost
        prefill = sum(n for s, n in batch if s.target - s.computed > 1 or n > 1)
        decoding = [s for s, n in batch if n == 1 and s.target - s.computed == 1]
        context = sum(s.target for s in decoding)
        t = c.overhead + c.prefill_per_token * prefill + c.decode_per_seq * len(decoding) + c.decode_per_kv_token * context
        return t * self.cfg.time_scale

    def _run(self) -> None:
        next_at = time.perf_counter()
        while True:
            if not self.running_seqs and not self.waiting_seqs:
                if self.power is not None:
                    self.power.advance(0)
                self._wake.clear()
                self._wake.wait()
                next_at = time.perf_counter()
            batch = self._schedule()
            if self.power is not None:
                self.power.advance(len(self.running_seqs))
            step = self._step_time(batch)
            self.model_time += step / self.cfg.time_scale
            next_at = max(next_at, time.perf_counter() - 0.05) + step
            delay = next_at - time.perf_counter()
            if delay > 0:
                gevent.sleep(delay)
            else:
                gevent.sleep(0)
            self.steps += 1
            now = time.perf_counter()
            for seq, n in batch:
                if seq.aborted or seq not in self.running_seqs:
                    continue
                seq.computed += n
                if seq.computed >= seq.target:  # fully computed: this step produced one more token
                    seq.generated += 1
                    self.tokens_out += 1
                    # due at the step's end by the cost model: a loop that woke later (a starved emulator) is late
                    seq.out.put(Emission(now - seq.arrival, 1, now, seq.queue_time or 0.0, due=next_at - seq.arrival))
                    if seq.generated >= seq.max_tokens:
                        self.running_seqs.remove(seq)
                        self._free(seq)
                        seq.out.put(None)
