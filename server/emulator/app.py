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
from typing import IO, Any, Callable, Iterable

import gevent
import orjson
from gevent.pywsgi import WSGIHandler, WSGIServer

from .engine import EngineConfig, FixedScheduleEngine
from .scheduler import PROFILES, BatchingEngine, SchedulerConfig
from .faults import FaultPlan, parse_fault
from .prefix_cache import PrefixCache
from .vllm_metrics import VllmMetrics
from vllm_load.client import rxstamp

VERSION = "0.32.0"
FINGERPRINT = f"vllm-{VERSION}-emulator"
_WORDS = (" the", " model", " answers", " with", " tokens", " that", " stream", " back", " to", " a",
          " client", " under", " load", " while", " batches", " grow", " and", " caches", " fill", " up")

Start = Callable[[str, list], Any]


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


class DropConnection(Exception):
    """Raised inside a streaming body: the server closes the connection without ending the stream."""


class Emulator:
    def __init__(self, model: str, tokenizer: Any, max_model_len: int, engine: FixedScheduleEngine | BatchingEngine,
                 api_key: str = "", faults: FaultPlan | None = None, naming: str = "v1",
                 timing_log: IO[str] | None = None, request_log: IO[str] | None = None) -> None:
        self.model = model
        self.faults = faults or FaultPlan()
        self.tok = tokenizer
        self.max_model_len = max_model_len
        self.engine = engine
        self.api_key = api_key
        self.metrics = VllmMetrics(model, naming)
        self.prefix_cache = PrefixCache(engine.cfg.block_size, engine.cfg.num_gpu_blocks)
        self._preemptions_seen = 0
        self.created = int(time.time())
        self.timing_log = timing_log
        self.request_log = request_log  # every generation request's path and body, for tests

    # -- WSGI -----------------------------------------------------------------------------------
    def __call__(self, environ: dict, start_response: Start) -> Iterable[bytes]:
        received = time.perf_counter()  # the timing log's zero for this request: when it reached the server
        rx_wall = environ.get("emulator.rx_wall")
        if rx_wall:  # the kernel stamped its arrival: count the time it waited for this loop too
            received -= max(0.0, time.time() - rx_wall)
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "GET")
        try:
            if path == "/health":
                return self._reply(start_response, 200, b"", "text/plain")
            if path == "/metrics":
                self._update_gauges()
                return self._reply(start_response, 200, self.metrics.exposition(), "text/plain; version=0.0.4")
            if path.startswith("/v1/") and self.api_key:
                if not hmac.compare_digest(environ.get("HTTP_AUTHORIZATION", "").encode(), f"Bearer {self.api_key}".encode()):
                    raise HttpError(401, "Unauthorized", "Unauthorized")
            if path == "/version":
                return self._reply(start_response, 200, orjson.dumps({"version": VERSION}))
            if path == "/v1/models":
                return self._reply(start_response, 200, self._models())
            if path in ("/v1/chat/completions", "/v1/completions", "/tokenize"):
                if method != "POST":
                    raise HttpError(405, "Method Not Allowed", "BadRequestError")
                body = self._json_body(environ)
                if path == "/tokenize":
                    return self._reply(start_response, 200, self._tokenize(body))
                if self.request_log is not None:
                    self.request_log.write(orjson.dumps({"path": path, "body": body}).decode() + "\n")
                return self._generate(start_response, path == "/v1/chat/completions", body, self.faults.pick(environ),
                                      received)
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
        return orjson.dumps({"object": "list", "data": [{
            "id": self.model, "object": "model", "created": self.created, "owned_by": "vllm",
            "root": self.model, "parent": None, "max_model_len": self.max_model_len,
            "permission": [{"id": "modelperm-emulator", "object": "model_permission", "created": self.created,
                            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                            "organization": "*", "group": None, "is_blocking": False}],
        }]})

    def _prompt_ids(self, chat: bool, body: dict) -> list[int]:
        """The prompt's token ids, as vLLM would tokenize it (chat template included)."""
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise HttpError(400, "messages must be a non-empty list", "BadRequestError", "messages")
            if self.tok is None:
                return [hash(w) & 0xFFFF for m in messages for w in str(m.get("content", "")).split()]
            return self.tok.encode_chat(messages)
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

    # -- generation -----------------------------------------------------------------------------
    def _generate(self, start_response: Start, chat: bool, body: dict, fault: str | None = None,
                  received: float = 0.0) -> Iterable[bytes]:
        model = body.get("model", self.model)
        if model != self.model:
            raise HttpError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        ids = self._prompt_ids(chat, body)
        prompt_tokens = len(ids)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if max_tokens is None:
            max_tokens = 16 if not chat else max(1, self.max_model_len - prompt_tokens)
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
        if not body.get("stream"):
            return self._complete(start_response, chat, model, prompt_tokens, max_tokens, cached)
        opts = body.get("stream_options") or {}
        start_response("200 OK", [("Content-Type", "text/event-stream; charset=utf-8"), ("Cache-Control", "no-cache")])
        return self._stream(chat, model, prompt_tokens, max_tokens, bool(opts.get("include_usage")),
                            bool(opts.get("include_usage") and opts.get("continuous_usage_stats")), fault, cached,
                            received)

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

    def _observe_finish(self, prompt_tokens: int, out: int, ttft: float, e2e: float, queue: float = 0.0) -> None:
        m = self.metrics
        m.l(m.prompt_tokens).inc(prompt_tokens)
        m.success.labels(finished_reason="length", **m.labels).inc()
        m.l(m.e2e).observe(e2e)
        m.l(m.queue).observe(queue)
        m.l(m.prefill).observe(max(0.0, ttft - queue))
        m.l(m.decode).observe(max(0.0, e2e - ttft))
        m.l(m.req_prompt).observe(prompt_tokens)
        m.l(m.req_generation).observe(out)

    def _complete(self, start_response: Start, chat: bool, model: str, prompt_tokens: int, max_tokens: int,
                  cached: int = 0) -> list[bytes]:
        words = itertools.cycle(_WORDS)
        text, ttft, last = [], 0.0, 0.0
        m, first, queue = self.metrics, True, 0.0
        for em in self.engine.generate(prompt_tokens, max_tokens, cached):
            if first:
                ttft, queue, first = em.offset, em.queue_time, False
                m.l(m.ttft).observe(ttft)
            else:
                for _ in range(em.tokens):
                    m.l(m.itl).observe((em.offset - last) / em.tokens)
            last = em.offset
            text.extend(next(words) for _ in range(em.tokens))
        m.l(m.generation_tokens).inc(max_tokens)
        self._observe_finish(prompt_tokens, max_tokens, ttft, last, queue)
        usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + max_tokens, "completion_tokens": max_tokens}
        rid, created = secrets.token_hex(8), int(time.time())
        if chat:
            body = {"id": f"chatcmpl-{rid}", "object": "chat.completion", "created": created, "model": model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(text)},
                                 "logprobs": None, "finish_reason": "length", "stop_reason": None}], "usage": usage}
        else:
            body = {"id": f"cmpl-{rid}", "object": "text_completion", "created": created, "model": model,
                    "choices": [{"index": 0, "text": "".join(text), "logprobs": None, "finish_reason": "length",
                                 "stop_reason": None}], "usage": usage}
        return self._reply(start_response, 200, orjson.dumps(body))

    def _stream(self, chat: bool, model: str, prompt_tokens: int, max_tokens: int, include_usage: bool,
                continuous: bool, fault: str | None = None, cached: int = 0, received: float = 0.0) -> Iterable[bytes]:
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
        out, ttft, prev, queue = 0, 0.0, 0.0, 0.0

        def usage(n: int) -> dict:
            return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + n, "completion_tokens": n}

        def event(obj: dict) -> bytes:
            return b"data: " + orjson.dumps(obj) + b"\n\n"

        if fault == "slow-headers":
            gevent.sleep(self.faults.stall_seconds)
        fault_at = max(1, max_tokens // 2)  # mid-stream faults strike after half the tokens
        for em in self.engine.generate(prompt_tokens, max_tokens, cached):
            if out >= fault_at and fault in ("drop", "malformed", "error", "stall"):
                if fault == "drop":
                    raise DropConnection()
                if fault == "malformed":
                    yield b'data: {"id": "broken\n\n'
                elif fault == "error":
                    yield event({"error": {"message": "injected fault: engine error", "type": "InternalServerError",
                                           "param": None, "code": 500}})
                    yield b"data: [DONE]\n\n"
                    return
                else:
                    gevent.sleep(self.faults.stall_seconds)
                fault = None
            text = "".join(next(words) for _ in range(em.tokens))
            m.l(m.generation_tokens).inc(em.tokens)
            if out == 0:
                ttft, queue = em.offset, em.queue_time
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
                gap = (em.offset - prev) / em.tokens
                for _ in range(em.tokens):
                    m.l(m.itl).observe(gap)
            prev = em.offset
            out += em.tokens
            last = out >= max_tokens
            if chat:
                choice: dict = {"index": 0, "delta": {"content": text}, "logprobs": None,
                                "finish_reason": "length" if last else None}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length" if last else None}
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
        if log is not None:
            log.write(orjson.dumps({"id": head["id"], "arrival": round(arrival, 7),
                                    "due": [round(arrival + d, 7) for d in due],
                                    "sent": [round(x, 7) for x in sent]}).decode() + "\n")
        if include_usage:
            yield event({**head, "choices": [], "usage": usage(out), "system_fingerprint": FINGERPRINT})
        self._observe_finish(prompt_tokens, out, ttft, prev, queue)
        yield b"data: [DONE]\n\n"


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
    p.add_argument("--model", default="emulator/mistral-7b-v0.1", help="served model name")
    p.add_argument("--tokenizer", default="", help="tokenizer used to count prompt tokens (default: the model's)")
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--ttft", type=float, default=0.05, help="seconds to the first token")
    p.add_argument("--itl", type=float, default=0.01, help="seconds between tokens")
    p.add_argument("--prefill-per-token", type=float, default=0.0, help="extra TTFT seconds per prompt token")
    p.add_argument("--tokens-per-chunk", type=int, default=1, help="output tokens carried by each SSE chunk")
    p.add_argument("--jitter", type=float, default=0.0,
                   help="draw each TTFT and ITL uniformly from value*(1 +- JITTER), seeded by --seed (0..1)")
    p.add_argument("--lockstep", action="store_true",
                   help="emit every stream's tokens together on one global ITL grid, like a batched decode step")
    p.add_argument("--timing-log", default="",
                   help="write one JSON line per stream: arrival, scheduled (due) and actual write time of each "
                        "token-bearing chunk, in seconds after the request reached the server (its kernel receive "
                        "stamp): the timing benchmark's truth")
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
    p.add_argument("--request-log", default="",
                   help="append every generation request's path and JSON body to this file (for tests: what a "
                        "client really sent; API keys travel in headers and are not written)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.ttft < 0 or args.itl < 0 or args.tokens_per_chunk < 1 or args.max_model_len < 1:
        sys.stderr.write("emulator: error: --ttft/--itl must be >= 0, --tokens-per-chunk and --max-model-len >= 1\n")
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
    from vllm_load.workload.tokenizer import load_tokenizer

    try:
        tok = load_tokenizer(args.tokenizer or args.model)
    except UsageError as exc:
        sys.stderr.write(f"emulator: error: {exc}\n")
        return 2
    if min(args.max_num_seqs, args.max_num_batched_tokens, args.num_gpu_blocks, args.block_size) < 1 or args.time_scale <= 0:
        sys.stderr.write("emulator: error: scheduler sizes must be >= 1 and --time-scale > 0\n")
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
                                                  lockstep=args.lockstep, seed=args.seed,
                                                  num_gpu_blocks=args.num_gpu_blocks, block_size=args.block_size))
    timing_log = open(args.timing_log, "a", buffering=1) if args.timing_log else None  # noqa: SIM115 (lives as long as the server)
    request_log = open(args.request_log, "a", buffering=1) if args.request_log else None  # noqa: SIM115
    app = Emulator(args.model, tok, args.max_model_len, engine, api_key=args.api_key, faults=faults,
                   naming=args.metrics_naming, timing_log=timing_log, request_log=request_log)
    if args.log_stats_interval > 0:
        def log_stats() -> None:
            while True:
                gevent.sleep(args.log_stats_interval)
                sys.stderr.write(app.stats_line(args.log_stats_interval) + "\n")
                sys.stderr.flush()
        gevent.spawn(log_stats)
    handler = ArrivalStampingHandler if timing_log is not None else WSGIHandler
    server = NoDelayWSGIServer((args.host, args.port), app, log=None, error_log=None, handler_class=handler)
    server.init_socket()
    if timing_log is not None:
        rxstamp.enable(server.socket)  # accepted connections inherit it
    host, port = server.socket.getsockname()[:2]
    print(f"vllm-load emulator listening on http://{host}:{port} model {args.model}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
