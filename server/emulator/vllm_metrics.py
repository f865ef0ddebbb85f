"""The emulator's /metrics, under vLLM's own metric names (V1 naming, labels model_name and engine)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from vllm_load.metrics.fleet.prometheus import ITL_BUCKETS, REQUEST_BUCKETS, TOKEN_BUCKETS, TTFT_BUCKETS  # vLLM's


class VllmMetrics:
    """Registry of the metrics a vLLM server exposes that a load test reads.

    ``naming="v1"`` is vLLM 0.32's (labels model_name and engine); ``"v0"`` is the old engine's: KV usage as
    gpu_cache_usage_perc, ITL as time_per_output_token_seconds, swapped requests and CPU cache, a prefix-cache
    hit-rate gauge instead of the query/hit counters, and the model_name label only.
    """

    def __init__(self, model: str, naming: str = "v1") -> None:
        self.registry = r = CollectorRegistry()
        self.naming = naming
        v0 = naming == "v0"
        labels = ["model_name"] if v0 else ["model_name", "engine"]
        self.labels = {"model_name": model} if v0 else {"model_name": model, "engine": "0"}
        self._children: dict[int, object] = {}

        def g(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=r)

        def c(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels + list(extra), registry=r)

        def h(name: str, doc: str, buckets: tuple) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r)

        self.running = g("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = g("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = g("vllm:gpu_cache_usage_perc" if v0 else "vllm:kv_cache_usage_perc",
                          "KV-cache usage. 1 means 100 percent usage.")
        # V0 has no prefix counters (only a hit-rate gauge): keep ours out of its registry
        reg = CollectorRegistry() if v0 else r
        self.prefix_queries = Counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
                                      labels, registry=reg)
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                                   labels, registry=reg)
        # the KV connector's (here the offload tier's, --kv-offload-blocks): the tokens past the GPU's hits, and those
        # it loaded; vLLM V1 exposes them whether or not a connector is configured
        self.external_queries = Counter("vllm:external_prefix_cache_queries", "External prefix cache queries from KV "
                                        "connector cross-instance cache sharing, in terms of number of queried tokens.",
                                        labels, registry=reg)
        self.external_hits = Counter("vllm:external_prefix_cache_hits", "External prefix cache hits from KV connector "
                                     "cross-instance cache sharing, in terms of number of cached tokens.",
                                     labels, registry=reg)
        # the multimodal processor cache, in items (images, clips, videos): vLLM V1's, exposed from the start
        self.mm_queries = Counter("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried "
                                  "items.", labels, registry=reg)
        self.mm_hits = Counter("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.",
                               labels, registry=reg)
        if v0:
            self.swapped = g("vllm:num_requests_swapped", "Number of requests swapped to CPU.")
            self.cpu_cache = g("vllm:cpu_cache_usage_perc", "CPU KV-cache usage. 1 means 100 percent usage.")
            self.prefix_hit_rate = g("vllm:gpu_prefix_cache_hit_rate", "GPU prefix cache block hit rate.")
            for m in (self.swapped, self.cpu_cache, self.prefix_hit_rate):
                m.labels(**self.labels).set(0)
        self.preemptions = c("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = c("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = c("vllm:generation_tokens", "Number of generation tokens processed.")
        self.success = c("vllm:request_success", "Count of successfully processed requests.", ("finished_reason",))
        self.ttft = h("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.itl = h("vllm:time_per_output_token_seconds" if v0 else "vllm:inter_token_latency_seconds",
                     "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.e2e = h("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQUEST_BUCKETS)
        self.queue = h("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", REQUEST_BUCKETS)
        self.prefill = h("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", REQUEST_BUCKETS)
        self.decode = h("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", REQUEST_BUCKETS)
        self.req_prompt = h("vllm:request_prompt_tokens", "Number of prefill tokens processed.", TOKEN_BUCKETS)
        self.req_generation = h("vllm:request_generation_tokens", "Number of generation tokens processed.", TOKEN_BUCKETS)
        # the emulator's own: chunks produced on its schedule, and those produced over 10 ms late (a starved
        # emulator, e.g. one that shares the client's cores: vllm-load says so instead of blaming the server)
        self.emissions = g("vllm_emulator:emissions", "Chunks produced on the emulator's own schedule.")
        self.late_emissions = g("vllm_emulator:late_emissions", "Chunks produced over 10 ms after they were due.")
        for m in (self.running, self.waiting, self.kv_usage, self.emissions, self.late_emissions):
            m.labels(**self.labels).set(0)
        # the tool calls its bad-tool fault broke, by how (the truth a client's integrity check is held to)
        self.bad_tool_calls = Counter("vllm_emulator:bad_tool_calls", "Tool calls the bad-tool fault broke.",
                                      list(self.labels) + ["kind"], registry=self.registry)
        # the answers its diverge fault made part from their alone answers (the truth a reference check is held to)
        self.diverged = Counter("vllm_emulator:diverged_answers", "Answers the diverge fault made part from the same "
                                "prompt's answer alone.", list(self.labels), registry=self.registry)
        # like vLLM, expose every series from the start (a scrape before any traffic sees zeros)
        for m in (self.prefix_queries, self.prefix_hits, self.mm_queries, self.mm_hits, self.preemptions,
                  self.prompt_tokens, self.generation_tokens,
                  self.ttft, self.itl, self.e2e, self.queue, self.prefill, self.decode, self.req_prompt,
                  self.req_generation, self.diverged):
            m.labels(**self.labels)
        for reason in ("stop", "length", "abort", "error"):
            self.success.labels(finished_reason=reason, **self.labels)

    def cache_config(self, block_size: int, num_gpu_blocks: int) -> None:
        """vLLM's ``vllm:cache_config_info`` (an info gauge, 1, the cache's config in its labels): its block size is
        what the routing verdict counts achievable hits in, read through a sidecar."""
        labels = {"block_size": str(block_size), "enable_prefix_caching": "True", "num_gpu_blocks": str(num_gpu_blocks),
                  **({} if self.naming == "v0" else {"engine": "0"})}
        Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", list(labels),
              registry=self.registry).labels(**labels).set(1.0)

    def enable_spec_decode(self, positions: int) -> None:
        """vLLM's speculative-decoding counters, which it exposes only when a drafter is configured."""
        labels = list(self.labels)
        self.spec_drafts = Counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", labels,
                                   registry=self.registry)
        self.spec_draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", labels,
                                         registry=self.registry)
        self.spec_accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", labels,
                                     registry=self.registry)
        self.spec_per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                                    labels + ["position"], registry=self.registry)
        for m in (self.spec_drafts, self.spec_draft_tokens, self.spec_accepted):
            m.labels(**self.labels)
        for pos in range(positions):
            self.spec_per_pos.labels(position=str(pos), **self.labels)

    def nixl(self) -> tuple:
        """vLLM's NIXL connector series (vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py), which it exposes
        only with a connector: made at the first KV pull. (transfer time, bytes, failures)."""
        if getattr(self, "_nixl", None) is None:
            labels = list(self.labels)
            self._nixl = (
                Histogram("vllm:nixl_xfer_time_seconds", "Histogram of transfer duration for NIXL KV Cache transfers.",
                          labels, buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
                          registry=self.registry),
                Histogram("vllm:nixl_bytes_transferred", "Histogram of bytes transferred per NIXL KV Cache transfers.",
                          labels, buckets=tuple(2 ** (10 + i) for i in range(1, 25, 2)), registry=self.registry),
                Counter("vllm:nixl_num_failed_transfers", "Number of failed NIXL KV Cache transfers.", labels,
                        registry=self.registry),
            )
            for m in self._nixl:
                m.labels(**self.labels)
        return self._nixl

    def l(self, metric):  # noqa: E743 - short accessor used on every token
        # labels() costs a dict build and a lock per call: ~10 % of the emulator's CPU per chunk
        child = self._children.get(id(metric))
        if child is None:
            child = self._children[id(metric)] = metric.labels(**self.labels)
        return child

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
