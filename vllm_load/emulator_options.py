"""The embedded emulator's options (``--emulator-*``): the target a run has without --host, configured like the
server it stands for (``server/emulator``'s own flags, without the prefix)."""

from __future__ import annotations

from vllm_load.option_spec import Option, group

EMULATOR_OPTIONS: tuple[Option, ...] = group(
    "emulator",
    Option("--emulator-profile", "", "embedded emulator: its continuous-batching cost profile (small-gpu, a100-llama8b, "
        "h100-llama8b, cpu-tiny), or 'fixed' for a fixed TTFT/ITL schedule at any load (small-gpu: 32 sequences at a "
        "time, latency grows with load and a queue forms past it)", shown_default="small-gpu, or fixed when "
        "--emulator-ttft, --emulator-itl, --emulator-tokens-per-chunk or --emulator-spec-tokens is given"),
    Option("--emulator-max-num-seqs", 0, "embedded emulator's continuous batching: sequences per batch (vLLM's "
        "--max-num-seqs; a small one gives a small capacity); 0: small-gpu's 32, the other profiles' 256", type=int),
    Option("--emulator-scheduling-policy", "fcfs", "embedded emulator's continuous batching: vLLM's "
        "--scheduling-policy: priority admits the waiting by each request's priority (lower first; a request's "
        "body field, e.g. self.llm.chat(..., priority=0) or --extra-body), then by arrival", choices=["fcfs", "priority"]),
    Option("--emulator-dcgm", False, "embedded emulator: serve GPU telemetry as NVIDIA's DCGM exporter does, from a "
        "power model (idle 60 W + 4 W per running sequence), and read it as --dcgm-url", action="store_true"),
    Option("--emulator-ttft", 0.05, "embedded emulator: time to first token, seconds", type=float),
    Option("--emulator-itl", 0.01, "embedded emulator: inter-token delay, seconds", type=float),
    Option("--emulator-tokens-per-chunk", 1, "embedded emulator: tokens per SSE chunk", type=int),
    Option("--emulator-reasoning-tokens", "", "embedded emulator: a reasoning model whose chat answers start with "
        "this many reasoning tokens (N, LOW-HIGH or normal:MEAN,STD), streamed as vLLM's reasoning parsers do"),
    Option("--emulator-graded-correct", 1.0, "embedded emulator: the share of --accuracy's items it answers right "
        "(a model of known accuracy; the rest wrong)", type=float),
    Option("--emulator-spec-tokens", 0, "embedded emulator: speculative decoding, drafting this many tokens per "
        "decode step (vllm:spec_decode_* counted; the run reports acceptance rate and length); 0: off", type=int),
    Option("--emulator-spec-acceptance", 0.7, "embedded emulator: the chance that a draft position is accepted, "
        "given the positions before it were", type=float),
)
