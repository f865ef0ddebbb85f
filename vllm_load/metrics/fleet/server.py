"""The server side of a run in a few numbers: maxima and totals over the sidecar's samples in the window."""

from __future__ import annotations

from typing import Any


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
    if hits is not None:  # tokens: the routing verdict's achieved hits when the answers carry none
        out["prefix_cache_hits"] = hits
    if last.get("block_size"):  # the KV block (vllm:cache_config_info): the routing verdict counts hits in it
        out["block_size"] = int(last["block_size"])
    mm_queries = delta("mm_cache_queries_total")
    if mm_queries:  # items: a multimodal run's images, clips and videos the processor cache already held
        out["mm_cache_queries"], out["mm_cache_hits"] = mm_queries, delta("mm_cache_hits_total") or 0.0
    if last.get("emulator_chunks") is not None:  # the embedded emulator's own lateness over the window
        out["emulator_chunks"], out["emulator_late_chunks"] = delta("emulator_chunks"), delta("emulator_late_chunks")
    spec = spec_decode(first, last)
    if spec is not None:
        out["spec_decode"] = spec
    kv = kv_connector(first, last, delta)
    if kv:
        out["kv_connector"] = kv
    return out


def kv_connector(first: dict, last: dict, delta: Any) -> dict:
    """A KV connector's work over the window (present only on a server that runs one): NIXL's transfers (count, mean
    time, bytes, failures), the prefix-cache hits a connector served, KV offload's bytes loaded and stored."""
    out: dict[str, float] = {}
    h0, h1 = (first.get("histograms") or {}), (last.get("histograms") or {})

    def moved(key: str, field: str) -> float:  # a histogram's count or sum, its increase over the window
        return h1[key][field] - (h0.get(key) or {}).get(field, 0.0)

    if "nixl_xfer_time" in h1:
        out["nixl_transfers"], out["nixl_seconds"] = moved("nixl_xfer_time", "count"), moved("nixl_xfer_time", "sum")
    if "nixl_bytes" in h1:
        out["nixl_bytes"] = moved("nixl_bytes", "sum")
    for key in ("nixl_failed_transfers_total", "external_prefix_cache_hits_total", "external_prefix_cache_queries_total",
                "kv_offload_load_bytes_total", "kv_offload_store_bytes_total"):
        value = delta(key)
        if value is not None:
            out[key.removesuffix("_total")] = value
    return out


def spec_decode(first: dict, last: dict) -> dict | None:
    """Speculative decoding over a window, as ``vllm bench serve`` computes it from /metrics before and after a
    run: acceptance rate = accepted / draft tokens (%), acceptance length = 1 + accepted / drafts, and per draft
    position the accepted share of drafts. None when the server drafted nothing in the window."""
    keys = ("spec_drafts_total", "spec_draft_tokens_total", "spec_accepted_tokens_total")
    if any(last.get(k) is None or first.get(k) is None for k in keys):
        return None
    drafts, draft_tokens, accepted = (last[k] - first[k] for k in keys)
    if draft_tokens <= 0:
        return None
    before, after = first.get("spec_accepted_per_pos_total") or {}, last.get("spec_accepted_per_pos_total") or {}
    positions = sorted(set(before) | set(after), key=lambda p: int(p) if str(p).isdigit() else 0)
    return {
        "num_drafts": int(drafts),
        "draft_tokens": int(draft_tokens),
        "accepted_tokens": int(accepted),
        "acceptance_rate": accepted / draft_tokens * 100,
        "acceptance_length": 1 + accepted / drafts if drafts > 0 else 0.0,
        "per_position_acceptance_rates": [(after.get(p, before.get(p, 0)) - before.get(p, 0)) / drafts
                                          for p in positions] if drafts > 0 else [],
    }
