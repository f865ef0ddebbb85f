"""The server side from a Prometheus that already scrapes vLLM (kube-prometheus and the like), instead of the
sidecar: the same sample schema as the sidecar's ``server.jsonl``, read with ``query_range`` over the run's
window, one sample per second, aggregated over the series ``--prometheus-selector`` picks (e.g. every pod of
a deployment: gauges summed, KV usage the maximum, counters summed)."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request

from vllm_load.client.apis.openai_api import auth_header

#: sample key -> PromQL over vLLM 0.32's names ({sel} is the selector); the sidecar's keys
QUERIES = {
    "running": "sum(vllm:num_requests_running{sel})",
    "waiting": "sum(vllm:num_requests_waiting{sel})",
    "kv_cache_usage": "max(vllm:kv_cache_usage_perc{sel})",
    "preemptions_total": "sum(vllm:num_preemptions_total{sel})",
    "prompt_tokens_total": "sum(vllm:prompt_tokens_total{sel})",
    "generation_tokens_total": "sum(vllm:generation_tokens_total{sel})",
    "prompt_tokens_rate": "sum(rate(vllm:prompt_tokens_total{sel}[15s]))",
    "generation_tokens_rate": "sum(rate(vllm:generation_tokens_total{sel}[15s]))",
    "prefix_cache_queries_total": "sum(vllm:prefix_cache_queries_total{sel})",
    "prefix_cache_hits_total": "sum(vllm:prefix_cache_hits_total{sel})",
    "spec_drafts_total": "sum(vllm:spec_decode_num_drafts_total{sel})",
    "spec_draft_tokens_total": "sum(vllm:spec_decode_num_draft_tokens_total{sel})",
    "spec_accepted_tokens_total": "sum(vllm:spec_decode_num_accepted_tokens_total{sel})",
    # one series per draft position: the sample holds {position: total}
    "spec_accepted_per_pos_total": "sum by (position) (vllm:spec_decode_num_accepted_tokens_per_pos_total{sel})",
}


def check_selector(selector: str, flag: str = "--prometheus-selector") -> str | None:
    """None, or why ``selector`` is not a PromQL label selector."""
    sel = selector.strip()
    if sel and not (sel.startswith("{") and sel.endswith("}")):
        return f"{flag} {selector!r} is not a label selector like '{{pod=~\"vllm.*\"}}'"
    return None


def query_range(url: str, query: str, start: float, end: float, token: str = "", step: float = 1.0,
                timeout: float = 15.0) -> tuple[list[dict], str | None]:
    """(the matrix's series, None) or ([], why not): one ``/api/v1/query_range`` call."""
    params = urllib.parse.urlencode({"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": step})
    req = urllib.request.Request(url.rstrip("/") + "/api/v1/query_range?" + params,
                                 headers=auth_header(token))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return [], f"Prometheus at {url} answered HTTP {exc.code} to {query}"
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
        return [], f"Prometheus at {url} cannot be read ({getattr(exc, 'reason', exc) or type(exc).__name__})"
    if data.get("status") != "success":
        return [], f"Prometheus at {url} refused {query}: {data.get('error', data.get('status'))}"
    return data.get("data", {}).get("result", []), None


def fetch_range(url: str, selector: str, start: float, end: float, token: str = "", step: float = 1.0,
                timeout: float = 15.0) -> tuple[list[dict], str | None]:
    """(samples on our clock, None) or ([], why the server side is missing)."""
    why = check_selector(selector)
    if why:
        return [], why
    sel = selector.strip()
    by_time: dict[float, dict] = {}
    for key, template in QUERIES.items():
        result, why = query_range(url, template.replace("{sel}", sel), start, end, token, step, timeout)
        if why:
            return [], why
        for series in result:
            position = (series.get("metric") or {}).get("position")
            for t, value in series.get("values", []):
                sample = by_time.setdefault(float(t), {"t": float(t), "source": "prometheus"})
                if position is None:
                    sample[key] = float(value)
                else:
                    sample.setdefault(key, {})[position] = float(value)
    samples = [by_time[t] for t in sorted(by_time)]
    if not samples:
        return [], f"Prometheus at {url} has no vLLM series for {sel or 'any target'} in the run's window"
    return samples, None


