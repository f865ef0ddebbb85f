"""vllm-load's options, registered as Locust custom arguments.

They are settable on the command line, in locust.conf / pyproject.toml, from environment variables
and from the web UI, and Locust ships them to every worker in its spawn messages (so every value
here must be msgpack-encodable: strings, numbers, booleans).
"""

from __future__ import annotations

from typing import Any

def add_arguments(parser: Any) -> None:
    # Locust's own add_argument (not an argument group) understands is_secret/include_in_web_ui.
    def add(flag: str, default: Any, help: str, **kw: Any) -> None:
        env = "VLLM_LOAD_" + flag.lstrip("-").replace("-", "_").upper()
        parser.add_argument(flag, default=default, env_var=env, help=f"{help} [env {env}]", **kw)

    add("--model", "", "model name to request (default: the server's first /v1/models id)")
    add("--tokenizer", "", "tokenizer: HF id, local folder, or a built-in one: builtin:mistral-7b-v0.1 (SentencePiece, "
        "the emulator's), builtin:mistral-tekken (Tekken, for vLLM's --tokenizer-mode mistral) (default: the model name)")
    add("--input-tokens", "128", "prompt length in tokens as the server counts them: N, LOW-HIGH, normal:MEAN,STD")
    add("--output-tokens", "", "output length in tokens (forced with ignore_eos/min_tokens): N, LOW-HIGH, "
        "normal:MEAN,STD (default 64; with --dataset, the dataset's answer length, or one token per batched record)")
    add("--wait-for-server", "0", "wait this long (30s, 15m, …) for the server's /health and /v1/models before the "
        "run, with a progress line every 10 s (a vLLM loading its model takes minutes)")
    add("--api-key", "", "bearer token for the server (never logged or written)", is_secret=True)
    add("--run-dir", "", "where the run's files go (default: reports/<run id>)")
    add("--shared-prefix-tokens", 0, "deliberately share this many leading prompt tokens across requests", type=int)
    add("--request-timeout", 600.0, "seconds without a byte from the server before a request fails", type=float)
    add("--request-rate", 0.0, "open loop: total requests/s over all users and workers (0: closed loop, one "
        "request in flight per user)", type=float)
    add("--burstiness", 1.0, "open loop: gamma shape of inter-arrival times (1 = Poisson)", type=float)
    add("--ramp-up", 0.0, "open loop: seconds over which the rate grows linearly to --request-rate "
        "(closed loop ramps with Locust's own -r/--spawn-rate)", type=float)
    add("--max-concurrency", 1000, "open loop: most requests in flight per user (more arrivals are sent late)",
        type=int)
    add("--prompt-pool", 32, "prompts prepared ahead per process, off the event loop", type=int)
    add("--sweep", "", "locustfiles/sweep.py: comma-separated levels (users, or req/s with --sweep-mode rate)")
    add("--sweep-mode", "users", "sweep over 'users' (closed loop) or 'rate' (open loop, --sweep-users users)",
        choices=["users", "rate"])
    add("--sweep-users", 32, "users that carry an open-loop rate sweep", type=int)
    add("--step-duration", 60.0, "seconds per sweep step", type=float)
    add("--stop-on-slo-miss", False, "end the sweep at the first step that misses an SLO", action="store_true")
    add("--retry-backoff-max", "2s", "closed loop: after a connection failure (refused, reset, connect timeout) a "
        "user waits 50 ms, doubling up to this, with jitter (also the cap on a server's Retry-After)")
    add("--outage-after", "2s", "connection failures with no success for this long are reported as a server outage")
    add("--stop-on-outage", "0", "end the run (exit 1) once an outage has lasted this long (0: never)")
    add("--drain-timeout", 30.0, "at the end of a run, seconds to let in-flight streams finish before they are cancelled",
        type=float)
    add("--no-ignore-eos", False, "do not send ignore_eos/min_tokens (output length is then up to the model)",
        action="store_true")
    add("--dataset", "", "take prompts from this file (ShareGPT .json, .jsonl, .csv) instead of synthetic text")
    add("--dataset-format", "", "sharegpt, jsonl or csv (default: from the file extension)")
    add("--dataset-field", "", "JSONL field or CSV column holding the text (default: text / first column)")
    add("--dataset-batch", 0, "classify this many dataset records per prompt under one instruction (1 = the same "
        "instruction with one record, to compare with K); 0: each record is a prompt as it is", type=int)
    add("--dataset-answer-tokens", 0, "with --dataset-batch: answer tokens per record (default: the tokens of the "
        "longest answer line the instruction asks for)", type=int)
    add("--align-with-server", False, "before the run, check our token counts against the server's /tokenize",
        action="store_true")
    add("--slo", [], "an SLO like 'ttft.p99<=500ms' or a YAML/TOML file of them; repeat for more",
        action="append", include_in_web_ui=False)
    add("--min-requests", 1, "fewer successful requests than this make the run fail (exit 4): a gate must not pass "
        "on a run that measured nothing", type=int)
    add("--junit", "", "write the SLO verdict as JUnit XML here (default: <run dir>/junit.xml when SLOs are set)")
    add("--sidecar-url", "", "the sidecar (python -m server.sidecar) beside vLLM; its series lands in the run dir (auto with the emulator)")
    add("--sidecar-token", "", "bearer token of the sidecar, when it requires one", is_secret=True)
    add("--emulator-profile", "", "embedded emulator: model vLLM's continuous batching with this cost profile "
        "(a100-llama8b, h100-llama8b, cpu-tiny) instead of the fixed TTFT/ITL schedule")
    add("--emulator-ttft", 0.05, "embedded emulator: time to first token, seconds", type=float)
    add("--emulator-itl", 0.01, "embedded emulator: inter-token delay, seconds", type=float)
    add("--emulator-tokens-per-chunk", 1, "embedded emulator: tokens per SSE chunk", type=int)
