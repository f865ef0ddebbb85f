"""The one table of the per-request metrics: key, title, display unit and scale, histogram resolution, whether an
SLO can bound it, where its values come from, whether it judges goodput and has 10 s windows. Stats (their
recording), SLO parsing and goodput, the console, the web UI and the report's panels all read it.

Each metric's key is written here once, as a constant every other module names: it keys the summary's
``metrics``, the request log's field of the same value, the wire's histograms, SLOs and the exported series
(``tests/test_layers.py`` finds no key written as a string anywhere else in the package)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

TTFT: Final = "ttft"
TTFO: Final = "ttfo"
ITL: Final = "itl"
ITL_TOKEN: Final = "itl_token"
ITL_REASONING: Final = "itl_reasoning"
ITL_ANSWER: Final = "itl_answer"
TPOT: Final = "tpot"
E2E: Final = "e2e"
OUTPUT_TPS: Final = "output_tps"
SEND_LAG: Final = "send_lag"
SEND_LAG_STARTUP: Final = "send_lag_startup"
INPUT_TOKENS: Final = "input_tokens"
OUTPUT_TOKENS: Final = "output_tokens"
REASONING_TOKENS: Final = "reasoning_tokens"
SERVER_QUEUE: Final = "server_queue"
SERVER_PREFILL: Final = "server_prefill"
KV_TRANSFER: Final = "kv_transfer"
SERVER_DECODE: Final = "server_decode"
CLIENT_OVERHEAD: Final = "client_overhead"
CLIP_SECONDS: Final = "clip_seconds"
RTF: Final = "rtf"


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
    Metric(TTFT, "TTFT", "ms", 1000.0, latency=True, field=TTFT, goodput=True, windowed=True),
    # the answer's first token (not reasoning): AIPerf's time to first output token; shown when a run reasoned
    Metric(TTFO, "TTFO (first answer token)", "ms", 1000.0, latency=True, field=TTFO),
    # vLLM's names: itl is the gap between token-bearing chunks (vllm bench serve's ITL), itl_token spreads
    # each gap over the tokens its chunk carried (one value per token)
    Metric(ITL, "ITL (per chunk)", "ms", 1000.0, latency=True),
    Metric(ITL_TOKEN, "ITL per token", "ms", 1000.0, latency=True, windowed=True),
    # a reasoning model's chunk gaps within each phase (the switch from thinking to answer is in neither)
    Metric(ITL_REASONING, "ITL while reasoning (per chunk)", "ms", 1000.0, latency=True),
    Metric(ITL_ANSWER, "ITL of the answer (per chunk)", "ms", 1000.0, latency=True),
    Metric(TPOT, "TPOT", "ms", 1000.0, latency=True, field=TPOT, goodput=True),
    Metric(E2E, "E2E latency", "ms", 1000.0, latency=True, field=E2E, goodput=True, windowed=True),
    Metric(OUTPUT_TPS, "Output tok/s per request", "tok/s", 1.0, hist_scale=1000.0, field=OUTPUT_TPS),
    Metric(SEND_LAG, "Send lag (open loop)", "ms", 1000.0),
    Metric(SEND_LAG_STARTUP, "Send lag, first 2 s (open loop)", "ms", 1000.0),
    Metric(INPUT_TOKENS, "Input tokens", "tok", 1.0, hist_scale=1.0, field=INPUT_TOKENS),
    Metric(OUTPUT_TOKENS, "Output tokens", "tok", 1.0, hist_scale=1.0, field=OUTPUT_TOKENS),
    Metric(REASONING_TOKENS, "Reasoning tokens", "tok", 1.0, hist_scale=1.0, field=REASONING_TOKENS),
    # speech to text: each clip's length, and its E2E over it (under 1: faster than the audio plays), to 0.1 ms
    Metric(CLIP_SECONDS, "Audio per request", "s", 1.0, hist_scale=1e4, field=CLIP_SECONDS),
    Metric(RTF, "Real-time factor (E2E / audio)", "x", 1.0, hist_scale=1e4, field=RTF),
    # where each request's time went, as the server said it (vLLM's per-request metrics in the stream): merged exactly
    # across workers and exported live; the console and the report say them as the tails' split (breakdown.py)
    Metric(SERVER_QUEUE, "Server queue", "ms", 1000.0, field=SERVER_QUEUE, table=False),
    Metric(SERVER_PREFILL, "Server prefill", "ms", 1000.0, field=SERVER_PREFILL, table=False),
    Metric(KV_TRANSFER, "KV transfer", "ms", 1000.0, field=KV_TRANSFER, table=False),
    Metric(SERVER_DECODE, "Server decode", "ms", 1000.0, field=SERVER_DECODE, table=False),
    Metric(CLIENT_OVERHEAD, "Client overhead", "ms", 1000.0, field=CLIENT_OVERHEAD, table=False),
)
#: rows shown only when the run had reasoning (otherwise TTFO repeats TTFT)
REASONING_ONLY = (TTFO, REASONING_TOKENS, ITL_REASONING, ITL_ANSWER)
BY_KEY = {m.key: m for m in METRICS}
#: the latency metrics, in the table's order (SLO names, stats' per-request times)
LATENCY = tuple(m.key for m in METRICS if m.latency)
#: the per-request values kept from each successful request, by attribute
PER_REQUEST_FIELDS = tuple((m.key, m.field) for m in METRICS if m.field)
#: goodput's criteria (a request is good when it meets every SLO given on these), as vllm bench serve's
GOODPUT = tuple(m.key for m in METRICS if m.goodput)
#: the metrics with per-window histograms
WINDOWED = tuple(m.key for m in METRICS if m.windowed)
