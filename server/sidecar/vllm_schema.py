"""One schema for vLLM's server-side state, whatever vLLM version or source it came from.

``parse_metrics`` reads Prometheus text with ``prometheus_client``'s parser and maps old and new
names onto one sample (V0 ``gpu_cache_usage_perc`` and V1 ``kv_cache_usage_perc`` both become
``kv_cache_usage``; ``time_per_output_token_seconds`` and ``inter_token_latency_seconds`` both become
the ``itl`` histogram; ``gpu_prefix_cache_*`` and ``prefix_cache_*`` both become ``prefix_cache_*``).
``parse_log_line`` reads vLLM's periodic stats log line (V0 and V1 formats) into the same keys, for
servers whose /metrics is off. ``derive`` turns two consecutive samples into per-interval rates and
histogram deltas.
"""

from __future__ import annotations

import re
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# schema key -> vLLM names, newest first (family names as the parser gives them: counters without _total)
GAUGES = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "swapped": ("vllm:num_requests_swapped",),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "cpu_cache_usage": ("vllm:cpu_cache_usage_perc",),
    "prefix_cache_hit_rate_gauge": ("vllm:gpu_prefix_cache_hit_rate",),
    "avg_prompt_throughput": ("vllm:avg_prompt_throughput_toks_per_s",),
    "avg_generation_throughput": ("vllm:avg_generation_throughput_toks_per_s",),
    # the emulator's own (not vLLM's): chunks produced on its schedule, and those over 10 ms late
    "emulator_chunks": ("vllm_emulator:emissions",),
    "emulator_late_chunks": ("vllm_emulator:late_emissions",),
}
COUNTERS = {
    "preemptions_total": ("vllm:num_preemptions",),
    "prompt_tokens_total": ("vllm:prompt_tokens",),
    "generation_tokens_total": ("vllm:generation_tokens",),
    "prefix_cache_queries_total": ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
    "prefix_cache_hits_total": ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
    # the multimodal processor cache, in items (images, clips, videos)
    "mm_cache_queries_total": ("vllm:mm_cache_queries",),
    "mm_cache_hits_total": ("vllm:mm_cache_hits",),
    # speculative decoding (only when the server runs a drafter)
    "spec_drafts_total": ("vllm:spec_decode_num_drafts",),
    "spec_draft_tokens_total": ("vllm:spec_decode_num_draft_tokens",),
    "spec_accepted_tokens_total": ("vllm:spec_decode_num_accepted_tokens",),
    # KV connectors (vLLM 0.32: vllm/distributed/kv_transfer/kv_connector/v1/, vllm/v1/metrics/loggers.py), only
    # on a server that runs one: hits served by a connector (LMCache, offload), P/D's NIXL failures, KV offload's
    # bytes and seconds moved between the GPU and the offload medium
    "external_prefix_cache_queries_total": ("vllm:external_prefix_cache_queries",),
    "external_prefix_cache_hits_total": ("vllm:external_prefix_cache_hits",),
    "nixl_failed_transfers_total": ("vllm:nixl_num_failed_transfers",),
    "nixl_failed_notifications_total": ("vllm:nixl_num_failed_notifications",),
    "nixl_expired_requests_total": ("vllm:nixl_num_kv_expired_reqs",),
    "kv_offload_load_bytes_total": ("vllm:kv_offload_load_bytes",),
    "kv_offload_load_seconds_total": ("vllm:kv_offload_load_time",),
    "kv_offload_store_bytes_total": ("vllm:kv_offload_store_bytes",),
    "kv_offload_store_seconds_total": ("vllm:kv_offload_store_time",),
}
#: accepted draft tokens per draft position: schema key -> position -> total
PER_POSITION = {"spec_accepted_per_pos_total": "vllm:spec_decode_num_accepted_tokens_per_pos"}
HISTOGRAMS = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "tpot_request": ("vllm:request_time_per_output_token_seconds",),
    "e2e": ("vllm:e2e_request_latency_seconds",),
    "queue": ("vllm:request_queue_time_seconds",),
    "inference": ("vllm:request_inference_time_seconds",),
    "prefill": ("vllm:request_prefill_time_seconds",),
    "decode": ("vllm:request_decode_time_seconds",),
    # P/D's KV transfers over NIXL (nixl/stats.py): each transfer's time and bytes
    "nixl_xfer_time": ("vllm:nixl_xfer_time_seconds",),
    "nixl_bytes": ("vllm:nixl_bytes_transferred",),
}
#: Gauges where several engines/models are summed (request counts) rather than maxed (usages).
_SUMMED = {"running", "waiting", "swapped"}


def parse_metrics(text: str) -> dict[str, Any]:
    """A sample from one /metrics scrape (without its timestamp)."""
    families = {f.name: f for f in text_string_to_metric_families(text)}
    out: dict[str, Any] = {}
    for key, names in GAUGES.items():
        for name in names:
            fam = families.get(name)
            if fam and fam.samples:
                values = [s.value for s in fam.samples if s.name == name]
                if values:
                    out[key] = sum(values) if key in _SUMMED else max(values)
                    break
    for key, names in COUNTERS.items():
        for name in names:
            fam = families.get(name)
            if fam and fam.samples:
                out[key] = sum(s.value for s in fam.samples if s.name.endswith("_total"))
                break
    for key, name in PER_POSITION.items():
        fam = families.get(name)
        if fam and fam.samples:
            per: dict[str, float] = {}
            for s in fam.samples:
                if s.name.endswith("_total"):
                    per[s.labels.get("position", "")] = per.get(s.labels.get("position", ""), 0.0) + s.value
            out[key] = per
    fam = families.get("vllm:cache_config_info")
    sizes = [s.labels.get("block_size", "") for s in fam.samples] if fam else []
    if sizes and all(x.isdigit() for x in sizes):  # the KV block the prefix cache hits in whole
        out["block_size"] = max(int(x) for x in sizes)
    fam = families.get("vllm:request_success")
    if fam:
        reasons: dict[str, float] = {}
        for s in fam.samples:
            if s.name.endswith("_total"):
                r = s.labels.get("finished_reason", "")
                reasons[r] = reasons.get(r, 0.0) + s.value
        out["request_success_total"] = reasons
    hists: dict[str, Any] = {}
    for key, names in HISTOGRAMS.items():
        for name in names:
            fam = families.get(name)
            if not fam or not fam.samples:
                continue
            buckets: dict[str, float] = {}
            total = count = 0.0
            for s in fam.samples:
                if s.name == name + "_bucket":
                    buckets[s.labels["le"]] = buckets.get(s.labels["le"], 0.0) + s.value
                elif s.name == name + "_sum":
                    total += s.value
                elif s.name == name + "_count":
                    count += s.value
            ordered = sorted(buckets.items(), key=lambda kv: float(kv[0]))
            hists[key] = {"buckets": [[float(le), c] for le, c in ordered], "sum": total, "count": count}
            break
    out["histograms"] = hists
    return out


_V1 = re.compile(
    r"Avg prompt throughput: (?P<prompt>[\d.]+) tokens/s, Avg generation throughput: (?P<gen>[\d.]+) tokens/s, "
    r"Running: (?P<running>\d+) reqs, Waiting: (?P<waiting>\d+) reqs, (?:Preemptions: (?P<preempt>\d+), )?"
    r"GPU KV cache usage: (?P<kv>[\d.]+)%(?:, Prefix cache hit rate: (?P<hit>[\d.]+)%)?")
_V0 = re.compile(
    r"Avg prompt throughput: (?P<prompt>[\d.]+) tokens/s, Avg generation throughput: (?P<gen>[\d.]+) tokens/s, "
    r"Running: (?P<running>\d+) reqs, Swapped: (?P<swapped>\d+) reqs, Pending: (?P<waiting>\d+) reqs, "
    r"GPU KV cache usage: (?P<kv>[\d.]+)%, CPU KV cache usage: (?P<cpu>[\d.]+)%")


def parse_log_line(line: str) -> dict[str, Any] | None:
    """A sample from one stats log line, or None when the line is not one."""
    m = _V1.search(line)
    if m:
        out: dict[str, Any] = {"running": int(m["running"]), "waiting": int(m["waiting"]),
                               "kv_cache_usage": float(m["kv"]) / 100, "prompt_tokens_rate": float(m["prompt"]),
                               "generation_tokens_rate": float(m["gen"]), "source": "log-v1"}
        if m["preempt"] is not None:
            out["preemptions_interval"] = int(m["preempt"])
        if m["hit"] is not None:
            out["prefix_cache_hit_rate_gauge"] = float(m["hit"]) / 100
        return out
    m = _V0.search(line)
    if m:
        return {"running": int(m["running"]), "waiting": int(m["waiting"]), "swapped": int(m["swapped"]),
                "kv_cache_usage": float(m["kv"]) / 100, "cpu_cache_usage": float(m["cpu"]) / 100,
                "prompt_tokens_rate": float(m["prompt"]), "generation_tokens_rate": float(m["gen"]),
                "source": "log-v0"}
    return None


def _hist_delta(cur: dict, prev: dict | None) -> dict:
    if not prev or len(prev["buckets"]) != len(cur["buckets"]) or cur["count"] < prev["count"]:
        return cur  # first scrape, or the server restarted: the totals are the delta
    return {"buckets": [[le, c - p] for (le, c), (_, p) in zip(cur["buckets"], prev["buckets"])],
            "sum": cur["sum"] - prev["sum"], "count": cur["count"] - prev["count"]}


def derive(cur: dict, prev: dict | None) -> dict:
    """Add per-interval rates (per second) and histogram deltas to ``cur``, against ``prev``."""
    if prev is None or "t" not in prev:
        return cur
    dt = cur["t"] - prev["t"]
    if dt <= 0:
        return cur
    for total, rate in (("prompt_tokens_total", "prompt_tokens_rate"), ("generation_tokens_total", "generation_tokens_rate"),
                        ("preemptions_total", "preemptions_rate")):
        if total in cur and total in prev and cur[total] >= prev[total]:
            cur[rate] = (cur[total] - prev[total]) / dt
    q0, q1 = prev.get("prefix_cache_queries_total"), cur.get("prefix_cache_queries_total")
    h0, h1 = prev.get("prefix_cache_hits_total"), cur.get("prefix_cache_hits_total")
    if None not in (q0, q1, h0, h1) and q1 > q0:
        cur["prefix_cache_hit_rate"] = (h1 - h0) / (q1 - q0)
    cur["histogram_deltas"] = {k: _hist_delta(v, prev.get("histograms", {}).get(k))
                               for k, v in cur.get("histograms", {}).items()}
    return cur
