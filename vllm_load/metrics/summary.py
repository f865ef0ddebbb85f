"""The run summary's shape: what ``LLMStats.summary`` computes and the collector completes, as written to
llm_stats.json and summary.json and read by the verdict, the console, the web UI and the report."""

from __future__ import annotations

from typing import TypedDict


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
