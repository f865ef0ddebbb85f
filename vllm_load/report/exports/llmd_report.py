"""The run as an llm-d Benchmark Report v0.2 (``benchmark_report_v0.2.yaml``): the format inference-perf writes
natively and llm-d-benchmark's analysis reads, so a vllm-load run (and each sweep step, a run directory of its own)
lands beside theirs.

Fields and units follow llm-d-benchmark's ``benchmark_report/schema_v0_2.py`` (version '0.2'): ``run`` (uid, eid,
time as ISO 8601), ``scenario.load`` (the workload, ``standardized`` and the options given as ``native.args``), and
``results.request_performance.aggregate`` (requests; latency in s and s/token; throughput in tokens/s and
queries/s). A statistic has ``units`` and ``mean`` and the percentiles the run computed (p99.9 as ``p99p9``), all
from the exact histograms. ``time_per_output_token`` is per request, TTFT excluded; ``inter_token_latency`` every
gap between token-bearing chunks. The stack (the server's own configuration) is left out: the client does not know
it, and the schema validates each component kind strictly.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from typing import Any

from vllm_load.metric_table import E2E, INPUT_TOKENS, ITL, OUTPUT_TOKENS, TPOT, TTFT
from vllm_load.metrics.summary import RunSummary, metric_stats

VERSION = "0.2"
#: our percentile keys -> the schema's
_KEYS = {"p0.1": "p0p1", "p1": "p1", "p5": "p5", "p10": "p10", "p25": "p25", "p50": "p50", "p75": "p75",
         "p90": "p90", "p95": "p95", "p99": "p99", "p99.9": "p99p9"}
#: a run's workload that comes from data (a dataset, trace or sessions) rather than made-up prompts
_SAMPLED = ("dataset", "trace", "sessions", "accuracy")


def statistics(summary: RunSummary, key: str, units: str) -> dict | None:
    """One metric's statistics in the schema's shape (None: never measured)."""
    m = metric_stats(summary, key)
    if not m.count:
        return None
    raw = (summary.metrics or {}).get(key) or {}
    out: dict[str, Any] = {"units": units, "mean": float(m.mean)}
    if raw.get("std") is not None:
        out["stddev"] = float(raw["std"])
    if raw.get("min") is not None:
        out["min"] = float(raw["min"])
    out.update({theirs: float(raw[ours]) for ours, theirs in _KEYS.items() if raw.get(ours) is not None})
    out["max"] = float(m.max)
    return out


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _length(summary: RunSummary, key: str) -> dict | None:
    """A sequence length as the workload's description: fixed when every request had the same, else its mean."""
    m = metric_stats(summary, key)
    if not m.count or m.mean < 1:
        return None
    fixed = m.max == ((summary.metrics or {}).get(key) or {}).get("min")
    return {"distribution": "fixed" if fixed else "other", "value": round(float(m.mean), 3)}


def load(run: Any, s: RunSummary, version: str) -> dict:
    """``scenario.load``: what was sent, as the schema describes a workload generator."""
    opts = run.config.get("options", {})
    # the options given (config.json's: secrets already "***", URLs' credentials redacted when written)
    given = {f"--{k.replace('_', '-')}": v for k, v in sorted(opts.items()) if v not in (None, "", [], False, 0, "***")}
    rate = float(opts.get("request_rate") or 0.0)
    step_kind, level = opts.get("sweep_level_kind"), opts.get("vllm_load_step_users")
    standardized: dict[str, Any] = {
        "tool": "vllm-load", "tool_version": version,
        "source": "sampled" if any(opts.get(k) for k in _SAMPLED) else "random",
        "stage": int(run.config.get("sweep_step") or 0)}
    for name, key in (("input_seq_len", INPUT_TOKENS), ("output_seq_len", OUTPUT_TOKENS)):
        if (length := _length(s, key)) is not None:
            standardized[name] = length
    if step_kind == "rate" and level:
        standardized["rate_qps"] = float(level)
    elif rate > 0:
        standardized["rate_qps"] = rate
    else:
        users = level if step_kind == "users" and level else (run.plan.total_users if run.plan else None)
        if users:
            standardized["concurrency"] = int(users)
    cfg_id = hashlib.sha256(json.dumps(given, sort_keys=True, default=str).encode()).hexdigest()[:32]
    return {"metadata": {"schema_version": "0.0.1", "cfg_id": cfg_id,
                         "description": f"vllm-load run {run.config.get('run_id')}"},
            "standardized": standardized, "native": {"args": given}}


def llmd_report(run: Any, version: str = "") -> dict:
    """The Benchmark Report v0.2 of one run directory (``vllm_load.report.html.build`` writes it)."""
    s = RunSummary.of(run.summary)
    duration = float(s.duration_s or 0.0)
    succeeded, tokens_in, tokens_out = int(s.succeeded or 0), int(s.input_tokens or 0), int(s.output_tokens or 0)

    def rate(n: float, units: str) -> dict:
        return {"units": units, "mean": n / duration if duration else 0.0}

    latency = {name: stats for name, key, units in (
        ("time_to_first_token", TTFT, "s"), ("time_per_output_token", TPOT, "s/token"),
        ("inter_token_latency", ITL, "s/token"), ("request_latency", E2E, "s"))
        if (stats := statistics(s, key, units)) is not None}
    requests: dict[str, Any] = {"total": int(s.requests or 0), "failures": int(s.failed or 0)}
    for name, key in (("input_length", INPUT_TOKENS), ("output_length", OUTPUT_TOKENS)):
        if (stats := statistics(s, key, "count")) is not None:
            requests[name] = stats
    uid = str(run.config.get("run_id"))  # a sweep step's is RUN/stepNN: its sweep is the experiment
    report: dict[str, Any] = {
        "version": VERSION,
        "run": {"uid": uid, "eid": uid.split("/")[0],
                "time": {"start": _iso(run.start), "end": _iso(run.start + duration), "duration": f"PT{duration}S"}},
        "scenario": {"load": load(run, s, version)},
        "results": {"request_performance": {"aggregate": {
            "requests": requests, "latency": latency,
            "throughput": {"input_token_rate": rate(tokens_in, "tokens/s"),
                           "output_token_rate": rate(tokens_out, "tokens/s"),
                           "total_token_rate": rate(tokens_in + tokens_out, "tokens/s"),
                           "request_rate": rate(succeeded, "queries/s")}}}},
    }
    return report
