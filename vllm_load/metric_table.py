"""The one table of the per-request metrics: key, title, display unit and scale, histogram resolution, whether an
SLO can bound it, where its values come from, whether it judges goodput and has 10 s windows. Stats (their
recording), SLO parsing and goodput, the console, the web UI and the report's panels all read it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    key: str
    title: str
    unit: str  # as displayed
    scale: float  # seconds (or tokens/s, tokens) times this is the displayed value
    hist_scale: float = 1e9  # histogram counts per unit (ns for times; 1 per token; milli-tokens/s)
    latency: bool = False  # a time an SLO can bound with a statistic (ttft.p99<=500ms)
    #: the RequestRecord attribute holding its one value per successful request ("": derived from the chunks or
    #: the send times by ``fold.record`` itself)
    field: str = ""
    goodput: bool = False  # a per-request criterion of goodput, as in vllm bench serve (ttft, tpot, e2e)
    windowed: bool = False  # has per-10 s-window histograms (the report's and the web UI's latency panels)
    table: bool = True  # a row of the LLM table (console, web UI, report); the server's parts are said apart


METRICS: tuple[Metric, ...] = (
    Metric("ttft", "TTFT", "ms", 1000.0, latency=True, field="ttft", goodput=True, windowed=True),
    # the answer's first token (not reasoning): AIPerf's time to first output token; shown when a run reasoned
    Metric("ttfo", "TTFO (first answer token)", "ms", 1000.0, latency=True, field="ttfo"),
    # vLLM's names: itl is the gap between token-bearing chunks (vllm bench serve's ITL), itl_token spreads
    # each gap over the tokens its chunk carried (one value per token)
    Metric("itl", "ITL (per chunk)", "ms", 1000.0, latency=True),
    Metric("itl_token", "ITL per token", "ms", 1000.0, latency=True, windowed=True),
    # a reasoning model's chunk gaps within each phase (the switch from thinking to answer is in neither)
    Metric("itl_reasoning", "ITL while reasoning (per chunk)", "ms", 1000.0, latency=True),
    Metric("itl_answer", "ITL of the answer (per chunk)", "ms", 1000.0, latency=True),
    Metric("tpot", "TPOT", "ms", 1000.0, latency=True, field="tpot", goodput=True),
    Metric("e2e", "E2E latency", "ms", 1000.0, latency=True, field="e2e", goodput=True, windowed=True),
    Metric("output_tps", "Output tok/s per request", "tok/s", 1.0, hist_scale=1000.0, field="output_tps"),
    Metric("send_lag", "Send lag (open loop)", "ms", 1000.0),
    Metric("send_lag_startup", "Send lag, first 2 s (open loop)", "ms", 1000.0),
    Metric("input_tokens", "Input tokens", "tok", 1.0, hist_scale=1.0, field="input_tokens"),
    Metric("output_tokens", "Output tokens", "tok", 1.0, hist_scale=1.0, field="output_tokens"),
    Metric("reasoning_tokens", "Reasoning tokens", "tok", 1.0, hist_scale=1.0, field="reasoning_tokens"),
    # where each request's time went, as the server said it (vLLM's per-request metrics in the stream): merged exactly
    # across workers and exported live; the console and the report say them as the tails' split (breakdown.py)
    Metric("server_queue", "Server queue", "ms", 1000.0, field="server_queue", table=False),
    Metric("server_prefill", "Server prefill", "ms", 1000.0, field="server_prefill", table=False),
    Metric("kv_transfer", "KV transfer", "ms", 1000.0, field="kv_transfer", table=False),
    Metric("server_decode", "Server decode", "ms", 1000.0, field="server_decode", table=False),
    Metric("client_overhead", "Client overhead", "ms", 1000.0, field="client_overhead", table=False),
)
#: rows shown only when the run had reasoning (otherwise TTFO repeats TTFT)
REASONING_ONLY = ("ttfo", "reasoning_tokens", "itl_reasoning", "itl_answer")
BY_KEY = {m.key: m for m in METRICS}
#: the latency metrics, in the table's order (SLO names, stats' per-request times)
LATENCY = tuple(m.key for m in METRICS if m.latency)
#: the per-request values kept from each successful request, by attribute
PER_REQUEST_FIELDS = tuple((m.key, m.field) for m in METRICS if m.field)
#: goodput's criteria (a request is good when it meets every SLO given on these), as vllm bench serve's
GOODPUT = tuple(m.key for m in METRICS if m.goodput)
#: the metrics with per-window histograms
WINDOWED = tuple(m.key for m in METRICS if m.windowed)
