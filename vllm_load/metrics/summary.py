"""The run summary's shape: what ``LLMStats.summary`` computes and the collector completes, as written to
llm_stats.json and summary.json and read by the verdict, the console, the web UI and the report."""

from __future__ import annotations

import re
from typing import Any, TypedDict

from vllm_load.metrics import outages
from vllm_load.metrics.histogram import PERCENTILES, percentile_key


class RunSummary(TypedDict, total=False):
    # counts and rates, from LLMStats.summary
    requests: int
    succeeded: int
    failed: int
    error_rate: float  # fraction of requests that failed
    duration_s: float
    request_rate: float  # successful requests per second
    send_rate: float  # arrivals per second between the first and last (intended) start
    input_tokens: int
    output_tokens: int
    output_token_rate: float
    usage_missing: int  # successful requests without server usage (tokens counted locally)
    input_drift_requests: int  # requests whose prompt length differed from what was asked
    input_drift_max_abs: int
    input_drift_fraction: float  # of the requests with server usage
    output_mismatch: int
    reasoning_tokens: int  # output tokens a reasoning model spent thinking (in output_tokens too)
    reasoning_requests: int  # successful requests whose stream carried reasoning
    reasoning_by_tokenizer: int  # of those, counted with the run's tokenizer (the server's stream gave no count)
    goodput: float | None  # requests/s meeting every per-request SLO, as vllm bench serve (None without one)
    good_request_fraction: float | None  # their share of the requests judged
    good_requests: int
    errors: dict[str, int]  # reason -> count, most common first
    metrics: dict[str, dict[str, float]]  # metrics.table key -> count, mean, min, percentiles, max
    outages: list[dict]  # outages.Window.to_json() plus "text"
    outage_seconds: float
    media_items: int  # images and audio clips sent, their prompt tokens (server's count minus the exact text
    media_tokens: int  # count) and the text's own
    text_input_tokens: int
    inputs: int  # pooling requests (embeddings, rerank): the inputs they carried, inputs/s and input tokens/s
    input_rate: float
    input_token_rate: float
    records_per_request: int  # only with a dataset
    records: int
    record_rate: float
    cached_tokens: int | None  # prompt tokens the server's usage reported as prefix-cache hits
    cached_fraction: float | None  # their share of those requests' prompt tokens
    warmup_excluded: int  # requests started during --warmup, left out of every number here
    backoffs: int  # closed loop: waits before a next request after a server error (and their total, seconds)
    backoff_s: float
    percentiles: list[str]  # the percentile columns every medium shows (--metric-percentiles; the standard five)
    names: dict[str, dict]  # name= -> the same summary for that group's requests (only when names were used)
    targets: dict[str, dict]  # --host a,b: each replica's URL -> the same summary for its requests
    # completed by the collector at the end of a run
    workers: list[str]
    workers_lost: list[str]
    shared_stamps: int  # chunk gaps of 0: two chunks of a stream under one receive stamp
    late_merged_gaps: int  # of those, made by the native reader's late reads (the rest landed together)
    workers_lost_at: dict[str, float | None]  # a lost worker -> seconds into the run of its last report (None: none)
    energy: dict | None  # metrics/energy.energy_summary over the run's window (--dcgm-url)
    energy_missing: str  # why a run with --dcgm-url has no energy block
    saturation: dict | None  # metrics/saturation.Finding.to_json(): when the server stopped keeping up
    processes: int  # a swarm: its load processes at the start, and how many got ready (sent READY to the master)
    processes_ready: int
    workers_missing: dict[str, float]  # a worker Locust marked missing (no heartbeat ~3 s) -> seconds into the run
    client: dict  # ClientHealth.verdict()
    target_request_rate: float
    trace: dict  # --trace: rows, sent, intended and achieved span (seconds)


#: the wire's metric names: 2 since itl means the per-chunk gap (vLLM's) and itl_token the per-token one
NAMES_VERSION = 2
#: metric keys before that: the old name -> today's
_OLD_NAMES = {"itl": "itl_token", "itl_chunk": "itl"}


def upgrade_wire(data: dict) -> dict:
    """Run dirs written before vLLM's names (itl per token, itl_chunk per chunk) read with today's names."""
    if data.get("names_version", 1) >= NAMES_VERSION:
        return data
    data = dict(data)
    data["hists"] = {_OLD_NAMES.get(k, k): v for k, v in data.get("hists", {}).items()}
    data["windows"] = {w: {_OLD_NAMES.get(m, m): h for m, h in ms.items()} for w, ms in data.get("windows", {}).items()}
    return data


def upgrade_summary(summary: dict) -> dict:
    """The same for a saved summary: metric keys, and goodput (then a share) as good_request_fraction."""
    if "good_request_fraction" in summary or "metrics" not in summary:
        return summary
    out = dict(summary)
    out["metrics"] = {_OLD_NAMES.get(k, k): v for k, v in summary["metrics"].items()}
    out["good_request_fraction"] = summary.get("goodput")
    duration = summary.get("duration_s") or 0.0
    out["goodput"] = summary.get("good_requests", 0) / duration if summary.get("goodput") is not None and duration else None
    return out


def name_order(name: str) -> list:
    """'turn 2' before 'turn 10': digits compare as numbers."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", name)]


def summarise(self: Any, duration: float | None = None, records_per_request: int = 0,
              outage_after: float | None = 2.0, now: float | None = None,
              percentiles: tuple[float, ...] = PERCENTILES, shown: tuple[float, ...] = PERCENTILES) -> RunSummary:
    """An ``LLMStats``' summary (``self``: its totals). ``records_per_request``: dataset records each request carries (``--dataset-batch``), for the
    records/s that a batching comparison is about; 0 when prompts are not dataset records. ``percentiles``:
    those computed (the run's --metric-percentiles, the standard ones and its SLOs'); ``shown``: the columns
    every medium shows (``summary["percentiles"]``)."""
    if duration is None:
        duration = (self.last_end - self.first_start) if self.first_start is not None else 0.0
    ok = self.requests - self.failures
    with_usage = ok - self.usage_missing
    out: RunSummary = {
        "requests": self.requests,
        "succeeded": ok,
        "failed": self.failures,
        "error_rate": self.failures / self.requests if self.requests else 0.0,
        "duration_s": duration,
        "request_rate": ok / duration if duration else 0.0,
        # arrivals per second between the first and the last request's (intended) start
        "send_rate": (self.requests - 1) / (self.last_start - self.first_start)
        if self.requests > 1 and self.last_start and self.first_start and self.last_start > self.first_start else 0.0,
        "input_tokens": self.input_tokens,
        "output_tokens": self.output_tokens,
        "output_token_rate": self.output_tokens / duration if duration else 0.0,
        "usage_missing": self.usage_missing,
        "input_drift_requests": self.drift_requests,
        "input_drift_max_abs": self.drift_max_abs,
        "input_drift_fraction": self.drift_requests / with_usage if with_usage > 0 else 0.0,
        "output_mismatch": self.output_mismatch,
        "reasoning_tokens": self.reasoning_tokens,
        "reasoning_requests": self.reasoning_requests,
        "reasoning_by_tokenizer": self.reasoning_by_tokenizer,
        # the server's prefix-cache hits as its usage reported them per request (None: it reported none)
        "cached_tokens": self.cached_tokens if self.cached_of else None,
        "cached_fraction": self.cached_tokens / self.cached_of if self.cached_of else None,
        # vllm bench serve's goodput: requests/s that met every per-request SLO; and their share
        "goodput": self.good / duration if self.judged and duration else None,
        "good_request_fraction": self.good / self.judged if self.judged else None,
        "good_requests": self.good,
        "warmup_excluded": self.warmup_excluded,
        "backoffs": self.backoffs,
        "backoff_s": self.backoff_ms / 1000.0,
        "errors": dict(self.errors.most_common()),
        "error_examples": {k: self.error_examples.get(k, k) for k in self.errors},
        "metrics": {k: h.summary(percentiles) for k, h in self.hists.items()},
        "percentiles": [percentile_key(p) for p in shown],
        # chunk gaps of 0: two chunks of a stream under one receive stamp (a late read merges them, or the
        # server wrote them together)
        "shared_stamps": self.hists["itl"].at_most_1ns(),
        # of those, the ones a late read of the native reader made (the others landed together: the server's)
        "late_merged_gaps": self.late_merged,
    }
    # outage_after None: no outage windows (the web UI's live table polls this and shows none)
    windows = self.outage_windows(outage_after, now) if outage_after is not None else []
    start = self.first_start or 0.0
    out["outages"] = [{**w.to_json(), "text": outages.describe(w, start, self.conn_error[1] if w.is_outage else "")}
                      for w in windows]
    out["outage_seconds"] = sum(w.seconds for w in windows if w.is_outage)
    if self.media_items:  # images and audio: their prompt tokens apart from the text's
        out["media_items"] = self.media_items
        out["media_tokens"] = self.media_tokens
        out["text_input_tokens"] = self.input_tokens - self.media_tokens
    if self.items:  # pooling requests: their inputs, and inputs/s
        out["inputs"] = self.items
        out["input_rate"] = self.items / duration if duration else 0.0
        out["input_token_rate"] = self.input_tokens / duration if duration else 0.0
    if records_per_request:
        out["records_per_request"] = records_per_request
        out["records"] = ok * records_per_request
        out["record_rate"] = ok * records_per_request / duration if duration else 0.0
    if self.names:
        out["names"] = {n: self.names[n].summary(duration, records_per_request, None, now, percentiles, shown)
                        for n in sorted(self.names, key=name_order)}
    if self.targets:  # --host a,b: each replica's rows, and its outages named as that target's
        out["targets"] = {t: self.targets[t].summary(duration, records_per_request, None, now, percentiles, shown)
                          for t in sorted(self.targets)}
        if outage_after is not None:
            out["outages"] = [{**w, "text": "every target: " + w["text"]} for w in out["outages"]]
            for t in sorted(self.targets):
                sub = self.targets[t]
                out["outages"] += [{**w.to_json(), "target": t, "text": f"target {t}: " + outages.describe(
                    w, start, sub.conn_error[1] if w.is_outage else "")} for w in sub.outage_windows(outage_after, now)
                    if not any(r["start"] <= w.start and w.end <= r["end"] for r in out["outages"] if "target" not in r)]
    return out
