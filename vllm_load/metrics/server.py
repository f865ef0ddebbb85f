"""The server side of a run in a few numbers: maxima and totals over the sidecar's samples in the window."""

from __future__ import annotations


def server_summary(series: list[dict]) -> dict | None:
    """What server-side SLOs read: maxima and totals over the run's window."""
    if not series:
        return None

    def mx(key: str) -> float | None:
        vals = [s[key] for s in series if s.get(key) is not None]
        return max(vals) if vals else None

    first, last = series[0], series[-1]

    def delta(key: str) -> float | None:
        if last.get(key) is None or first.get(key) is None:
            return None
        return last[key] - first[key]

    queries, hits = delta("prefix_cache_queries_total"), delta("prefix_cache_hits_total")
    gauge_rate = None
    if queries is None:  # V0 servers only have a hit-rate gauge
        rates = [s["prefix_cache_hit_rate_gauge"] for s in series if s.get("prefix_cache_hit_rate_gauge") is not None]
        gauge_rate = max(rates) if rates else None
    out = {
        "kv_cache_usage.max": mx("kv_cache_usage"),
        "waiting.max": mx("waiting"),
        "running.max": mx("running"),
        "preemptions": delta("preemptions_total"),
        "prefix_cache_hit_rate": (hits / queries) if queries else 0.0 if queries == 0 else gauge_rate,
    }
    if last.get("emulator_chunks") is not None:  # the embedded emulator's own lateness over the window
        out["emulator_chunks"], out["emulator_late_chunks"] = delta("emulator_chunks"), delta("emulator_late_chunks")
    return out
