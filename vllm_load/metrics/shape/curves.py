"""Latency curves a run's requests draw: TTFT against the prompt's length (the prefill curve of a run whose prompts
vary, ``--input-tokens 128-8192``), and ITL against the concurrency of a sweep's levels (the decode curve).

Each is its points and a least-squares line through them: the prefill curve's TTFT p50 per bin of 8 equal-count
bins of the requests by input length (``intercept_ms`` + ``ms_per_1k_tokens``: what a prompt costs before its
first token, and the fixed part), the decode curve's ITL p50 per level (``ms_per_user``: what one more concurrent
stream adds to every token). A run whose prompts are all about one length (the longest under twice the shortest),
or with fewer than 16 measured requests, has no prefill curve; a sweep of fewer than 3 levels no decode curve."""

from __future__ import annotations

import statistics
from typing import Any

from vllm_load.metric_table import INPUT_TOKENS, TTFT
from vllm_load.metrics.records import nearest_rank

BINS = 8
MIN_REQUESTS = 16


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """The least-squares line through the points: (intercept, slope)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - slope * mx, slope


def prefill_curve(logs: list[dict[str, Any]]) -> dict | None:
    """TTFT p50/p90 by input length, and its line (None without the spread or the requests to draw one)."""
    ok = sorted((int(r[INPUT_TOKENS]), float(r[TTFT])) for r in logs
                if r.get("ok") and not r.get("warmup") and r.get(TTFT) is not None and r.get(INPUT_TOKENS))
    if len(ok) < MIN_REQUESTS or ok[-1][0] < 2 * ok[0][0]:
        return None
    points = []
    for i in range(BINS):
        part = ok[i * len(ok) // BINS:(i + 1) * len(ok) // BINS]
        ttfts = [t for _, t in part]
        points.append({"tokens": statistics.median(n for n, _ in part), "requests": len(part),
                       "ttft_p50": statistics.median(ttfts), "ttft_p90": nearest_rank(sorted(ttfts), 90)})
    intercept, slope = fit([p["tokens"] for p in points], [p["ttft_p50"] for p in points])
    return {"points": points, "intercept_ms": intercept * 1000, "ms_per_1k_tokens": slope * 1e6,
            "tokens_range": [ok[0][0], ok[-1][0]]}


def prefill_from_logs(logs: list[dict[str, Any]], options: Any) -> dict | None:
    """The prefill-curve feature's part (``features/prefill_curve.py``): the curve, where the run draws one."""
    return prefill_curve(logs)


def decode_curve(levels: list[float], itl_p50: list[float | None]) -> dict | None:
    """ITL p50 by concurrency across a sweep's levels, and its line (None under 3 distinct levels with an ITL: three
    repeats of one level printed "a decode curve ... (3 levels, 4-4 users)")."""
    pairs = [(float(u), float(i)) for u, i in zip(levels, itl_p50) if i is not None]
    if len({u for u, _ in pairs}) < 3:
        return None
    intercept, slope = fit([u for u, _ in pairs], [i for _, i in pairs])
    return {"points": [{"users": u, "itl_p50": i} for u, i in pairs], "intercept_ms": intercept * 1000,
            "ms_per_user": slope * 1000}


def describe_decode(c: dict) -> str:
    users = [p["users"] for p in c["points"]]
    return (f"decode curve: ITL p50 {c['intercept_ms']:.2f} ms + {c['ms_per_user']:.3f} ms per concurrent user "
            f"({len(set(users))} levels, {min(users):g}-{max(users):g} users)")
