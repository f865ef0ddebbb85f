"""The run as MLPerf Endpoints' performance report (``performance/result_summary.json``): its publishing and plotting
scripts read a vllm-load run, and each sweep step (a run directory of its own) is one point of a Pareto sweep.

Fields follow ``inference_endpoint/metrics/report.py``'s ``Report`` (mlcommons/endpoints): the sample counts,
``duration_ns``, ``state``/``complete``, the rollups ``ttft``, ``tpot``, ``latency`` (ns) and
``output_sequence_lengths`` (tokens) — plus ``input_sequence_lengths``, which its report design lists — each
``total``, ``min``, ``max``, ``median``, ``avg``, ``std_dev``, ``percentiles`` (``{"50": …}``) and ``histogram``
(``buckets`` as [lo, hi) pairs, the last closed, and their ``counts``), ``qps``/``tps`` over the run's window
(completed requests and output tokens per second; the LoadGen legacy window is not used: None), ``run_config``.
The statistics are the exact histograms'; a histogram's buckets come from the request logs (ten equal widths).
Beside them, the two numbers an Endpoints Pareto point plots: ``tps_per_user`` (1000 / TPOT p90 in ms) and
``system_tps``, over the detected TPOT plateau (``steady_state``: its window, or why there is none; then over the
whole run: ``metrics/shape/plateau.py``). It is a qualification run's point, not a submission: the benchmark's own client, dataset and rules
make one.
"""

from __future__ import annotations

from typing import Any

from vllm_load.version import __version__
from vllm_load.metric_table import E2E, INPUT_TOKENS, OUTPUT_TOKENS, TPOT, TTFT
from vllm_load.metrics.shape.plateau import steady_point
from vllm_load.metrics.summary import RunSummary, metric_stats

#: our percentile keys -> theirs
_PERCENTILES = {"p50": "50", "p90": "90", "p95": "95", "p99": "99", "p99.9": "99.9"}
BUCKETS = 10


def histogram(values: list[float]) -> dict:
    """Ten equal-width buckets over [min, max] (the last closed), as Endpoints' report shapes one."""
    if not values:
        return {"buckets": [], "counts": []}
    lo, hi = min(values), max(values)
    width = (hi - lo) / BUCKETS or 1.0
    edges = [lo + i * width for i in range(BUCKETS)] + [hi]
    counts = [0] * BUCKETS
    for v in values:
        counts[min(BUCKETS - 1, int((v - lo) / width))] += 1
    return {"buckets": [[edges[i], edges[i + 1]] for i in range(BUCKETS)], "counts": counts}


def rollup(summary: RunSummary, key: str, values: list[float], scale: float, total: float | None = None) -> dict:
    """One metric's rollup ({} when never measured): times scaled to ns (``scale`` 1e9), token counts as they are."""
    m = metric_stats(summary, key)
    if not m.count:
        return {}
    raw = (summary.metrics or {}).get(key) or {}

    def v(x: Any) -> float | int:
        return int(round(float(x) * scale)) if scale != 1 else float(x)

    return {"total": v(m.mean * m.count) if total is None else total, "min": v(raw.get("min", m.mean)),
            "max": v(m.max), "median": v(m.at("p50")), "avg": float(m.mean) * scale,
            "std_dev": float(raw.get("std") or 0.0) * scale,
            "percentiles": {theirs: v(raw[ours]) for ours, theirs in _PERCENTILES.items() if raw.get(ours) is not None},
            "histogram": histogram([x * scale for x in values])}


def mlperf_result(run: Any, logs: list[dict]) -> dict:
    """``result_summary.json`` of one run directory (``vllm_load.report.html.build`` writes it)."""
    s = RunSummary.of(run.summary)
    ok = [r for r in logs if r.get("ok") and not r.get("warmup") and not r.get("removed")]
    duration = float(s.duration_s or 0.0)
    completed, tokens_out = int(s.succeeded or 0), int(s.output_tokens or 0)
    opts, plan = run.config.get("options", {}), run.plan
    rate = float(opts.get("request_rate") or 0.0)
    users = opts.get("vllm_load_step_users") or (plan.total_users if plan else None)
    pattern = ({"type": "poisson", "target_qps": rate} if rate > 0 else {"type": "concurrency",
                                                                         "target_concurrency": users})
    tpot_p90 = metric_stats(s, TPOT).at("p90") if metric_stats(s, TPOT).count else None
    steady = steady_point(logs)  # the TPOT plateau: the point's basis when there is one
    return {
        "version": f"vllm-load {__version__}", "git_sha": None, "test_started_at": 0,
        "n_samples_issued": int(s.requests or 0), "n_samples_completed": completed,
        "n_samples_failed": int(s.failed or 0), "duration_ns": int(duration * 1e9) if duration else None,
        "state": "complete", "complete": True,
        "ttft": rollup(s, TTFT, [r[TTFT] for r in ok if r.get(TTFT) is not None], 1e9),
        "tpot": rollup(s, TPOT, [r[TPOT] for r in ok if r.get(TPOT) is not None], 1e9),
        "latency": rollup(s, E2E, [r[E2E] for r in ok if r.get(E2E) is not None], 1e9),
        # a pooling request or a whole transcription generates no counted output (None): left out, as the metric does
        "input_sequence_lengths": rollup(s, INPUT_TOKENS, [r[INPUT_TOKENS] for r in ok if r.get(INPUT_TOKENS) is not None],
                                         1, int(s.input_tokens or 0)),
        "output_sequence_lengths": rollup(s, OUTPUT_TOKENS, [r[OUTPUT_TOKENS] for r in ok
                                                            if r.get(OUTPUT_TOKENS) is not None], 1, tokens_out),
        "legacy_loadgen_window_duration_ns": None,
        "qps": completed / duration if duration else None, "tps": tokens_out / duration if duration else None,
        "run_config": {"load_pattern": pattern, "warmup_s": plan.warmup if plan else 0.0,
                       "seed": plan.seed if plan else None, "run_id": run.config.get("run_id")},
        "steady_state": steady,
        "tps_per_user": steady["tps_per_user"] if "window_s" in steady else 1.0 / tpot_p90 if tpot_p90 else None,
        "system_tps": steady["system_tps"] if "window_s" in steady else tokens_out / duration if duration else None,
    }


def pareto_point(run: Any) -> tuple[float, float] | None:
    """A run's (or sweep step's) Endpoints point, (system_tps, tps_per_user): its result_summary.json's when written,
    else computed from its logs (a sweep page over run directories of an older version)."""
    import json

    path = run.path / "performance" / "result_summary.json"
    if path.exists():
        point = json.loads(path.read_text())
    else:
        from vllm_load.report.exports.vllm_result import run_logs

        point = mlperf_result(run, run_logs(run))
    if point.get("system_tps") is None or point.get("tps_per_user") is None:
        return None
    return float(point["system_tps"]), float(point["tps_per_user"])
