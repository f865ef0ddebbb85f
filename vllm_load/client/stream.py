"""One streaming OpenAI request, timed chunk by chunk (vLLM's RequestFuncInput -> RequestFuncOutput:
``ReadyRequest`` -> ``RequestRecord``).

Two transports carry it. With the native reader and a plain-HTTP target, a user's own keep-alive
connections (``direct.py``): the native thread sends it, reads its headers and decodes its body into
lines, each with the kernel's stamp of the read that completed it, and Locust's request event is fired
here. Otherwise Locust's FastHttpSession (TLS, the Python reader): lines are read with the raw
geventhttpclient response's ``readline`` (Locust's ``iter_lines`` buffers 1 KB and inflates TTFT),
timed by the receive stamp of the read that completed them (``rxstamp``), or by the clock at read time
where there is none. Either way the Locust row gets the real end-to-end time and the failure reason.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import orjson
from gevent import GreenletExit
from geventhttpclient.response import HTTPConnectionClosed, HTTPParseError

from locust.exception import CatchResponseError

from vllm_load.client.direct import ConnectFailed, Connections
from vllm_load.client.native import LineSink
from vllm_load.client.openai_api import error_message
from vllm_load.workload.prompts import Prompt
from vllm_load.client.record import RequestRecord
from vllm_load.client.sse import StreamError, StreamState

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass(frozen=True)
class ReadyRequest:
    """A request ready to send, built off the event loop by the prompt thread (vLLM's RequestFuncInput):
    the exact bytes and the lengths asked, against which the server's usage is checked."""

    api: str  # "chat" or "completions"
    body: bytes
    input_tokens: int  # the prompt's length as the server counts it (chat template included)
    output_tokens: int | None  # forced with ignore_eos/min_tokens; None: the model stops on its own
    group: str | None = None  # the metrics' name when the request names none (its model, when a run has several)
    due: float | None = None  # trace replay: seconds after the run's start the request is due
    row: int | None = None  # trace replay: the trace row it replays
    max_tokens: int | None = None  # the body's max_tokens (forced or a cap): a stream far past it is cut

    @property
    def path(self) -> str:
        return PATHS[self.api]


class StreamCancelled(GreenletExit):
    """The user was stopped mid-stream: the request is recorded as failed (nothing is lost from the counts)
    before the stop goes on; ``record`` is it."""

    def __init__(self, record: RequestRecord) -> None:
        super().__init__()
        self.record = record


@dataclass(frozen=True)
class BodyDefaults:
    """What every body of a run carries unless a request says otherwise (decided once from the options)."""

    temperature: float = 0.0  # --temperature
    ignore_eos: bool = True  # off with --no-ignore-eos: no ignore_eos/min_tokens (servers that refuse them)
    continuous_usage: bool = True  # off with --no-continuous-usage: usage only at the end
    extra: tuple[tuple[str, Any], ...] = ()  # --extra-body, as items (hashable, frozen)


def ready_request(api: str, model: str, prompt: Prompt, max_tokens: int,
                  defaults: BodyDefaults = BodyDefaults(), group: str | None = None) -> ReadyRequest:
    """The run's workload request (built-in users): the prompt as built, the length asked."""
    return build_request(api, model, prompt.messages if api == "chat" else prompt.text, prompt.tokens, max_tokens,
                         defaults=defaults, group=group)


def build_request(api: str, model: str, content: Any, input_tokens: int, max_tokens: int | None, *,
                  defaults: BodyDefaults = BodyDefaults(), extra: dict[str, Any] | None = None,
                  group: str | None = None) -> ReadyRequest:
    """The one body builder. ``content``: the messages (chat) or the prompt (completions), counted as
    ``input_tokens`` by the caller. With ``max_tokens`` and ``ignore_eos`` the answer's length is forced
    (``min_tokens`` too, so the server's usage can be checked against it); ``max_tokens=None`` lets the
    model stop on its own. ``extra`` keys are merged last (``tools``, ``temperature``, ``model``, vLLM's
    own fields); ``ignore_eos: False`` among them turns the forced length into a cap. The stream and its
    usage stay on whatever ``extra`` says: they are what the measurement reads."""
    body: dict[str, Any] = {"model": model, "stream": True, "temperature": defaults.temperature}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    body["messages" if api == "chat" else "prompt"] = content
    forced = defaults.ignore_eos and max_tokens is not None
    if defaults.extra:
        body.update(defaults.extra)
    if extra:
        forced = forced and extra.get("ignore_eos", True) is not False
        body.update(extra)
    if forced:
        body["ignore_eos"] = True
        body["min_tokens"] = max_tokens
    body["stream"] = True
    options = body.get("stream_options")
    body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    if defaults.continuous_usage:
        body["stream_options"]["continuous_usage_stats"] = True
    cap = body.get("max_completion_tokens") or body.get("max_tokens")
    return ReadyRequest(api, orjson.dumps(body), input_tokens, max_tokens if forced else None, group,
                        max_tokens=cap if isinstance(cap, int) and not isinstance(cap, bool) else None)


def stream_request(
    transport: Any,
    req: ReadyRequest,
    headers: dict[str, str],
    *,
    intended_start: float | None = None,
    worker: str = "",
    count_output: Callable[[str], int] | None = None,
    step: int | None = None,
    startup: bool = False,
    name: str | None = None,
    state: StreamState | None = None,
    events: Any = None,
    context: dict[str, Any] | None = None,
) -> RequestRecord:
    """Send ``req``, read its SSE stream to the end and return its record (the caller records it).

    ``transport``: a user's ``direct.Connections`` (the native thread sends and reads; Locust's request
    event is fired here, on ``events`` with ``context``), or Locust's ``FastHttpSession`` (TLS, the Python
    reader), which fires it itself.
    Server faults never raise: they become a failed record with a reason. A user stopped mid-request
    raises ``StreamCancelled`` carrying the failed record, for the caller to record before the stop goes on.
    ``name`` groups the request (Locust's row and the LLM metrics; default: ``req.group``, else the API's path
    for Locust's row and no group for the LLM metrics); ``state``, when
    given, is the parser to fill (the caller reads the answer's text and tool calls from it).
    """
    name = name if name is not None else req.group
    clock = _Clock.now(intended_start)
    state = StreamState() if state is None else state
    state.cap(req.max_tokens)
    if isinstance(transport, Connections):
        ex = _exchange_direct(transport, req, headers, state, clock)
        meta = {"request_type": "POST", "name": name or req.path, "response_time": ex.e2e * 1000.0,
                "response_length": state.bytes_read, "response": None, "context": dict(context or {}),
                "exception": CatchResponseError(ex.error) if ex.error else None,
                "start_time": clock.start_wall, "url": transport.url(req.path)}
        if events is not None:
            events.request.fire(**meta)
    else:
        ex = _exchange_locust(transport, req, headers, state, clock, name)
    offsets = state.chunk_times
    tokens_from_usage = state.completion_tokens is not None and state.prompt_tokens is not None
    rec = RequestRecord(
        api=req.api,
        start=clock.start_wall,
        e2e=ex.e2e,
        ok=ex.error is None,
        error=ex.error,
        status=ex.status,
        ttft=offsets[0] if offsets else None,
        chunk_offsets=offsets,
        chunk_tokens=state.chunk_tokens,
        input_tokens_asked=req.input_tokens,
        output_tokens_asked=req.output_tokens,
        input_tokens=state.prompt_tokens if tokens_from_usage else req.input_tokens,
        output_tokens=state.completion_tokens if tokens_from_usage
        else count_output(state.text) if count_output and state.text_parts else state.streamed_tokens,
        tokens_from_usage=tokens_from_usage,
        continuous_usage=state.continuous_usage,
        finish_reason=state.finish_reason,
        send_lag=None if intended_start is None else max(0.0, clock.now_perf - clock.t0),
        worker=worker,
        step=step,
        startup=startup,
        response_id=state.response_id,
        retry_after=ex.retry_after,
        cached_tokens=state.cached_tokens,
        name=name,
        trace_row=req.row,
    )
    if ex.cancelled is not None:
        raise StreamCancelled(rec) from ex.cancelled
    return rec


@dataclass(slots=True)
class _Clock:
    """A request's start: ``t0`` on perf_counter (its intended start in an open loop), ``start_wall`` the
    same instant on the wall clock the kernel's stamps use."""

    now_perf: float
    now_wall: float
    t0: float
    start_wall: float
    open_loop: bool

    @classmethod
    def now(cls, intended_start: float | None) -> _Clock:
        now_perf, now_wall = time.perf_counter(), time.time()
        # in open-loop mode latency counts from when the request *should* have gone out
        t0 = now_perf if intended_start is None else intended_start
        return cls(now_perf, now_wall, t0, now_wall - (now_perf - t0), intended_start is not None)

    def sent_at(self, tx: float | None) -> None:
        """Closed loop: count from the send itself (the kernel's stamp of it leaving), not from building it."""
        if tx is not None and not self.open_loop and tx >= self.now_wall:
            self.t0, self.start_wall = self.now_perf + (tx - self.now_wall), tx


@dataclass(slots=True)
class _Exchange:
    """How one request's exchange went, whichever transport carried it."""

    e2e: float = 0.0
    status: int | None = None
    error: str | None = None
    retry_after: float | None = None
    cancelled: BaseException | None = None


def _fault(exc: BaseException, state: StreamState, ex: _Exchange) -> None:
    """Turn what stopped a request into its failure reason (a stop of the user is kept, to raise after)."""
    if isinstance(exc, StreamError):
        ex.error = str(exc)
    elif isinstance(exc, GreenletExit):  # the user was stopped mid-stream: count it, then let it stop
        ex.cancelled = exc
        ex.error = f"cancelled after {state.streamed_tokens} tokens: the test stopped mid-request"
    else:  # socket timeout, reset, closed connection...
        kind_name = type(exc).__name__
        if "timeout" in kind_name.lower() or "timed out" in str(exc):
            kind = "timeout"
        elif kind_name in ("HTTPParseError", "HTTPConnectionClosed", "ConnectionResetError", "BrokenPipeError",
                           "ClosedBeforeAnswer"):
            kind = "connection closed mid-stream"
        else:
            kind = "connection error"
        ex.error = f"{kind} after {state.streamed_tokens} tokens: {kind_name}: {exc}"[:240]


def _exchange_direct(conns: Connections, req: ReadyRequest, headers: dict[str, str], state: StreamState,
                     clock: _Clock) -> _Exchange:
    """The request over a direct connection: sent, its headers and its body read by the native thread."""
    ex = _Exchange()
    conn = head = None
    complete = False
    end = None
    try:
        answer = conns.open(req.path, headers, req.body, (state, clock.start_wall, not clock.open_loop))
        conn, head = answer.conn, answer.head
        ex.status = head.status
        fd = conn.fd
        if head.status != 200:
            parts = LineSink()
            out = conns.reads.stream_body(fd, head.chunked, head.length, parts, clock.start_wall, conns.timeout)
            complete = out.state == 1
            ex.error = f"HTTP {head.status}: {error_message(b''.join(parts))}"
            if head.status in (429, 503):
                ex.retry_after = _retry_after(head.retry_after)
        else:
            if answer.body is not None:  # the native thread took the head and read the body on
                clock.sent_at(answer.start)  # the start its offsets already count from
                out = answer.body
            else:
                clock.sent_at(conns.reads.reader.sent(fd))
                out = conns.reads.stream_body(fd, head.chunked, head.length, state, clock.start_wall, conns.timeout)
            state.bytes_read = out.body_bytes
            _raise_for(out)
            complete = True
            if out.done_at is not None:
                end = clock.t0 + out.done_at
            if not state.done:
                ex.error = f"stream ended before [DONE] after {state.streamed_tokens} tokens"
    except ConnectFailed as exc:
        ex.error = f"connection failed: {exc.cause!r}"[:240]
    except (Exception, GreenletExit) as exc:  # every fault becomes the record's reason; a stop is re-raised after
        _fault(exc, state, ex)
    if conn is not None:
        if head is not None:
            conns.done(conn, head, complete and ex.cancelled is None)
        else:
            conns.discard(conn)
    if ex.error or end is None:
        end = time.perf_counter()
    ex.e2e = end - clock.t0
    return ex


def _exchange_locust(session: Any, req: ReadyRequest, headers: dict[str, str], state: StreamState,
                     clock: _Clock, name: str | None) -> _Exchange:
    """The request through Locust's FastHttpSession (geventhttpclient), which fires Locust's request event."""
    ex = _Exchange()
    end = None
    path = req.path
    with session.request("POST", path, data=req.body, headers=headers, stream=True, catch_response=True,
                         name=name or path) as resp:
        try:
            ex.status = resp.status_code
            raw = resp._response
            if not ex.status:
                ex.error = f"connection failed: {resp.error!r}"[:240]
            elif ex.status != 200:
                ex.error = f"HTTP {ex.status}: {error_message(resp.content or b'')}"
                if ex.status in (429, 503):
                    ex.retry_after = _retry_after(resp.headers.get("Retry-After"))
            else:
                readline = raw.readline
                feed = state.feed
                perf = time.perf_counter
                sock = raw._sock
                if hasattr(sock, "take_tx"):
                    clock.sent_at(sock.take_tx())
                t0, start_wall = clock.t0, clock.start_wall
                reads = getattr(sock, "_native", None)
                if reads is not None and not raw._body_buffer and not raw.message_complete:
                    # the native thread decodes the body; the hub feeds each line with its own stamp
                    try:
                        done_at = _read_body_native(reads, sock, raw, state, start_wall)
                    finally:
                        raw.release()  # back to the pool when the body ended cleanly, else closed
                    if done_at is not None:
                        end = t0 + done_at
                else:
                    if getattr(sock, "stamped", False):  # when the line's bytes reached this host
                        def arrival() -> float:
                            return sock.rx - start_wall
                    else:  # when this greenlet got to read them
                        def arrival() -> float:
                            return perf() - t0
                    while True:
                        line = readline(b"\n")
                        if not line:
                            break
                        feed(line, arrival())
                        if state.done:
                            end = perf()
                            # drain the terminating chunk so the connection can be reused
                            while readline(b"\n"):
                                pass
                            break
                if not state.done:
                    ex.error = f"stream ended before [DONE] after {state.streamed_tokens} tokens"
        except (Exception, GreenletExit) as exc:
            _fault(exc, state, ex)
        if ex.error or end is None:
            end = time.perf_counter()
        ex.e2e = end - clock.t0
        resp.request_meta["response_time"] = ex.e2e * 1000.0
        resp.request_meta["response_length"] = state.bytes_read
        if ex.error:
            resp.failure(ex.error)
        else:
            resp.success()
    return ex


def _read_body_native(reads: Any, sock: Any, raw: Any, state: StreamState, start_wall: float) -> float | None:
    """Read a 200 response's body with the native thread (``client/native.py``): every line is fed to
    ``state`` with its own landing time, with no greenlet switch per chunk. Returns the offset of the
    line that completed the stream (its ``[DONE]``), or None; raises what the Python reader would have
    raised for the same fault (a reset, a timeout, a connection closed mid-body, a protocol error)."""
    chunked = "chunked" in str(raw.get("transfer-encoding") or "").lower()
    length = raw.content_length
    length = -1 if chunked or length is None else length  # -1: until the server closes
    out = reads.stream_body(sock._fd, chunked, length, state, start_wall, sock.timeout)
    state.bytes_read = out.body_bytes
    _raise_for(out)
    raw.message_complete = True  # read to its end: the connection can serve the next request
    return out.done_at


def _raise_for(out: Any) -> None:
    """Raise what the Python reader would have raised for a body that did not end cleanly."""
    if out.error is not None:
        raise out.error
    if out.state == 2:
        raise HTTPConnectionClosed("the server closed the connection before the end of the body")
    if out.state == 3:
        raise HTTPParseError("malformed chunked body")


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (its HTTP-date form is rare from inference servers and is ignored)."""
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None
