"""A vLLM emulator: vLLM's OpenAI HTTP API, SSE chunk shapes and /metrics names, on gevent.

    python -m server.emulator --port 8000 --ttft 0.05 --itl 0.01

It is the default target of the locustfiles (started on 127.0.0.1 when no --host is given) and
the fixture of the tests; every report says when the target was this emulator. This module routes the requests
(``Emulator``); ``plan`` decides what a generation request produces, ``generate`` writes it, ``engine`` and
``scheduler`` pace it, ``pooling``, ``responses`` and ``messages`` serve those APIs, ``pd`` the prefill/decode split, ``faults`` the
injected faults, ``spans`` the OTLP export, ``cli`` the command line and the server.
"""

from __future__ import annotations

import hmac
import random
import time
from typing import IO, Any, Iterable

import orjson

from . import audio, media, messages, pooling, responses
from .engine import FixedScheduleEngine
from .faults import FaultPlan
from .lora_slots import LoraSlots
from .generate import VERSION, complete, stream
from .http import HttpError, Start, error_reply, loggable_headers, post_body, reply
from .plan import Output, plan, prompt_ids
from .prefix_cache import PrefixCache
from .profiler import Profiler
from .scheduler import BatchingEngine
from .spans import SpanExporter, trace_of
from .vllm_metrics import VllmMetrics
from vllm_load.workload.history import HistoryCounter

#: the response header that names the replica which answered (for the clients' routing checks)
REPLICA_HEADER = "X-Vllm-Load-Replica"
GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions")


class Emulator:
    def __init__(self, model: str, tokenizer: Any, max_model_len: int, engine: FixedScheduleEngine | BatchingEngine,
                 api_key: str = "", faults: FaultPlan | None = None, naming: str = "v1",
                 timing_log: IO[str] | None = None, request_log: IO[str] | None = None, eos_after: int = 64,
                 prompt_tokens_details: bool = False, served_names: list[str] | None = None,
                 lora_modules: list[str] | None = None, reject: list[str] | None = None,
                 reasoning: Any = None, seed: int = 0, media_cost: media.MediaCost | None = None) -> None:
        self.model = model
        self.media_cost = media_cost or media.MediaCost()  # tokens and encoder time per image, clip, video
        #: chunks produced on a schedule, and those produced over LATE_S after it (vllm_emulator:* in /metrics)
        self.emitted = self.late = 0
        self.owned_by = "vllm"  # /v1/models' owned_by (--owned-by: another server's, for clients that detect vLLM)
        self.replica = ""  # --replica-name: named in every answer's REPLICA_HEADER ('' : the URL it listens on)
        self.stream_style = "vllm"  # --stream-style: how its streams end (another server's way, for the clients' tests)
        self.spans: SpanExporter | None = None  # --otlp-traces-endpoint
        self.profiler: Profiler | None = None  # --profiler-config: /start_profile and /stop_profile
        self.kv_transfer = (0.001, 1e-6)  # P/D: a decode's KV pull, seconds: fixed, per prompt token
        self.per_request_metrics = False  # --enable-per-request-metrics
        #: --reasoning-tokens: a chat answer starts with this many reasoning tokens (a LengthSpec; None: none),
        #: streamed as vLLM's reasoning parser streams them (``delta.reasoning``) and counted in usage
        self.reasoning = reasoning
        self.graded: Any = None  # --graded: a model of known accuracy (graded.py)
        self.reasoning_rng = random.Random(seed)
        self.served = list(served_names or [model])  # vLLM's --served-model-name: the ids clients use
        self.loras = list(lora_modules or [])  # adapters served beside the base model (vLLM's --lora-modules)
        self.runtime_lora = False  # --allow-runtime-lora-updating: adapters loaded and unloaded over HTTP
        self.lora_slots: LoraSlots | None = None  # --max-loras: adapters loaded at once, a load's wait beyond them
        self.reject = list(reject or [])  # body fields answered with 400, like a strict gateway (--reject)
        self._answer_cache: dict[str, list[int]] = {}  # answer text -> its token ids
        self.eos_after = eos_after  # a request without max_tokens ends "on its own" after this many tokens
        self.prompt_tokens_details = prompt_tokens_details  # usage.prompt_tokens_details.cached_tokens, as vLLM's flag
        self.faults = faults or FaultPlan()
        self.tok = tokenizer
        #: an agent's next turn tokenized from its history's tokens (680 ms -> a few ms at 128k tokens)
        self.history = HistoryCounter(tokenizer) if tokenizer is not None else None
        self.max_model_len = max_model_len
        self.engine = engine
        self.api_key = api_key
        self.metrics = VllmMetrics(model, naming)
        self._spec_seen: dict = {}  # the speculative counters as of the last scrape
        if getattr(engine, "spec", None) is not None:
            self.metrics.enable_spec_decode(engine.spec.tokens)
        self.prefix_cache = PrefixCache(engine.cfg.block_size, engine.cfg.num_gpu_blocks)
        self.metrics.cache_config(engine.cfg.block_size, engine.cfg.num_gpu_blocks)
        self.mm_cache = media.MultiModalCache()
        self._preemptions_seen = 0
        self.created = int(time.time())
        self.timing_log = timing_log
        self.request_log = request_log  # every generation request's path and body, for tests

    # -- WSGI -----------------------------------------------------------------------------------
    def __call__(self, environ: dict, start_response: Start) -> Iterable[bytes]:
        if self.replica:  # every answer names the replica that gave it (a client's --capture-header joins on it)
            named = start_response

            def start_response(status: str, headers: list, exc_info: Any = None) -> Any:  # noqa: F811
                headers = [*headers, (REPLICA_HEADER, self.replica)]
                return named(status, headers, exc_info) if exc_info else named(status, headers)
        try:
            return self._route(environ, start_response)
        except HttpError as exc:
            return error_reply(start_response, exc)

    def _route(self, environ: dict, start_response: Start) -> Iterable[bytes]:
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "GET")
        if path == "/health":
            return reply(start_response, 200, b"", "text/plain")
        if path == "/dcgm/metrics" and self.engine.power is not None:
            body = self.engine.power.exposition(self.engine.running)
            return reply(start_response, 200, body, "text/plain; version=0.0.4")
        if path == "/metrics":
            self._update_gauges()
            return reply(start_response, 200, self.metrics.exposition(), "text/plain; version=0.0.4")
        if path.startswith("/v1/") and self.api_key:
            if not hmac.compare_digest(environ.get("HTTP_AUTHORIZATION", "").encode(), f"Bearer {self.api_key}".encode()):
                raise HttpError(401, "Unauthorized", "Unauthorized")
        if method == "POST" and self.profiler is not None:
            if path == "/start_profile":
                self.profiler.start()
                return reply(start_response, 200, b"")
            if path == "/stop_profile":
                self.profiler.stop()
                return reply(start_response, 200, b"")
            if path.startswith("/v1/"):
                self.profiler.saw_request()
        if path == "/reset_prefix_cache" and method == "POST":  # vLLM's (dev mode): the cache emptied
            self.prefix_cache.reset()
            return reply(start_response, 200, b'{"success":true}')
        if path == "/version" and self.owned_by == "vllm":  # a server emulated as another (--owned-by) has none
            # vLLM's own shape, and a key of the emulator's: a client can tell it from a real vLLM (a standalone one
            # was reported as "vLLM 0.32.0")
            return reply(start_response, 200, orjson.dumps({"version": VERSION, "emulator": "vllm-load"}))
        if path == "/v1/models":
            return reply(start_response, 200, self._models())
        if path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter") and method == "POST" and self.runtime_lora:
            return reply(start_response, 200, self._lora_update(post_body(environ), path.endswith("/load_lora_adapter")),
                         "text/plain")
        if path == "/tokenize":
            return reply(start_response, 200, self._tokenize(post_body(environ)))
        if path in pooling.PATHS:
            return self._pool(environ, start_response, path)
        if path == "/v1/responses":
            return self._responses(environ, start_response)
        if path in audio.TASKS:
            return audio.serve(self, environ, start_response, audio.TASKS[path])
        if path in ("/v1/messages", "/v1/messages/count_tokens"):
            return self._messages(environ, start_response, path.endswith("count_tokens"))
        if path in GENERATION_PATHS:
            return self._generate(environ, start_response, path == "/v1/chat/completions")
        raise HttpError(404, f"Not Found: {path}", "NotFoundError")

    def _lora_update(self, body: dict, load: bool) -> bytes:
        """vLLM's dynamic LoRA routes (entrypoints/serve/lora): a name loaded (its path not read: the emulator has no
        weights) or unloaded, with vLLM's answers and refusals."""
        name = body.get("lora_name")
        if not isinstance(name, str) or not name or (load and not body.get("lora_path")):
            raise HttpError(400, "Both 'lora_name' and 'lora_path' must be provided." if load else
                            "'lora_name' needs to be provided to unload a LoRA adapter.", "InvalidUserInput")
        if load:
            if name in self.served:
                raise HttpError(400, f"The lora adapter '{name}' conflicts with a served base model.",
                                "InvalidUserInput")
            if name in self.loras:
                raise HttpError(400, f"The lora adapter '{name}' has already been loaded. If you want to load the "
                                "adapter in place, set 'load_inplace' to True.", "InvalidUserInput")
            self.loras.append(name)
            return f"Success: LoRA adapter '{name}' added successfully.".encode()
        if name not in self.loras:
            raise HttpError(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        self.loras.remove(name)
        return f"Success: LoRA adapter '{name}' removed successfully.".encode()

    def model_of(self, body: dict) -> str:
        """The model a body asks for (the first served name by default); 404 for one not served."""
        model = body.get("model", self.served[0])
        if model not in self.served and model not in self.loras:
            raise HttpError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        return model

    def log_request(self, environ: dict, body: dict) -> None:
        """--request-log: what a client really sent (its path, body and headers, credentials as ***)."""
        if self.request_log is not None:
            self.request_log.write(orjson.dumps({"path": environ.get("PATH_INFO", ""), "body": body,
                                                 "headers": loggable_headers(environ)}).decode() + "\n")

    def _pool(self, environ: dict, start_response: Start, path: str) -> Iterable[bytes]:
        body = post_body(environ)
        self.model_of(body)
        self.faults.raise_overload(self.faults.pick(environ, self.engine.running))
        try:
            return reply(start_response, 200, pooling.serve(self, path, body))
        except pooling.PoolingError as exc:
            raise HttpError(400, str(exc), "BadRequestError") from None

    def _responses(self, environ: dict, start_response: Start) -> Iterable[bytes]:
        body = post_body(environ)
        self.log_request(environ, body)
        try:
            messages = responses.messages_of(body)
        except responses.ResponsesError as exc:
            raise HttpError(400, str(exc), "BadRequestError", "input") from None
        if not body.get("stream"):
            raise HttpError(400, "the emulator streams Responses only: set stream true", "BadRequestError", "stream")
        plan_body = {"model": body.get("model", self.served[0]), "messages": messages,
                     "max_tokens": body.get("max_output_tokens")}
        model, out = plan(self, True, plan_body, self.faults.pick(environ, self.engine.running), responses.input_ids(self, messages))
        start_response("200 OK", [("Content-Type", "text/event-stream; charset=utf-8"), ("Cache-Control", "no-cache")])
        return responses.stream(self, model, out)

    def _messages(self, environ: dict, start_response: Start, count: bool) -> Iterable[bytes]:
        """Anthropic's Messages API, as vLLM converts it to a chat request (``messages.py``)."""
        body = post_body(environ)
        self.log_request(environ, body)
        try:
            chat = {"model": body.get("model", self.served[0]), "messages": messages.chat_messages(body),
                    "max_tokens": body.get("max_tokens")}
        except messages.MessagesError as exc:
            raise HttpError(400, str(exc), "BadRequestError", "messages") from None
        if count:
            self.model_of(chat)
            return reply(start_response, 200, orjson.dumps({"input_tokens": len(prompt_ids(self, True, chat))}))
        if not isinstance(chat["max_tokens"], int):
            raise HttpError(400, "max_tokens: Field required", "BadRequestError", "max_tokens")
        model, out = plan(self, True, chat, self.faults.pick(environ, self.engine.running))
        if not body.get("stream"):
            return reply(start_response, 200, messages.whole(self, model, out))
        start_response("200 OK", [("Content-Type", "text/event-stream; charset=utf-8"), ("Cache-Control", "no-cache")])
        return messages.stream(self, model, out)

    def _generate(self, environ: dict, start_response: Start, chat: bool) -> Iterable[bytes]:
        received = time.perf_counter()  # the timing log's zero for this request: when it reached the server
        rx_wall = environ.get("emulator.rx_wall")
        if rx_wall:  # the kernel stamped its arrival: count the time it waited for this loop too
            received -= max(0.0, time.time() - rx_wall)
        body = post_body(environ)
        self.log_request(environ, body)
        refused = [f for f in self.reject if f in body or f in (body.get("stream_options") or {})]
        if refused:  # a strict OpenAI-compatible gateway: unknown fields are an error
            raise HttpError(400, f"Unrecognized request argument supplied: {refused[0]}", "BadRequestError",
                            refused[0])
        fault = self.faults.pick(environ, self.engine.running)
        trace = trace_of(environ) if self.spans is not None else None
        model, out = plan(self, chat, body, fault)
        if not body.get("stream"):
            return complete(self, start_response, chat, model, out, trace)
        opts = body.get("stream_options") or {}
        start_response("200 OK", [("Content-Type", "text/event-stream; charset=utf-8"), ("Cache-Control", "no-cache")])
        vllm = self.stream_style == "vllm"
        return stream(self, chat, model, out, bool(opts.get("include_usage")) and vllm,
                      bool(opts.get("include_usage") and opts.get("continuous_usage_stats")) and vllm, fault,
                      received, trace)

    def _models(self) -> bytes:
        def entry(mid: str, root: str, parent: str | None) -> dict:
            return {"id": mid, "object": "model", "created": self.created, "owned_by": self.owned_by,
                    "root": root, "parent": parent, "max_model_len": self.max_model_len,
                    "permission": [{"id": "modelperm-emulator", "object": "model_permission", "created": self.created,
                                    "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                                    "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                                    "organization": "*", "group": None, "is_blocking": False}]}

        data = [entry(name, self.model, None) for name in self.served]
        data += [entry(name, f"/adapters/{name}", self.served[0]) for name in self.loras]
        return orjson.dumps({"object": "list", "data": data})

    def _tokenize(self, body: dict) -> bytes:
        chat = "messages" in body
        if chat:
            ids = self.tok.encode(self.tok.render_chat(body["messages"]), add_special_tokens=False)
        else:
            ids = self.tok.encode(str(body.get("prompt", "")), add_special_tokens=body.get("add_special_tokens", True))
        return orjson.dumps({"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids})

    def _update_gauges(self) -> None:
        m = self.metrics
        m.l(m.emissions).set(self.emitted)
        m.l(m.late_emissions).set(self.late)
        m.l(m.running).set(self.engine.running)
        m.l(m.waiting).set(self.engine.waiting)
        m.l(m.kv_usage).set(self.engine.kv_usage)
        if m.naming == "v0":
            queries = m.l(m.prefix_queries)._value.get()
            m.l(m.prefix_hit_rate).set(m.l(m.prefix_hits)._value.get() / queries if queries else 0.0)
        new = self.engine.preemptions - self._preemptions_seen
        if new > 0:
            m.l(m.preemptions).inc(new)
            self._preemptions_seen += new
        spec = getattr(self.engine, "spec", None)
        if spec is not None:  # counters: what the drafts did since the last scrape
            seen = self._spec_seen
            for metric, now, key in ((m.spec_drafts, spec.drafts, "drafts"),
                                     (m.spec_draft_tokens, spec.draft_tokens, "draft_tokens"),
                                     (m.spec_accepted, spec.accepted, "accepted")):
                m.l(metric).inc(now - seen.get(key, 0))
                seen[key] = now
            for pos, now in enumerate(spec.per_pos):
                m.spec_per_pos.labels(position=str(pos), **m.labels).inc(now - seen.get(pos, 0))
                seen[pos] = now

    # -- what an answer leaves behind -----------------------------------------------------------
    def cache_answer(self, out: Output, text: str) -> None:
        """vLLM keeps the blocks a request filled while decoding too: the next turn of a conversation, whose
        history holds this answer, hits them (as far as re-tokenizing the answer gives the same ids)."""
        if self.tok is not None and text:
            self.prefix_cache.query(out.ids + self._answer_ids(text))

    def _answer_ids(self, text: str) -> list[int]:
        """The answer's token ids. Every answer of N tokens is the same text (the word cycle starts afresh), so
        they are encoded once: encoding 256 tokens costs ~270 us, which at 240 requests/s cost the emulator
        15 % of its chunk rate (benchmarks/client_capacity.py, 2026-11-23)."""
        ids = self._answer_cache.get(text)
        if ids is None:
            if len(self._answer_cache) >= 1024:
                self._answer_cache.clear()
            ids = self._answer_cache[text] = self.tok.encode(text, add_special_tokens=False)
        return ids

    def stats_line(self, interval: float) -> str:
        """vLLM's periodic stats log line (V1 or V0 format), over the last ``interval`` seconds."""
        self._update_gauges()
        m = self.metrics
        prompt, gen = m.l(m.prompt_tokens)._value.get(), m.l(m.generation_tokens)._value.get()
        queries, hits = m.l(m.prefix_queries)._value.get(), m.l(m.prefix_hits)._value.get()
        last = getattr(self, "_last_stats", (prompt, gen, queries, hits))
        self._last_stats = (prompt, gen, queries, hits)
        p_rate, g_rate = (prompt - last[0]) / interval, (gen - last[1]) / interval
        kv = 100.0 * self.engine.kv_usage
        if m.naming == "v0":
            return (f"INFO {time.strftime('%m-%d %H:%M:%S')} metrics.py:341] Avg prompt throughput: {p_rate:.1f} tokens/s, "
                    f"Avg generation throughput: {g_rate:.1f} tokens/s, Running: {self.engine.running} reqs, "
                    f"Swapped: 0 reqs, Pending: {self.engine.waiting} reqs, GPU KV cache usage: {kv:.1f}%, "
                    "CPU KV cache usage: 0.0%.")
        dq = queries - last[2]
        hit = 100.0 * (hits - last[3]) / dq if dq else 0.0
        return (f"INFO {time.strftime('%m-%d %H:%M:%S')} [loggers.py:123] Engine 000: Avg prompt throughput: {p_rate:.1f} "
                f"tokens/s, Avg generation throughput: {g_rate:.1f} tokens/s, Running: {self.engine.running} reqs, "
                f"Waiting: {self.engine.waiting} reqs, Preemptions: {self.engine.preemptions}, GPU KV cache usage: "
                f"{kv:.1f}%, Prefix cache hit rate: {hit:.1f}%")


def main(argv: list[str] | None = None) -> int:
    """``python -m server.emulator`` (kept here: the installed ``vllm-load-emulator`` script names it)."""
    from .cli import main as run

    return run(argv)
