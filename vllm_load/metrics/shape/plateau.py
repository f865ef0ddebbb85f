"""The TPOT plateau: where a run (or a sweep step) reached its steady state, by the decode speed its requests saw,
not merely once every user was spawned. MLPerf Endpoints takes the detected steady-state window (a TPOT p50/p90
plateau) as a point's official basis; this is vllm-load's detector of that window, exact from the request logs.

The successful requests, by their end, fall in ``BINS`` bins of equal count; each bin's TPOT p50 and p90 (nearest
rank). The plateau starts at the first bin from which every later bin's p50 and p90 lie within ``TOLERANCE`` of the
median of those later bins' own: a ramp's early bins (a queue still filling, a batch still growing) fall outside
and are left before the window. Fewer than ``LEAST`` requests: no window (said, never guessed). The window's point
is the one an Endpoints Pareto sweep plots: ``tps_per_user`` = 1 / TPOT p90 (1000 / ms), ``system_tps`` = the output
tokens of the requests that ended in the window over its length, with TTFT p90 (the first token, reasoning's
included)."""

from __future__ import annotations

import statistics

from vllm_load.metric_table import E2E, OUTPUT_TOKENS, TPOT, TTFT
from vllm_load.metrics.records import measured, nearest_rank

BINS = 8
TOLERANCE = 0.10
LEAST = 40  # requests: 5 per bin at the least


def _p50_p90(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return nearest_rank(ordered, 50), nearest_rank(ordered, 90)


def plateau_start(tpots: list[float]) -> int | None:
    """The index (into ``tpots``, in order of the requests' ends) where the plateau starts; None: too few, or the
    TPOT still moving in the last bins (no plateau was reached)."""
    n = len(tpots)
    if n < LEAST:
        return None
    edges = [round(i * n / BINS) for i in range(BINS + 1)]
    bins = [_p50_p90(tpots[a:b]) for a, b in zip(edges, edges[1:])]
    for first in range(BINS - 1):  # the last two bins at least
        later = bins[first:]
        p50, p90 = statistics.median(b[0] for b in later), statistics.median(b[1] for b in later)
        if all(abs(b[0] - p50) <= TOLERANCE * p50 and abs(b[1] - p90) <= TOLERANCE * p90 for b in later):
            return edges[first]
    return None


def steady_point(logs: list[dict]) -> dict:
    """The plateau's window of these request records and its point, or why there is none (``reason``)."""
    ok = sorted((r for r in logs if measured(r) and r.get("ok") and r.get(TPOT) is not None),
                key=lambda r: r["start"] + r[E2E])
    start = plateau_start([r[TPOT] for r in ok])
    if start is None:
        return {"reason": f"{len(ok)} requests with a TPOT: a plateau needs {LEAST}" if len(ok) < LEAST else
                f"no plateau: the last two of {BINS} bins' TPOT p50 or p90 differ by more than {TOLERANCE:.0%}"}
    kept = ok[start:]
    begin, end = kept[0]["start"] + kept[0][E2E], kept[-1]["start"] + kept[-1][E2E]
    if start:  # the window opens where the last request before it ended
        begin = ok[start - 1]["start"] + ok[start - 1][E2E]
    tpot_p50, tpot_p90 = _p50_p90([r[TPOT] for r in kept])
    ttfts = sorted(r[TTFT] for r in kept if r.get(TTFT) is not None)
    length = end - begin
    inside = kept if start else kept[1:]  # the requests that ended after the window opened
    return {"window_s": [begin, end], "requests": len(kept), "left_before": start,
            "tpot_p50": tpot_p50, "tpot_p90": tpot_p90,
            "ttft_p90": nearest_rank(ttfts, 90) if ttfts else None,
            "tps_per_user": 1.0 / tpot_p90 if tpot_p90 > 0 else None,
            "system_tps": sum(r[OUTPUT_TOKENS] for r in inside) / length if length > 0 else None}
