"""A vLLM emulator: vLLM's OpenAI HTTP API, SSE chunk shapes and /metrics names, on gevent.

    python -m server.emulator --port 8000 --ttft 0.05 --itl 0.01

It is the default target of the locustfiles (started on 127.0.0.1 when no --host is given) and
the fixture of the tests; every report says when the target was this emulator.
"""

from __future__ import annotations

import argparse
import hmac
import itertools
import random
import secrets
import socket
import sys
import time
from dataclasses import dataclass
from typing import IO, Any, Callable, Iterable, Iterator

import gevent
import orjson
from gevent.pywsgi import WSGIHandler, WSGIServer

from .engine import EngineConfig, FixedScheduleEngine
from .scheduler import PROFILES, BatchingEngine, SchedulerConfig
from .faults import FaultPlan, parse_fault
from .spans import SpanExporter, trace_of
from . import dcgm, media, pooling, responses
from .prefix_cache import PrefixCache
from .profiler import Profiler
from .vllm_metrics import VllmMetrics
from vllm_load.client import rxstamp
from vllm_load.client.openai_api import is_credential_header
from vllm_load.workload.history import HistoryCounter

VERSION = "0.32.0"
#: the response header that names the replica which answered (for the clients' routing checks)
REPLICA_HEADER = "X-Vllm-Load-Replica"
FINGERPRINT = f"vllm-{VERSION}-emulator"
_WORDS = (" the", " model", " answers", " with", " tokens", " that", " stream", " back", " to", " a",
          " client", " under", " load", " while", " batches", " grow", " and", " caches", " fill", " up")

Start = Callable[[str, list], Any]
#: tokens of a tool call's arguments (the emulator's calls are short, like a real model's)
TOOL_CALL_TOKENS = 16


@dataclass
class Output:
    """What one generation request will produce, decided before it is scheduled."""

    ids: list[int]  # the prompt's token ids
    max_tokens: int
    finish: str  # "length", "stop" (stopped on its own) or "tool_calls"
    tool: str | None  # the function the answer calls
    cached: int  # prompt tokens found in the prefix cache
    reasoning: int = 0  # the first tokens are reasoning (a reasoning model's thinking), the rest the answer
    #: disaggregated prefill/decode, as vLLM's router asks (kv_transfer_params): "produce" (a prefill: its answer
    #: carries the KV's whereabouts), "consume" (a decode: the prompt's KV is pulled from the prefill, not computed)
    kv: str = ""


def _tool_to_call(body: dict) -> str | None:
    """Deterministic tool use: a named tool_choice calls that function, "required" the first tool, "auto" (the
    default) the first tool when the conversation ends with a user turn and answers in text after a tool's
    result; "none" never calls."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    choice = body.get("tool_choice", "auto")
    if isinstance(choice, dict):
        return str((choice.get("function") or {}).get("name") or "") or None
    first = (tools[0].get("function") or {}).get("name") if isinstance(tools[0], dict) else None
    if choice == "required":
        return first
    if choice == "auto":
        messages = body.get("messages") or [{}]
        return first if isinstance(messages[-1], dict) and messages[-1].get("role") == "user" else None
    return None


def _tool_pieces(name: str, n: int) -> Iterator[str]:
    """The arguments of a call, in ``n`` pieces (one per token) that concatenate to valid JSON."""
    words = [w.strip() for w in itertools.islice(itertools.cycle(_WORDS), max(0, n - 2))]
    if n <= 1:
        yield orjson.dumps({"query": name}).decode()
        return
    yield '{"query": "'
    for w in words:
        yield w + " "
    yield '"}'


def _loggable_headers(environ: dict) -> dict[str, str]:
    """The request's headers for the request log: credential-like values are never written (the name is)."""
    out = {}
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            name = key[5:].replace("_", "-").title()
            out[name] = "***" if is_credential_header(name) else str(value)
    return out


def _tool_call_id() -> str:
    """Nine letters and digits: the id shape Mistral's tokenizer accepts back in the history (vLLM's too)."""
    return "".join(secrets.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") for _ in range(9))


class HttpError(Exception):
    def __init__(self, status: int, message: str, err_type: str, param: str | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.err_type, self.param = status, message, err_type, param
        self.retry_after = retry_after  # seconds, sent as Retry-After (429/503 overload faults)

    def body(self) -> bytes:
        # vLLM >= 0.10.1 error shape
        return orjson.dumps({"error": {"message": self.message, "type": self.err_type, "param": self.param,
                                       "code": self.status}})


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}


#: a chunk produced this long after its schedule's due time counts as late: the emulator itself fell behind
LATE_S = 0.010


class DropConnection(Exception):
    """Raised inside a streaming body: the server closes the connection without ending the stream."""


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
        self.stream_style = "vllm"
        self.spans: SpanExporter | None = None  # --otlp-traces-endpoint
        self.profiler: Profiler | None = None  # --profiler-config: /start_profile and /stop_profile
        self.kv_transfer = (0.001, 1e-6)  # P/D: a decode's KV pull, seconds: fixed, per prompt token
        self.per_request_metrics = False  # --enable-per-request-metrics  # --stream-style: how its streams end (another server's way, for the clients' tests)
        #: --reasoning-tokens: a chat answer starts with this many reasoning tokens (a LengthSpec; None: none),
        #: streamed as vLLM's reasoning parser streams them (``delta.reasoning``) and counted in usage
        self.reasoning = reasoning
        self._reasoning_rng = random.Random(seed)
        self.served = list(served_names or [model])  # vLLM's --served-model-name: the ids clients use
        self.loras = list(lora_modules or [])  # adapters served beside the base model (vLLM's --lora-modules)
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
        received = time.perf_counter()  # the timing log's zero for this request: when it reached the server
        rx_wall = environ.get("emulator.rx_wall")
        if rx_wall:  # the kernel stamped its arrival: count the time it waited for this loop too
            received -= max(0.0, time.time() - rx_wall)
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "GET")
        try:
            if path == "/health":
                return self._reply(start_response, 200, b"", "text/plain")
            if path == "/dcgm/metrics" and self.engine.power is not None:
                body = self.engine.power.exposition(self.engine.running)
                return self._reply(start_response, 200, body, "text/plain; version=0.0.4")
            if path == "/metrics":
                self._update_gauges()
                return self._reply(start_response, 200, self.metrics.exposition(), "text/plain; version=0.0.4")
            if path.startswith("/v1/") and self.api_key:
                if not hmac.compare_digest(environ.get("HTTP_AUTHORIZATION", "").encode(), f"Bearer {self.api_key}".encode()):
                    raise HttpError(401, "Unauthorized", "Unauthorized")
            if path in ("/start_profile", "/stop_profile") and method == "POST" and self.profiler is not None:
                if path == "/start_profile":
                    self.profiler.start()
                else:
                    self.profiler.stop()
                return self._reply(start_response, 200, b"")
            if self.profiler is not None and method == "POST" and path.startswith("/v1/"):
                self.profiler.saw_request()
            if path == "/reset_prefix_cache" and method == "POST":  # vLLM's (dev mode): the cache emptied
                self.prefix_cache.reset()
                return self._reply(start_response, 200, b'{"success":true}')
            if path == "/version":
                return self._reply(start_response, 200, orjson.dumps({"version": VERSION}))
            if path == "/v1/models":
                return self._reply(start_response, 200, self._models())
            if path in pooling.PATHS:
                if method != "POST":
                    raise HttpError(405, "Method Not Allowed", "BadRequestError")
                body = self._json_body(environ)
                model = body.get("model", self.served[0])
                if model not in self.served and model not in self.loras:
                    raise HttpError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
                fault = self.faults.pick(environ)
                if fault in ("500", "503", "429"):
                    retry = self.faults.retry_after if fault in ("503", "429") and self.faults.retry_after > 0 else None
                    raise HttpError(int(fault), f"injected fault: HTTP {fault}", "InternalServerError", retry_after=retry)
                try:
                    return self._reply(start_response, 200, pooling.serve(self, path, body))
                except pooling.PoolingError as exc:
                    raise HttpError(400, str(exc), "BadRequestError") from None
            if path == "/v1/responses":
                if method != "POST":
                    raise HttpError(405, "Method Not Allowed", "BadRequestError")
                body = self._json_body(environ)
                if self.request_log is not None:
                    self.request_log.write(orjson.dumps({"path": path, "body": body,
                                                         "headers": _loggable_headers(environ)}).decode() + "\n")
                try:
                    messages = responses.messages_of(body)
                except responses.ResponsesError as exc:
                    raise HttpError(400, str(exc), "BadRequestError", "input") from None
                if not body.get("stream"):
                    raise HttpError(400, "the emulator streams Responses only: set stream true", "BadRequestError",
                                    "stream")
                plan_body = {"model": body.get("model", self.served[0]), "messages": messages,
                             "max_tokens": body.get("max_output_tokens")}
                model, out = self._plan(True, plan_body, self.faults.pick(environ),
                                        responses.input_ids(self, messages))
                start_response("200 OK", [("Content-Type", "text/event-stream; charset=utf-8"),
                                          ("Cache-Control", "no-cache")])
                return responses.stream(self, model, out)
            if path in ("/v1/chat/completions", "/v1/completions", "/tokenize"):
                if method != "POST":
                    raise HttpError(405, "Method Not Allowed", "BadRequestError")
                body = self._json_body(environ)
                if path == "/tokenize":
                    return self._reply(start_response, 200, self._tokenize(body))
                if self.request_log is not None:
                    self.request_log.write(orjson.dumps({"path": path, "body": body,
                                                         "headers": _loggable_headers(environ)}).decode() + "\n")
                refused = [f for f in self.reject if f in body or f in (body.get("stream_options") or {})]
                if refused:  # a strict OpenAI-compatible gateway: unknown fields are an error
                    raise HttpError(400, f"Unrecognized request argument supplied: {refused[0]}", "BadRequestError",
                                    refused[0])
                return self._generate(start_response, path == "/v1/chat/completions", body, self.faults.pick(environ),
                                      received, trace_of(environ) if self.spans is not None else None)
            raise HttpError(404, f"Not Found: {path}", "NotFoundError")
        except HttpError as exc:
            extra = [("Retry-After", f"{exc.retry_after:g}")] if exc.retry_after is not None else []
            return self._reply(start_response, exc.status, exc.body(), extra=extra)

    @staticmethod
    def _reply(start_response: Start, status: int, body: bytes, ctype: str = "application/json",
               extra: list[tuple[str, str]] | None = None) -> list[bytes]:
        start_response(f"{status} {_REASONS.get(status, 'Error')}",
                       [("Content-Type", ctype), ("Content-Length", str(len(body))), *(extra or [])])
        return [body]

    @staticmethod
    def _json_body(environ: dict) -> dict:
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
            data = orjson.loads(environ["wsgi.input"].read(length))
        except (ValueError, orjson.JSONDecodeError):
            raise HttpError(400, "request body is not valid JSON", "BadRequestError") from None
        if not isinstance(data, dict):
            raise HttpError(400, "request body must be a JSON object", "BadRequestError")
        return data

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

    def _prompt_ids(self, chat: bool, body: dict) -> list[int]:
        """The prompt's token ids, as vLLM would tokenize it (chat template included)."""
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise HttpError(400, "messages must be a non-empty list", "BadRequestError", "messages")
            try:  # images, audio, video: placeholder tokens after the text, as a multimodal model charges them
                messages, media_ids, items = media.flatten(messages, self.media_cost)
            except media.MediaError as exc:
                raise HttpError(400, str(exc), "BadRequestError", "messages") from None
            if items and self.media_cost.encode_seconds > 0:
                gevent.sleep(items * self.media_cost.encode_seconds)  # the encoder's time, before the prefill
            if self.tok is None:
                return [hash(w) & 0xFFFF for m in messages for w in str(m.get("content", "")).split()] + media_ids
            try:
                return list(self.history.encode_chat(messages, body.get("tools"))) + media_ids
            except Exception as exc:  # a template that rejects the messages: vLLM answers 400 too
                raise HttpError(400, f"cannot apply the chat template: {str(exc)[:200]}", "BadRequestError",
                                "messages") from None
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return prompt
        if not isinstance(prompt, str) or not prompt:
            raise HttpError(400, "prompt must be a non-empty string or token list", "BadRequestError", "prompt")
        if self.tok is None:
            return [hash(w) & 0xFFFF for w in prompt.split()]
        return self.tok.encode(prompt, add_special_tokens=True)

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

    # -- generation -----------------------------------------------------------------------------
    def _generate(self, start_response: Start, chat: bool, body: dict, fault: str | None = None,
                  received: float = 0.0, trace: str | None = None) -> Iterable[bytes]:
        model, out = self._plan(chat, body, fault)
        if not body.get("stream"):
            return self._complete(start_response, chat, model, out, trace)
        opts = body.get("stream_options") or {}
        start_response("200 OK", [("Content-Type", "text/event-stream; charset=utf-8"), ("Cache-Control", "no-cache")])
        vllm = self.stream_style == "vllm"
        return self._stream(chat, model, out, bool(opts.get("include_usage")) and vllm,
                            bool(opts.get("include_usage") and opts.get("continuous_usage_stats")) and vllm, fault,
                            received, trace)

    def _plan(self, chat: bool, body: dict, fault: str | None = None,
              ids: list[int] | None = None) -> tuple[str, Output]:
        """What a generation request will produce (its model and Output), or the HttpError vLLM would answer.
        ``ids``: the prompt's token ids when the caller tokenized it (the Responses API)."""
        model = body.get("model", self.served[0])
        if model not in self.served and model not in self.loras:
            raise HttpError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        ids = self._prompt_ids(chat, body) if ids is None else ids
        prompt_tokens = len(ids)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        finish = "length"
        tool = _tool_to_call(body) if chat else None
        if max_tokens is None:
            max_tokens = 16 if not chat else max(1, self.max_model_len - prompt_tokens)
            if self.eos_after and max_tokens > self.eos_after:  # the "model" stops on its own
                max_tokens, finish = self.eos_after, "stop"
        if tool is not None:  # a call's arguments are short, whatever the length asked
            max_tokens, finish = min(max_tokens, TOOL_CALL_TOKENS), "tool_calls"
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise HttpError(400, f"max_tokens must be at least 1, got {max_tokens}.", "BadRequestError", "max_tokens")
        if prompt_tokens + max_tokens > self.max_model_len:
            raise HttpError(400, (
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the "
                "completion). Please reduce the length of the messages or completion."), "BadRequestError")
        if not self.engine.fits(prompt_tokens + max_tokens):
            raise HttpError(400, f"{prompt_tokens + max_tokens} tokens do not fit the KV cache of "
                                 f"{self.engine.cfg.num_gpu_blocks} blocks of {self.engine.cfg.block_size}", "BadRequestError")
        if fault in ("500", "503", "429"):
            # an overloaded server tells clients when to come back (--retry-after; 0: no header)
            retry = self.faults.retry_after if fault in ("503", "429") and self.faults.retry_after > 0 else None
            raise HttpError(int(fault), f"injected fault: HTTP {fault}", "InternalServerError", retry_after=retry)
        self.metrics.l(self.metrics.prefix_queries).inc(prompt_tokens)
        cached = self.prefix_cache.query(ids)
        self.metrics.l(self.metrics.prefix_hits).inc(cached)
        if fault == "overrun":  # a broken server: it streams 100 times the tokens asked
            max_tokens = max_tokens * 100
        thinking = 0
        if chat and tool is None and self.reasoning is not None:  # within max_tokens, as a real model's thinking
            thinking = min(max_tokens, self.reasoning.sample(self._reasoning_rng))
        kv_params = body.get("kv_transfer_params")
        kv = ("" if not isinstance(kv_params, dict) else "produce" if kv_params.get("do_remote_decode")
              else "consume" if kv_params.get("do_remote_prefill") else "")
        return model, Output(ids, max_tokens, finish, tool, cached, thinking, kv)

    def _usage(self, out: Output, n: int) -> dict:
        prompt_tokens = len(out.ids)
        usage: dict = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + n, "completion_tokens": n}
        if self.prompt_tokens_details:
            usage["prompt_tokens_details"] = {"cached_tokens": out.cached}
        if out.reasoning:
            usage["completion_tokens_details"] = {"reasoning_tokens": min(n, out.reasoning)}
        return usage

    def _cache_answer(self, out: Output, text: str) -> None:
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

    def _observe_finish(self, prompt_tokens: int, out: int, ttft: float, e2e: float, queue: float = 0.0,
                        finish: str = "length") -> None:
        m = self.metrics
        m.l(m.prompt_tokens).inc(prompt_tokens)
        m.success.labels(finished_reason="stop" if finish == "tool_calls" else finish, **m.labels).inc()
        m.l(m.e2e).observe(e2e)
        m.l(m.queue).observe(queue)
        m.l(m.prefill).observe(max(0.0, ttft - queue))
        m.l(m.decode).observe(max(0.0, e2e - ttft))
        m.l(m.req_prompt).observe(prompt_tokens)
        m.l(m.req_generation).observe(out)

    def _complete(self, start_response: Start, chat: bool, model: str, out: Output,
                  trace: str | None = None) -> list[bytes]:
        words = itertools.cycle(_WORDS)
        prompt_tokens, max_tokens = len(out.ids), out.max_tokens
        text, ttft, last = [], 0.0, 0.0
        m, first, queue = self.metrics, True, 0.0
        pieces = _tool_pieces(out.tool, max_tokens) if out.tool else None
        shift = self._pull_kv(out)
        for em in self.engine.generate(prompt_tokens, max_tokens, out.cached, remote=out.kv == "consume"):
            offset = em.offset + shift  # after its arrival here, a decode's KV pull included
            if first:
                ttft, queue, first = offset, em.queue_time, False
                m.l(m.ttft).observe(ttft)
            else:
                for _ in range(em.tokens):
                    m.l(m.itl).observe((offset - last) / em.tokens)
            last = offset
            text.extend(next(pieces) if pieces else next(words) for _ in range(em.tokens))
        m.l(m.generation_tokens).inc(max_tokens)
        self._observe_finish(prompt_tokens, max_tokens, ttft, last, queue, out.finish)
        usage = self._usage(out, max_tokens)
        rid, created = secrets.token_hex(8), int(time.time())
        self._export_span(trace, f"{'chatcmpl' if chat else 'cmpl'}-{rid}", queue, ttft, last, max_tokens, prompt_tokens)
        answer = "".join(text)
        self._cache_answer(out, answer)
        if chat:
            message: dict = {"role": "assistant", "content": answer}
            if out.reasoning:
                message = {"role": "assistant", "content": "".join(text[out.reasoning:]) or None,
                           "reasoning": "".join(text[:out.reasoning])}
            if out.tool:
                message = {"role": "assistant", "content": None, "tool_calls": [
                    {"id": _tool_call_id(), "type": "function", "function": {"name": out.tool, "arguments": answer}}]}
            body = {"id": f"chatcmpl-{rid}", "object": "chat.completion", "created": created, "model": model,
                    "choices": [{"index": 0, "message": message,
                                 "logprobs": None, "finish_reason": out.finish, "stop_reason": None}], "usage": usage}
        else:
            body = {"id": f"cmpl-{rid}", "object": "text_completion", "created": created, "model": model,
                    "choices": [{"index": 0, "text": answer, "logprobs": None, "finish_reason": out.finish,
                                 "stop_reason": None}], "usage": usage}
        if out.kv == "produce":  # a prefill instance: where its decode instance pulls the KV from
            body["kv_transfer_params"] = _kv_transfer_params(self, out)
        return self._reply(start_response, 200, orjson.dumps(body))

    def _pull_kv(self, out: Output) -> float:
        """A decode instance (P/D): the prompt's KV pulled from its prefill instance, taking --kv-transfer-latency
        plus --kv-transfer-per-token per prompt token; the seconds it took (0 otherwise)."""
        if out.kv != "consume":
            return 0.0
        seconds = self.kv_transfer[0] + self.kv_transfer[1] * len(out.ids)
        gevent.sleep(seconds)
        xfer_time, xfer_bytes, _failed = self.metrics.nixl()
        self.metrics.l(xfer_time).observe(seconds)
        self.metrics.l(xfer_bytes).observe(len(out.ids) * KV_BYTES_PER_TOKEN)
        return seconds

    def _export_span(self, trace: str | None, rid: str, queue: float, ttft: float, last: float,
                     tokens: int, prompt_tokens: int) -> None:
        """The request's span, as vLLM's --otlp-traces-endpoint sends one (a request that carried a traceparent)."""
        if trace is None or self.spans is None:
            return
        times = per_request_metrics(queue, ttft, last, tokens)
        now = time.time_ns()
        self.spans.add({"trace_id": trace, "span_id": secrets.token_hex(8), "request_id": rid, "queue": queue,
                        "prefill": times["time_to_first_token_ms"] / 1000, "decode": times["generation_time_ms"] / 1000,
                        "ttft": ttft, "e2e": last, "prompt_tokens": prompt_tokens, "completion_tokens": tokens,
                        "start_ns": now - int(last * 1e9), "end_ns": now})

    def _stream(self, chat: bool, model: str, out_spec: Output, include_usage: bool,
                continuous: bool, fault: str | None = None, received: float = 0.0,
                trace: str | None = None) -> Iterable[bytes]:
        m = self.metrics
        log = self.timing_log
        due: list[float] = []
        sent: list[float] = []  # when each token-bearing chunk had been written to the socket
        perf = time.perf_counter
        arrival = 0.0  # when the engine took the request, seconds after it was received
        rid, created = secrets.token_hex(8), int(time.time())
        head = ({"id": f"chatcmpl-{rid}", "object": "chat.completion.chunk"} if chat
                else {"id": f"cmpl-{rid}", "object": "text_completion"})
        head.update(created=created, model=model)
        words = itertools.cycle(_WORDS)
        prompt_tokens, max_tokens, cached = len(out_spec.ids), out_spec.max_tokens, out_spec.cached
        tool = out_spec.tool
        pieces = _tool_pieces(tool, max_tokens) if tool else None
        answer: list[str] = []
        out, ttft, prev, queue = 0, 0.0, 0.0, 0.0

        def usage(n: int) -> dict:
            return self._usage(out_spec, n)

        def event(obj: dict) -> bytes:
            return b"data: " + orjson.dumps(obj) + b"\n\n"

        if fault == "slow-headers":
            gevent.sleep(self.faults.stall_seconds)
        fault_at = max(1, max_tokens // 2)  # mid-stream faults strike after half the tokens
        shift = self._pull_kv(out_spec)  # a decode instance's KV transfer: before its first token
        for em in self.engine.generate(prompt_tokens, max_tokens, cached, remote=out_spec.kv == "consume"):
            if out >= fault_at and fault in ("drop", "malformed", "error", "stall"):
                if fault == "drop":
                    raise DropConnection()
                if fault == "malformed":
                    yield b'data: {"id": "broken\n\n'
                elif fault == "error":
                    yield event({"error": {"message": f"injected fault: engine error in request {rid}",
                                           "type": "InternalServerError",
                                           "param": None, "code": 500}})
                    yield b"data: [DONE]\n\n"
                    return
                else:
                    gevent.sleep(self.faults.stall_seconds)
                fault = None
            parts = [next(pieces) if pieces else next(words) for _ in range(em.tokens)]
            text = "".join(parts)
            answer.append(text)
            m.l(m.generation_tokens).inc(em.tokens)
            offset = em.offset + shift  # after its arrival here, a decode's KV pull included
            if out == 0:
                ttft, queue = offset, em.queue_time
                arrival = em.at - em.offset - received  # the engine's own arrival, not one re-read later
                m.l(m.ttft).observe(ttft)
                if chat:
                    role = {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                 "logprobs": None, "finish_reason": None}]}
                    if continuous:
                        role["usage"] = usage(0)
                    role.update(prompt_token_ids=None, prompt_text=None)
                    yield event(role)
            else:
                gap = (offset - prev) / em.tokens
                for _ in range(em.tokens):
                    m.l(m.itl).observe(gap)
            prev = offset
            if em.due is not None:  # how late this process wrote it against its own schedule (a starved emulator)
                self.emitted += 1
                if em.offset - em.due > LATE_S:
                    self.late += 1
            # a reasoning model's chunk is its thinking, its answer, or (at the switch) two chunks: one of each
            thinking = min(em.tokens, max(0, out_spec.reasoning - out))
            for n, kind, piece in ((thinking, "reasoning", "".join(parts[:thinking])),
                                   (em.tokens - thinking, "content", "".join(parts[thinking:]))):
                if not n:
                    continue
                out += n
                last = out >= max_tokens
                # transformers serve: the finish_reason comes alone, with the usage, in a chunk of its own
                finish = out_spec.finish if last and self.stream_style != "transformers" else None
                if tool:  # vLLM's shape: the first delta names the call (id, type, name), the next ones add arguments
                    call: dict = {"index": 0, "function": {"arguments": piece}}
                    if out == n:
                        call = {"id": _tool_call_id(), "type": "function", "index": 0,
                                "function": {"name": tool, "arguments": piece}}
                    choice: dict = {"index": 0, "delta": {"tool_calls": [call]}, "logprobs": None,
                                    "finish_reason": finish}
                elif chat:
                    choice = {"index": 0, "delta": {kind: piece}, "logprobs": None, "finish_reason": finish}
                else:
                    choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": finish}
                choice["stop_reason"] = None
                if not chat:
                    choice["prompt_token_ids"] = None
                choice["token_ids"] = None
                chunk = {**head, "choices": [choice]}
                if continuous:
                    chunk["usage"] = usage(out)
                yield event(chunk)
            if log is not None:  # resumed only once the server has written the chunk
                sent.append(perf() - received)
                due.append(em.offset if em.due is None else em.due)
        if self.stream_style == "transformers":  # its last chunk: the finish_reason and the usage, no [DONE]
            yield event({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": out_spec.finish}],
                         "usage": usage(out)})
        if include_usage:
            last: dict = {**head, "choices": [], "usage": usage(out), "system_fingerprint": FINGERPRINT}
            if self.per_request_metrics:  # vLLM's --enable-per-request-metrics: its own times of this request
                last["metrics"] = per_request_metrics(queue, ttft, prev, out)
            yield event(last)
        self._observe_finish(prompt_tokens, out, ttft, prev, queue, out_spec.finish)
        self._export_span(trace, head["id"], queue, ttft, prev, out, prompt_tokens)
        if self.stream_style == "vllm":  # the other servers end the stream after the finish_reason
            yield b"data: [DONE]\n\n"
        if log is not None:  # resumed once the stream's last event had been written: its end, for the E2E
            log.write(orjson.dumps({"id": head["id"], "arrival": round(arrival, 7),
                                    "due": [round(arrival + d, 7) for d in due],
                                    "sent": [round(x, 7) for x in sent],
                                    "done": round(perf() - received, 7)}).decode() + "\n")
        self._cache_answer(out_spec, "".join(answer))


#: an 8B Llama's KV per token (32 layers x 8 KV heads x 128 dims x K and V x 2 bytes): a pull's bytes
KV_BYTES_PER_TOKEN = 131072


def _kv_transfer_params(app: Emulator, out: Output) -> dict:
    """What a prefill instance answers for its decode instance to pull the KV (vLLM's NIXL connector's fields)."""
    return {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": app.replica,
            "remote_block_ids": list(range(-(-len(out.ids) // app.prefix_cache.block_size))), "remote_host": app.replica.rsplit(":", 1)[0],
            "remote_port": 0, "tp_size": 1}


def per_request_metrics(queue: float, ttft: float, last: float, tokens: int) -> dict:
    """vLLM 0.32's per-request metrics from this emulator's own times (seconds after it received the request):
    queued to scheduled, scheduled to the first token, the first token to the last."""
    prefill, generation = max(0.0, ttft - queue), max(0.0, last - ttft)
    return {"time_to_first_token_ms": prefill * 1000, "generation_time_ms": generation * 1000,
            "queue_time_ms": queue * 1000, "mean_itl_ms": generation * 1000 / (tokens - 1) if tokens > 1 else None,
            "tokens_per_second": tokens / (last - queue) if last > queue else None}


class ArrivalStampingHandler(WSGIHandler):
    """Peeks at each request's first packet for the kernel's receive stamp (``emulator.rx_wall`` in
    the environ): the timing log's truth starts when a request reached the server, not when the
    server's loop got round to it. One extra syscall per request, so only with ``--timing-log``.
    Assumes no pipelining (a client sends its next request after the response), as HTTP clients do."""

    rx_wall: float | None = None

    def read_requestline(self) -> str:
        try:
            _byte, ancdata, _flags, _addr = self.socket.recvmsg(1, rxstamp.ANCBUF, socket.MSG_PEEK)
            self.rx_wall = rxstamp.stamp_of(ancdata)
        except OSError:
            self.rx_wall = None
        return super().read_requestline()

    def get_environ(self) -> dict:
        environ = super().get_environ()
        environ["emulator.rx_wall"] = self.rx_wall
        return environ


class NoDelayWSGIServer(WSGIServer):
    """Streams small SSE chunks without Nagle's delay (uvicorn, vLLM's server, sets TCP_NODELAY too)."""

    def handle(self, sock: socket.socket, address: Any) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().handle(sock, address)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m server.emulator", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (0 picks a free one; the URL is printed)")
    p.add_argument("--replica-name", default="",
                   help=f"the name every answer gives in its {REPLICA_HEADER} header (default: HOST:PORT it listens on)")
    p.add_argument("--stream-style", default="vllm", choices=["vllm", "transformers", "no-usage"],
                   help="how a stream ends, as other OpenAI servers end it: vllm (usage when asked, [DONE]); "
                        "transformers (transformers serve: the finish_reason and the usage in one last chunk with a "
                        "choice, no [DONE]); no-usage (no usage at all, no [DONE]: a proxy that strips it)")
    p.add_argument("--model", default="emulator/mistral-7b-v0.1", help="served model name")
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="the model ids clients use (default: --model), as vLLM's flag; /v1/models gives --model as root")
    p.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME",
                   help="LoRA adapters served beside the base model: listed in /v1/models, accepted as model")
    p.add_argument("--tokenizer", default="", help="tokenizer used to count prompt tokens (default: the model's)")
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--profiler-config", default="", metavar="JSON",
                   help="as vLLM's: serve POST /start_profile and /stop_profile (404 without it); each profile's window "
                        "and request count go into torch_profiler_dir as JSON")
    p.add_argument("--ttft", type=float, default=0.05, help="seconds to the first token")
    p.add_argument("--itl", type=float, default=0.01, help="seconds between tokens")
    p.add_argument("--prefill-per-token", type=float, default=0.0, help="extra TTFT seconds per prompt token")
    p.add_argument("--tokens-per-chunk", type=int, default=1, help="output tokens carried by each SSE chunk")
    p.add_argument("--jitter", type=float, default=0.0,
                   help="draw each TTFT and ITL uniformly from value*(1 +- JITTER), seeded by --seed (0..1)")
    p.add_argument("--itl-cycle", default="", metavar="S,S,…",
                   help="token gaps cycle through these seconds instead of --itl (a GPU's uneven decode steps, e.g. "
                        "0.01,0.03,0.02,0.005,0.04); with --lockstep the global steps do")
    p.add_argument("--lockstep", action="store_true",
                   help="emit every stream's tokens together on one global ITL grid, like a batched decode step")
    p.add_argument("--timing-log", default="",
                   help="write one JSON line per stream: arrival, scheduled (due) and actual write time of each "
                        "token-bearing chunk, and when its last event had been written (done), in seconds after the "
                        "request reached the server (its kernel receive stamp): the timing benchmark's truth")
    p.add_argument("--api-key", default="", help="require this bearer token on /v1/*")
    p.add_argument("--profile", default="", choices=["", *PROFILES],
                   help="model vLLM's continuous batching with this cost profile (default: fixed --ttft/--itl schedule)")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--num-gpu-blocks", type=int, default=30000)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--time-scale", type=float, default=1.0, help="multiply every step time (e.g. 0.1: ten times faster)")
    p.add_argument("--metrics-naming", choices=["v1", "v0"], default="v1", help="vLLM metric names: V1 (0.32) or old V0")
    p.add_argument("--log-stats-interval", type=float, default=10.0,
                   help="seconds between vLLM's stats log lines on stderr (0: none)")
    p.add_argument("--fault", action="append", default=[], metavar="KIND:RATE",
                   help="inject a fault into this share of requests (500, 503, 429, drop, malformed, error, stall, "
                        "slow-headers); a request can also ask for one with the X-Emulator-Fault header")
    p.add_argument("--stall-seconds", type=float, default=30.0, help="length of stall and slow-headers faults")
    p.add_argument("--retry-after", type=float, default=0.0,
                   help="503/429 faults carry this Retry-After header, in seconds (0: none)")
    p.add_argument("--seed", type=int, default=0, help="seed of the fault and jitter draws")
    p.add_argument("--eos-after", type=int, default=64,
                   help="a request without max_tokens stops on its own (finish_reason stop) after this many tokens "
                        "(0: it runs to the context's end)")
    p.add_argument("--reasoning-tokens", default="", metavar="LENGTH",
                   help="a reasoning model: each chat answer starts with this many reasoning tokens (N, LOW-HIGH or "
                        "normal:MEAN,STD; within max_tokens), streamed in delta.reasoning as vLLM's reasoning "
                        "parsers do, and counted in usage.completion_tokens_details.reasoning_tokens")
    p.add_argument("--spec-tokens", type=int, default=0,
                   help="speculative decoding: each decode step drafts this many tokens (vLLM's "
                        "num_speculative_tokens) and yields 1 + the accepted ones; vllm:spec_decode_* counted (0: off)")
    p.add_argument("--spec-acceptance", type=float, default=0.7,
                   help="the chance that a draft position is accepted, given the positions before it were")
    p.add_argument("--dcgm", action="store_true",
                   help="serve GPU telemetry as NVIDIA's DCGM exporter does at /dcgm/metrics, from a power model: "
                        "--dcgm-idle-watts + --dcgm-watts-per-seq per running sequence (energy counted exactly)")
    p.add_argument("--dcgm-idle-watts", type=float, default=60.0)
    p.add_argument("--dcgm-watts-per-seq", type=float, default=4.0)
    p.add_argument("--owned-by", default="vllm",
                   help="/v1/models' owned_by (e.g. llamacpp: act as a server that is not vLLM, with --reject)")
    p.add_argument("--image-patch", type=int, default=28,
                   help="an image costs one prompt token per PATCHxPATCH pixels (Qwen2-VL's 28)")
    p.add_argument("--audio-tokens-per-second", type=float, default=25.0,
                   help="prompt tokens per second of input_audio (Qwen2-Audio's 25)")
    p.add_argument("--encode-seconds", type=float, default=0.005,
                   help="encoder time per image, audio clip or video, added before the prefill")
    p.add_argument("--enable-per-request-metrics", action="store_true",
                   help="a stream's last usage chunk carries its own times, as vLLM's flag: metrics "
                        "{queue_time_ms, time_to_first_token_ms (from its scheduling), generation_time_ms, mean_itl_ms, "
                        "tokens_per_second}")
    p.add_argument("--kv-transfer-latency", type=float, default=0.001,
                   help="disaggregated prefill/decode behind vLLM's router: a decode instance's KV pull takes this "
                        "(seconds) plus --kv-transfer-per-token per prompt token before its first token")
    p.add_argument("--kv-transfer-per-token", type=float, default=1e-6,
                   help="seconds per prompt token of that pull (1e-6: ~128 KB a token at ~100 GB/s)")
    p.add_argument("--otlp-traces-endpoint", default="",
                   help="export each request's llm_request span here (OTLP/HTTP protobuf), as vLLM's flag: requests "
                        "that carry a traceparent, with the emulator's own queue, prefill and decode times")
    p.add_argument("--enable-prompt-tokens-details", action="store_true",
                   help="usage carries prompt_tokens_details.cached_tokens (the prefix-cache hit), as vLLM's flag")
    p.add_argument("--ssl-keyfile", default="", help="serve https with this key (and --ssl-certfile), as vLLM's flags")
    p.add_argument("--ssl-certfile", default="")
    p.add_argument("--reject", default="", metavar="FIELD,…",
                   help="answer 400 to requests carrying these body fields (e.g. min_tokens,continuous_usage_stats), "
                        "like a strict OpenAI-compatible gateway")
    p.add_argument("--request-log", default="",
                   help="append every generation request's path and JSON body to this file (for tests: what a "
                        "client really sent, with its headers; credential-like header values are written as ***)")
    return p


def main(argv: list[str] | None = None) -> int:
    from vllm_load.lifeline import from_environment

    from_environment()  # embedded in a run: gone with it, however it ends
    args = build_parser().parse_args(argv)
    if not 0 <= args.port <= 65535:
        sys.stderr.write(f"emulator: error: --port {args.port} is no TCP port: give 1-65535 (0: a free one)\n")
        return 2
    if args.ttft < 0 or args.itl < 0 or args.tokens_per_chunk < 1 or args.max_model_len < 1:
        sys.stderr.write("emulator: error: --ttft/--itl must be >= 0, --tokens-per-chunk and --max-model-len >= 1\n")
        return 2
    try:
        cycle = tuple(float(x) for x in args.itl_cycle.split(",") if x.strip())
    except ValueError:
        cycle = (-1.0,)
    if any(x <= 0 for x in cycle):
        sys.stderr.write(f"emulator: error: --itl-cycle {args.itl_cycle!r} must list positive seconds, e.g. 0.01,0.03\n")
        return 2
    if not 0.0 <= args.jitter <= 1.0:
        sys.stderr.write(f"emulator: error: --jitter {args.jitter} is not between 0 and 1 (a fraction of TTFT/ITL)\n")
        return 2
    try:
        faults = FaultPlan(dict(parse_fault(f) for f in args.fault), args.stall_seconds, random.Random(args.seed),
                           retry_after=args.retry_after)
    except ValueError as exc:
        sys.stderr.write(f"emulator: error: {exc}\n")
        return 2
    if sum(faults.rates.values()) > 1.0:
        sys.stderr.write("emulator: error: the --fault rates add up to more than 1\n")
        return 2
    from vllm_load.errors import UsageError
    from vllm_load.workload.lengths import parse_length
    from vllm_load.workload.tokenizer import load_tokenizer

    try:
        reasoning = parse_length(args.reasoning_tokens, "--reasoning-tokens") if args.reasoning_tokens else None
        tok = load_tokenizer(args.tokenizer or args.model)
    except UsageError as exc:
        sys.stderr.write(f"emulator: error: {exc}\n")
        return 2
    if min(args.max_num_seqs, args.max_num_batched_tokens, args.num_gpu_blocks, args.block_size) < 1 or args.time_scale <= 0:
        sys.stderr.write("emulator: error: scheduler sizes must be >= 1 and --time-scale > 0\n")
        return 2
    if args.spec_tokens < 0 or not 0.0 <= args.spec_acceptance <= 1.0 or (args.spec_tokens and args.profile):
        sys.stderr.write("emulator: error: --spec-tokens must be >= 0 and --spec-acceptance within 0..1; speculative "
                         "decoding runs on the fixed schedule (not with --profile)\n")
        return 2
    engine: FixedScheduleEngine | BatchingEngine
    if args.profile:
        engine = BatchingEngine(SchedulerConfig(cost=PROFILES[args.profile], max_num_seqs=args.max_num_seqs,
                                                max_num_batched_tokens=args.max_num_batched_tokens,
                                                num_gpu_blocks=args.num_gpu_blocks, block_size=args.block_size,
                                                time_scale=args.time_scale))
    else:
        engine = FixedScheduleEngine(EngineConfig(ttft=args.ttft, itl=args.itl, prefill_per_token=args.prefill_per_token,
                                                  tokens_per_chunk=args.tokens_per_chunk, jitter=args.jitter,
                                                  lockstep=args.lockstep, seed=args.seed, itl_cycle=cycle,
                                                  num_gpu_blocks=args.num_gpu_blocks, block_size=args.block_size,
                                                  spec_tokens=args.spec_tokens, spec_acceptance=args.spec_acceptance))
    if args.dcgm:
        engine.power = dcgm.PowerModel(idle_w=max(0.0, args.dcgm_idle_watts), per_seq_w=max(0.0, args.dcgm_watts_per_seq))
    timing_log = open(args.timing_log, "a", buffering=1) if args.timing_log else None  # noqa: SIM115 (lives as long as the server)
    request_log = open(args.request_log, "a", buffering=1) if args.request_log else None  # noqa: SIM115
    app = Emulator(args.model, tok, args.max_model_len, engine, api_key=args.api_key, faults=faults,
                   naming=args.metrics_naming, timing_log=timing_log, request_log=request_log,
                   eos_after=max(0, args.eos_after), prompt_tokens_details=args.enable_prompt_tokens_details,
                   served_names=args.served_model_name, lora_modules=args.lora_modules,
                   reject=[f.strip() for f in args.reject.split(",") if f.strip()], reasoning=reasoning,
                   seed=args.seed, media_cost=media.MediaCost(max(1, args.image_patch),
                                                               max(0.0, args.audio_tokens_per_second),
                                                               max(0.0, args.encode_seconds)))
    app.owned_by = args.owned_by
    app.stream_style = args.stream_style
    app.per_request_metrics = args.enable_per_request_metrics
    app.kv_transfer = (max(0.0, args.kv_transfer_latency), max(0.0, args.kv_transfer_per_token))
    if args.profiler_config:
        try:
            app.profiler = Profiler(args.profiler_config)
        except ValueError as exc:  # json.JSONDecodeError is one
            sys.stderr.write(f"emulator: error: --profiler-config: {exc}\n")
            return 2
    if args.otlp_traces_endpoint:
        try:
            from opentelemetry.proto.collector.trace.v1 import trace_service_pb2  # noqa: F401
        except ImportError:
            sys.stderr.write("emulator: --otlp-traces-endpoint needs opentelemetry-proto: pip install 'vllm-load[otel]'\n")
            return 2
        app.spans = SpanExporter(args.otlp_traces_endpoint, args.replica_name or "unknown_service:emulator")
    if args.log_stats_interval > 0:
        def log_stats() -> None:
            while True:
                gevent.sleep(args.log_stats_interval)
                sys.stderr.write(app.stats_line(args.log_stats_interval) + "\n")
                sys.stderr.flush()
        gevent.spawn(log_stats)
    handler = ArrivalStampingHandler if timing_log is not None else WSGIHandler
    tls = {"keyfile": args.ssl_keyfile, "certfile": args.ssl_certfile} if args.ssl_certfile else {}
    server = NoDelayWSGIServer((args.host, args.port), app, log=None, error_log=None, handler_class=handler, **tls)
    server.init_socket()
    if timing_log is not None:
        rxstamp.enable(server.socket)  # accepted connections inherit it
    host, port = server.socket.getsockname()[:2]
    scheme = "https" if tls else "http"
    app.replica = args.replica_name or f"{host}:{port}"
    print(f"vllm-load emulator listening on {scheme}://{host}:{port} model {' '.join(app.served + app.loras)}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
