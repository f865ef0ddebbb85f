"""The run as ``vllm bench serve --save-result`` writes it: the same flat keys and units, so vLLM's sweep plots,
perf dashboards and CI converters read a vllm-load run as they read vLLM's own.

Keys and definitions follow vLLM's ``vllm/benchmarks/serve.py`` (0.32): times in ms; ``itl`` is the gap between
token-bearing chunks; ``request_goodput`` is good requests per second (None without a per-request SLO);
``request_rate`` is ``"inf"`` for a closed loop. The values come from the exact histograms, not from a sample.
With ``--save-detailed`` the per-request arrays come from the per-request logs (vLLM's ``generated_texts`` are
not kept by vllm-load: they are empty strings; ``queue_times`` are the server's and are null).
"""

from __future__ import annotations

import time
from typing import Any

from vllm_load.rundir.reqlog import read_log

#: vLLM's names of our metric keys, and the statistics written for each (``median`` is p50)
_METRICS = (("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl"), ("e2el", "e2e"))
_PERCENTILES = ("p50", "p90", "p95", "p99", "p99.9")


def vllm_result(run: Any, detailed: bool = False) -> dict[str, Any]:
    s, cfg = run.summary, run.config
    opts = cfg.get("options", {})
    plan = cfg.get("plan", {})
    logs = _logs(run) if detailed else []
    api = logs[0]["api"] if logs else plan.get("api") or "chat"
    backend = "openai-chat" if api == "chat" else "openai"
    duration = float(s.get("duration_s") or 0.0)
    rate = float(opts.get("request_rate") or 0.0)
    tokens_in, tokens_out = int(s.get("input_tokens", 0)), int(s.get("output_tokens", 0))
    out: dict[str, Any] = {
        "date": time.strftime("%Y%m%d-%H%M%S", time.localtime(run.start)),
        "endpoint_type": backend,
        "backend": backend,
        "label": None,
        "model_id": cfg.get("model"),
        "tokenizer_id": cfg.get("tokenizer"),
        "num_prompts": int(s.get("requests", 0)),
        "request_rate": rate if rate > 0 else "inf",
        "burstiness": float(opts.get("burstiness") or 1.0),
        "max_concurrency": None if rate > 0 else plan.get("total_users"),
        "duration": duration,
        "completed": int(s.get("succeeded", 0)),
        "failed": int(s.get("failed", 0)),
        "total_input_tokens": tokens_in,
        "total_output_tokens": tokens_out,
        "request_throughput": s.get("succeeded", 0) / duration if duration else 0.0,
        "request_goodput": s.get("goodput"),
        "output_throughput": tokens_out / duration if duration else 0.0,
        "total_token_throughput": (tokens_in + tokens_out) / duration if duration else 0.0,
        "max_output_tokens_per_s": float(max(run.stats.tokens_per_second.values(), default=0)),
        "max_concurrent_requests": (s.get("client") or {}).get("streams_max"),
        "rtfx": 0.0,
    }
    metrics = s.get("metrics", {})
    for vname, key in _METRICS:
        m = metrics.get(key) or {}
        has = bool(m.get("count"))
        out[f"mean_{vname}_ms"] = m["mean"] * 1000 if has else 0.0
        out[f"median_{vname}_ms"] = m["p50"] * 1000 if has else 0.0
        out[f"std_{vname}_ms"] = m.get("std", 0.0) * 1000 if has else 0.0
        for p in _PERCENTILES:
            out[f"{p}_{vname}_ms"] = m[p] * 1000 if has else 0.0
    if detailed:
        ok = [r for r in logs if not r.get("warmup")]
        out["input_lens"] = [r.get("input_tokens") or 0 for r in ok]
        out["output_lens"] = [r.get("output_tokens") or 0 for r in ok]
        out["ttfts"] = [r.get("ttft") or 0.0 for r in ok]
        out["itls"] = [[b - a for a, b in zip(r["chunk_offsets"], r["chunk_offsets"][1:])] for r in ok]
        out["latencies"] = [r["e2e"] for r in ok]
        out["start_times"] = [r["start"] for r in ok]
        out["queue_times"] = [None for _ in ok]
        out["generated_texts"] = ["" for _ in ok]
        out["errors"] = [r.get("error") or "" for r in ok]
    return out


def _logs(run: Any) -> list[dict]:
    step = run.config.get("sweep_step")
    base = run.path if step is None else run.path.parent.parent  # a step's requests are in its run's logs
    logs: list[dict] = []
    for f in sorted(base.glob("requests*.jsonl")):
        logs.extend(read_log(f))
    logs.sort(key=lambda r: r["start"])
    return logs if step is None else [r for r in logs if r.get("step") == step]
