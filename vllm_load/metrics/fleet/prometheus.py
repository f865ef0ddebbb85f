"""The client's side in Prometheus' text format, with vLLM's own bucket boundaries, so that one Grafana panel
can put the client's TTFT next to ``vllm:time_to_first_token_seconds``.

The numbers are the merged exact histograms (a master's are the union of its workers'), turned into
cumulative bucket counts at scrape time. Series carry a ``name`` label: one per request name (``name=``), and
``name="(unnamed)"`` for the requests without one (the total less the named groups, bucket by bucket), so that a
``sum()`` over the label is the run's total and nothing is counted twice. (It was ``name=""``, which Prometheus
takes for no label at all: a panel by name showed the unnamed requests as a series without one.)
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np
from prometheus_client.core import CollectorRegistry, CounterMetricFamily, HistogramMetricFamily
from vllm_load.metric_table import (
    CLIENT_OVERHEAD, E2E, ITL, ITL_TOKEN, KV_TRANSFER, SERVER_DECODE, SERVER_PREFILL, SERVER_QUEUE, TPOT, TTFO, TTFT)

#: the ``name`` label of the requests sent without a name=
UNNAMED = "(unnamed)"
#: vLLM 0.32's bucket boundaries (vllm/v1/metrics/loggers.py), shared with the emulator's /metrics
TTFT_BUCKETS = (.001, .005, .01, .02, .04, .06, .08, .1, .25, .5, .75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560)
ITL_BUCKETS = (.01, .025, .05, .075, .1, .15, .2, .3, .4, .5, .75, 1, 2.5, 5, 7.5, 10, 20, 40, 80)
REQUEST_BUCKETS = (.3, .5, .8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)

#: (our metric key, exported name, buckets, help): vLLM's names under the vllm_load: prefix
EXPORTED = (
    (TTFT, "vllm_load:time_to_first_token_seconds", TTFT_BUCKETS, "Client-side time to first token in seconds."),
    (TTFO, "vllm_load:time_to_first_output_token_seconds", TTFT_BUCKETS,
     "Client-side time to the answer's first token (not reasoning) in seconds."),
    (ITL_TOKEN, "vllm_load:inter_token_latency_seconds", ITL_BUCKETS,
     "Client-side inter-token latency in seconds (each chunk's gap over its tokens), as vLLM's server-side one."),
    (ITL, "vllm_load:inter_chunk_latency_seconds", ITL_BUCKETS,
     "Client-side gap between token-bearing chunks in seconds (vllm bench serve's ITL)."),
    (TPOT, "vllm_load:request_time_per_output_token_seconds", ITL_BUCKETS,
     "Client-side (E2E - TTFT) / (output tokens - 1) per request, in seconds."),
    (E2E, "vllm_load:e2e_request_latency_seconds", REQUEST_BUCKETS, "Client-side end-to-end request latency."),
    # where each request's time went, as the server's per-request metrics said it
    (SERVER_QUEUE, "vllm_load:server_queue_seconds", REQUEST_BUCKETS,
     "The server's own queue time of each request (queued to scheduled), in seconds."),
    (SERVER_PREFILL, "vllm_load:server_prefill_seconds", REQUEST_BUCKETS,
     "The server's own time from scheduling to each request's first token, in seconds."),
    (KV_TRANSFER, "vllm_load:kv_transfer_seconds", REQUEST_BUCKETS,
     "Disaggregated prefill/decode: the decode instance's time to its first token (the KV pull), in seconds."),
    (SERVER_DECODE, "vllm_load:server_decode_seconds", REQUEST_BUCKETS,
     "The server's own time from each request's first token to its last, in seconds."),
    (CLIENT_OVERHEAD, "vllm_load:client_overhead_seconds", TTFT_BUCKETS,
     "Each request's client TTFT beyond the server's: the network, the API server, a router, in seconds."),
)


def _cumulative(hist: Any, bounds: tuple) -> tuple[np.ndarray, float]:
    """Cumulative counts at each bound (and +Inf last), and the sum of the values (seconds)."""
    counts = np.zeros(len(bounds) + 1)
    if hist.count:
        values, weights = hist.recorded()
        idx = np.searchsorted(np.asarray(bounds, dtype=float), values, side="left")
        np.add.at(counts, idx, weights.astype(float))
    return np.cumsum(counts), float(hist.total)


class ClientCollector:
    """A prometheus_client collector over a live ``LLMStats`` (read at each scrape)."""

    def __init__(self, stats_source: Callable[[], Any]) -> None:
        self.stats_source = stats_source

    def collect(self) -> Iterator[Any]:
        stats = self.stats_source()
        if stats is None:
            return
        groups = dict(stats.names)
        for key, name, bounds, doc in EXPORTED:
            fam = HistogramMetricFamily(name, doc, labels=["name"])
            total, total_sum = _cumulative(stats.hists[key], bounds)
            rest, rest_sum = total.copy(), total_sum
            for label, sub in sorted(groups.items()):
                counts, s = _cumulative(sub.hists[key], bounds)
                rest -= counts
                rest_sum -= s
                fam.add_metric([label], _buckets(bounds, counts), s)
            fam.add_metric([UNNAMED], _buckets(bounds, rest), max(0.0, rest_sum))
            yield fam
        requests = CounterMetricFamily("vllm_load:requests", "Finished requests by outcome.", labels=["name", "outcome"])
        prompt = CounterMetricFamily("vllm_load:prompt_tokens", "Prompt tokens of the successful requests.",
                                     labels=["name"])
        generation = CounterMetricFamily("vllm_load:generation_tokens", "Output tokens of the successful requests.",
                                         labels=["name"])
        rest = [stats.requests - stats.failures, stats.failures, stats.input_tokens, stats.output_tokens]
        for label, sub in sorted(groups.items()):
            got = [sub.requests - sub.failures, sub.failures, sub.input_tokens, sub.output_tokens]
            rest = [a - b for a, b in zip(rest, got)]
            _add_counts(requests, prompt, generation, label, got)
        _add_counts(requests, prompt, generation, UNNAMED, rest)
        yield from (requests, prompt, generation)
        if stats.targets:  # which replica served what, live (--host a,b, or the replica a --capture-header names)
            served = CounterMetricFamily("vllm_load:replica_requests", "Finished requests per replica, by outcome.",
                                         labels=["replica", "outcome"])
            cached = CounterMetricFamily("vllm_load:replica_cached_tokens",
                                         "Prompt tokens the replica served from its prefix cache (usage).",
                                         labels=["replica"])
            for replica, sub in sorted(stats.targets.items()):
                served.add_metric([replica, "ok"], sub.requests - sub.failures)
                served.add_metric([replica, "failed"], sub.failures)
                cached.add_metric([replica], sub.cached_tokens)
            yield from (served, cached)


def _buckets(bounds: tuple, cumulative: np.ndarray) -> list[tuple[str, float]]:
    out = [(repr(float(b)), float(c)) for b, c in zip(bounds, cumulative[:-1])]
    out.append(("+Inf", float(cumulative[-1])))
    return out


def _add_counts(requests: Any, prompt: Any, generation: Any, label: str, counts: list[int]) -> None:
    requests.add_metric([label, "ok"], counts[0])
    requests.add_metric([label, "failed"], counts[1])
    prompt.add_metric([label], counts[2])
    generation.add_metric([label], counts[3])


def registry_for(stats_source: Callable[[], Any]) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(ClientCollector(stats_source))
    return reg
