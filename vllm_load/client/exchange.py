"""What every transport shares: a request's clock, how its exchange went, and the two protocols a
transport is built from.

A ``Transport`` carries one user's requests (``transport_direct.DirectTransport``: its own keep-alive
connections read by the native thread; ``plugin/requests/transport_session.SessionTransport``: Locust's session,
for TLS and users that share a client pool). It is chosen once per user, and how it reads a connection is
chosen once per connection, never by looking at a socket per request. A ``Decoder`` reads a response's
body line by line with each line's landing time (``sse.StreamState``: an SSE stream; ``JsonBody``: one
JSON document) and says whether the body was whole.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import orjson
from gevent import GreenletExit

from geventhttpclient.response import HTTPConnectionClosed, HTTPParseError

from vllm_load.client.reader_choice import BodyState
from vllm_load.client.sse import StreamError

#: a transport's report of one exchange to Locust's request event:
#: (name, url, response_time_s, response_length, error, start_wall: the wall-clock start Locust records)
Report = Callable[[str, str, float, int, "str | None", float], None]


class Decoder(Protocol):
    """Reads one response body. ``parses_sse``: the native thread may parse the body itself (``_sse.c``) and
    hand it over whole (``absorb``); otherwise every line goes to ``feed_lines`` with its stamp."""

    parses_sse: bool
    limit: int | None  # the most tokens the body may carry before it is cut (SSE), or None
    bytes_read: int
    streamed: int  # tokens it carried so far (a failure says how many came)
    done: bool  # the body's protocol end came ([DONE], the JSON document's end)

    def feed(self, line: bytes, now: float) -> None: ...

    def feed_lines(self, lines: list[tuple[bytes, float]], start: float) -> float | None: ...

    def incomplete(self) -> str | None:
        """Why a body that ended cleanly on the wire is still not a whole answer, or None."""

    def end_offset(self, done_at: float | None) -> float | None:
        """When the answer was complete, in seconds after the request's start: ``done_at`` (the landing of the
        line that ended it, as the reader saw it) or the decoder's own knowledge of it."""


class Transport(Protocol):
    """Carries one user's requests; reports each exchange to Locust's request event itself."""

    def exchange(self, path: str, body: bytes, headers: dict[str, str], decoder: Decoder, clock: Clock,
                 name: str, own: dict[str, str] | None = None) -> Exchange:
        """``headers``: the run's (the same dict every request); ``own``: this request's alone (its traceparent,
        session id, a call's headers), after them."""

    def url(self, path: str) -> str: ...

    def close(self) -> None: ...


@dataclass(slots=True)
class Clock:
    """A request's start: ``t0`` on perf_counter (its intended start in an open loop), the clock every stamp of
    its answer is on (``client/rxstamp.py`` moves the kernel's onto it), and ``start_wall`` the same instant on the
    wall clock, for the record and Locust: a wall clock set while the request runs moves neither its offsets nor
    its E2E."""

    now_perf: float
    now_wall: float
    t0: float
    start_wall: float
    open_loop: bool

    @classmethod
    def now(cls, intended_start: float | None) -> Clock:
        now_perf, now_wall = time.perf_counter(), time.time()
        # in open-loop mode latency counts from when the request *should* have gone out
        t0 = now_perf if intended_start is None else intended_start
        return cls(now_perf, now_wall, t0, now_wall - (now_perf - t0), intended_start is not None)

    def sent_at(self, tx: float | None) -> None:
        """Closed loop: count from the send itself (the kernel's stamp of it leaving), not from building it."""
        if tx is not None and not self.open_loop and tx >= self.now_perf:
            self.t0, self.start_wall = tx, self.now_wall + (tx - self.now_perf)


@dataclass(slots=True)
class Exchange:
    """How one request's exchange went, whichever transport carried it."""

    e2e: float = 0.0
    status: int | None = None
    error: str | None = None
    retry_after: float | None = None
    cancelled: BaseException | None = None
    captured: dict[str, str] | None = None  # the response header fields asked for (--capture-header)


class JsonBody:
    """A non-streaming answer: one JSON document (embeddings, rerank, score), its lines kept whole and parsed
    at the end. ``done_at`` is the landing time of its last line, so E2E ends when the answer arrived."""

    parses_sse = False
    limit = None
    streamed = 0

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.bytes_read = 0
        self.done = False
        self.data: dict[str, Any] | None = None
        self.last_at: float | None = None

    def feed(self, line: bytes, now: float) -> None:
        self.parts.append(line)
        self.bytes_read += len(line)
        self.last_at = now

    def feed_lines(self, lines: list[tuple[bytes, float]], start: float) -> None:
        for line, stamp in lines:
            self.feed(line, stamp - start)
        return None

    def end_offset(self, done_at: float | None) -> float | None:
        return self.last_at  # a document has no end line: it ends with its last byte

    def incomplete(self) -> str | None:
        try:
            data = orjson.loads(b"".join(self.parts))
        except orjson.JSONDecodeError:
            return f"malformed JSON body: {b''.join(self.parts)[:80]!r}"
        if not isinstance(data, dict):
            return f"malformed JSON body: {str(data)[:80]}"
        self.data, self.done = data, True
        return None


#: Locust's row for the requests the client gave up on on purpose (--cancel): apart from the request's own row, and
#: no failure there (Locust's table showed a 50 % cancel share as 50 % failures)
CANCELLED = " (cancelled)"


def locust_row(name: str, decoder: Decoder, error: str | None) -> tuple[str, str | None]:
    """The row and the failure (None: none) Locust's table counts an exchange under: a request given up by the
    client (--cancel) in a row of its own, not failed; every other as itself."""
    if getattr(decoder, "abandoned", False):
        return name + CANCELLED, None
    return name, error


def fault(exc: BaseException, tokens: int, ex: Exchange) -> None:
    """Turn what stopped a request into its failure reason (a stop of the user is kept, to raise after)."""
    if isinstance(exc, StreamError):
        ex.error = str(exc)
    elif isinstance(exc, GreenletExit):  # the user was stopped mid-stream: count it, then let it stop
        ex.cancelled = exc
        ex.error = f"cancelled after {tokens} tokens: the test stopped mid-request"
    else:  # socket timeout, reset, closed connection...
        kind_name = type(exc).__name__
        if "timeout" in kind_name.lower() or "timed out" in str(exc):
            kind = "timeout"
        elif kind_name in ("HTTPParseError", "HTTPConnectionClosed", "ConnectionResetError", "BrokenPipeError",
                           "ClosedBeforeAnswer"):
            kind = "connection closed mid-stream"
        else:
            kind = "connection error"
        ex.error = f"{kind} after {tokens} tokens: {kind_name}: {exc}"[:240]


def retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (its HTTP-date form is rare from inference servers and is ignored)."""
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


def raise_for(out: Any) -> None:
    """Raise what the Python reader would have raised for a body the native thread did not end cleanly."""
    if out.error is not None:
        raise out.error
    if out.state == BodyState.CLOSED:
        raise HTTPConnectionClosed("the server closed the connection before the end of the body")
    if out.state == BodyState.MALFORMED:
        raise HTTPParseError("malformed chunked body")
