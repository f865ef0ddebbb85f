"""The run as ``vllm bench serve --save-result`` writes it: the same flat keys and units, so vLLM's sweep plots,
perf dashboards and CI converters read a vllm-load run as they read vLLM's own.

Keys and definitions follow vLLM's ``vllm/benchmarks/serve.py`` (0.32): times in ms; ``itl`` is the gap between
token-bearing chunks; ``request_goodput`` is good requests per second (None without a per-request SLO);
``request_rate`` is ``"inf"`` for a closed loop. The values come from the exact histograms, not from a sample.
``latencies`` and ``queue_times`` are always written, as vLLM writes them; a queue time is vLLM's
``client_queue_time``, the client's own wait between a request's due time and its send (vllm-load's send lag;
0 in a closed loop). ``max_concurrent_requests`` is computed as vLLM computes it (the most requests alive at any
time within one second, over one-second buckets: 33-56 at --max-concurrency 8 on a real vLLM), and the true
peak of open streams is ``max_concurrent_streams``. A sweep step's ``request_rate``/``max_concurrency`` are its
own level's. A server that drafts (speculative decoding) adds vLLM's ``spec_decode_*`` keys, over the run's window.
With ``--save-detailed`` the other per-request arrays come from the per-request logs too (vLLM's
``generated_texts`` are not kept by vllm-load: they are empty strings).
"""

from __future__ import annotations

import time
from typing import Any

from vllm_load.metric_table import E2E, INPUT_TOKENS, ITL, OUTPUT_TOKENS, SEND_LAG, TPOT, TTFT
from vllm_load.metrics.fleet.server import server_summary
from vllm_load.rundir.reqlog import read_log
from vllm_load.metrics.summary import RunSummary, metric_stats

#: vLLM's names of our metric keys, and the statistics written for each (``median`` is p50)
_METRICS = (("ttft", TTFT), ("tpot", TPOT), ("itl", ITL), ("e2el", E2E))
_PERCENTILES = ("p50", "p90", "p95", "p99", "p99.9")
#: keys a pooling result (vLLM's EmbedBenchmarkMetrics) does not have
_GENERATION_KEYS = ("total_output_tokens", "output_throughput", "max_output_tokens_per_s", "request_goodput", "rtfx")


def vllm_result(run: Any, detailed: bool = False) -> dict[str, Any]:
    s, cfg = RunSummary.of(run.summary), run.config
    opts = cfg.get("options", {})
    plan = run.plan
    logs = [r for r in run_logs(run) if not r.get("warmup") and not r.get("removed")]
    api = logs[0]["api"] if logs else "chat"
    backend = {"chat": "openai-chat", "responses": "openai-responses", "messages": "anthropic-messages",
               "embeddings": "openai-embeddings",
               "rerank": "vllm-rerank"}.get(api, "openai")
    duration = float(s.duration_s or 0.0)
    rate = float(opts.get("request_rate") or 0.0)
    users = plan.total_users if plan else None
    if plan is not None and plan.schedule is not None and duration > 0:  # --rate-schedule: its mean rate over the run
        rate = plan.schedule.area(0.0, duration) / duration
    if opts.get("sweep_level_kind") == "rate":  # a sweep step: its own level
        rate = float(opts.get("vllm_load_step_users") or 0.0)
    elif opts.get("sweep_level_kind") == "users":
        rate, users = 0.0, opts.get("vllm_load_step_users")
    tokens_in, tokens_out = int(s.input_tokens or 0), int(s.output_tokens or 0)
    out: dict[str, Any] = {
        "date": time.strftime("%Y%m%d-%H%M%S", time.localtime(run.start)),
        "endpoint_type": backend,
        "backend": backend,
        "label": None,
        "model_id": cfg.get("model"),
        "tokenizer_id": cfg.get("tokenizer"),
        "num_prompts": int(s.requests or 0),
        "request_rate": rate if rate > 0 else "inf",
        "burstiness": float(opts.get("burstiness") or 1.0),
        "max_concurrency": None if rate > 0 else users,
        "duration": duration,
        "completed": int(s.succeeded or 0),
        "failed": int(s.failed or 0),
        "total_input_tokens": tokens_in,
        "total_output_tokens": tokens_out,
        "request_throughput": (s.succeeded or 0) / duration if duration else 0.0,
        "request_goodput": s.goodput,
        "output_throughput": tokens_out / duration if duration else 0.0,
        "total_token_throughput": (tokens_in + tokens_out) / duration if duration else 0.0,
        "max_output_tokens_per_s": float(max(run.stats.tokens_per_second.values(), default=0)),
        "max_concurrent_requests": _alive_per_second(logs),
        "max_concurrent_streams": _peak(logs),
        "rtfx": 0.0,
    }
    for vname, key in _METRICS:
        m = metric_stats(s, key)
        has = bool(m.count)
        out[f"mean_{vname}_ms"] = m.mean * 1000 if has else 0.0
        out[f"median_{vname}_ms"] = m.at("p50") * 1000 if has else 0.0
        out[f"std_{vname}_ms"] = (m.std or 0.0) * 1000 if has else 0.0
        for p in s.percentiles or _PERCENTILES:  # vLLM writes those of its --metric-percentiles
            out[f"{p}_{vname}_ms"] = m.at(p) * 1000 if has and m.at(p) is not None else 0.0
    if api in ("embeddings", "rerank", "score"):  # vLLM's pooling result: inputs, no generation keys
        out["total_input_sequences"] = int(s.inputs or 0)
        out["input_sequence_throughput"] = float(s.input_rate or 0.0)
        for key in [k for k in out if k.endswith(("_ttft_ms", "_tpot_ms", "_itl_ms")) or k in _GENERATION_KEYS]:
            del out[key]
    if s.energy:  # vllm-load's own: GPU energy over the run (--dcgm-url)
        out["energy"] = dict(s.energy)
    if s.saturation:  # vllm-load's own: where the server stopped keeping up (vLLM has no such key)
        sat = s.saturation
        out["over_saturation"] = {"onset_s": sat.onset_s, "at_s": sat.at_s, "offered": sat.offered,
                                  "offered_unit": sat.offered_unit, "capacity_rps": sat.capacity_rps,
                                  "queue_source": sat.queue_source, "text": sat.text}
    if opts.get("ramp_up_strategy"):  # vLLM's keys for a ramped rate
        out["ramp_up_strategy"] = opts["ramp_up_strategy"]
        out["ramp_up_start_rps"] = opts.get("ramp_up_start_rps")
        out["ramp_up_end_rps"] = opts.get("ramp_up_end_rps")
        if opts.get("ramp_up_end_users"):  # the closed loop's ramp (vLLM's ramp is over the rate only)
            out.update(ramp_up_start_rps=None, ramp_up_end_rps=None, ramp_up_start_users=opts["ramp_up_start_users"],
                       ramp_up_end_users=opts["ramp_up_end_users"])
        out["request_rate"], out["max_concurrency"] = "inf", None
    out["latencies"] = [r[E2E] for r in logs]
    out["queue_times"] = [r.get(SEND_LAG) or 0.0 for r in logs]
    spec = (server_summary(run.server) or {}).get("spec_decode") if run.server else None
    if spec:  # the keys vllm bench serve writes when the server drafts (from the sidecar's window, not two scrapes)
        for key in ("acceptance_rate", "acceptance_length", "num_drafts", "draft_tokens", "accepted_tokens",
                    "per_position_acceptance_rates"):
            out[f"spec_decode_{key}"] = spec[key]
    if detailed:
        ok = logs
        out["input_lens"] = [r.get(INPUT_TOKENS) or 0 for r in ok]
        out["output_lens"] = [r.get(OUTPUT_TOKENS) or 0 for r in ok]
        out["ttfts"] = [r.get(TTFT) or 0.0 for r in ok]
        out["itls"] = [[b - a for a, b in zip(r["chunk_offsets"], r["chunk_offsets"][1:])] for r in ok]
        out["start_times"] = [r["start"] for r in ok]
        out["generated_texts"] = ["" for _ in ok]
        out["errors"] = [r.get("error") or "" for r in ok]
    return out


def _peak(logs: list[dict]) -> int:
    """The most requests open at one instant (each from its start to its end), exact from the logs."""
    edges = sorted([(r["start"], 1) for r in logs] + [(r["start"] + r[E2E], -1) for r in logs],
                   key=lambda e: (e[0], e[1]))
    peak = open_now = 0
    for _t, step in edges:
        open_now += step
        peak = max(peak, open_now)
    return peak


def _alive_per_second(logs: list[dict]) -> int:
    """vLLM's max_concurrent_requests: over one-second buckets from the first start, the most successful
    requests alive at any time within a bucket (``concurrent_requests_per_second`` in vllm/benchmarks/serve.py)."""
    ok = [r for r in logs if r.get("ok")]
    if not ok:
        return 0
    first = min(r["start"] for r in ok)
    buckets: dict[int, int] = {}
    for r in ok:
        for second in range(int(r["start"] - first), int(r["start"] + r[E2E] - first) + 1):
            buckets[second] = buckets.get(second, 0) + 1
    return max(buckets.values())


def run_logs(run: Any) -> list[dict]:
    """Every request the run (or its sweep step) logged, every worker's, by start."""
    step = run.config.get("sweep_step")
    base = run.path if step is None else run.path.parent.parent  # a step's requests are in its run's logs
    logs: list[dict] = []
    for f in sorted(base.glob("requests*.jsonl")):
        logs.extend(read_log(f))
    logs.sort(key=lambda r: r["start"])
    return logs if step is None else [r for r in logs if r.get("step") == step]
