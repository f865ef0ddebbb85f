"""The native receive thread (``_rxnative.c``, ``_rx_thread.c``, ``_rx_body.c``, with ``_sse.c``): its typed boundary. Python reads it only
through ``client/native.py`` (the hub) and ``client/direct.py`` (sends, heads); a body's parsed SSE comes
back as a ``Parsed``, read in one place (``StreamState.absorb``)."""

from typing import Any

Stamp = float  # a kernel receive stamp, moved onto the perf_counter clock as it was read
Lines = list[tuple[bytes, Stamp]]

#: how a streamed body stands (C's ``enum body_state``; Python's ``reader_choice.BodyState``): not ended by itself,
#: its length or last chunk read, the connection closed before its end, malformed chunking, and an expected head
#: the thread left to the event loop (``Reader.expect``)
BODY_RUNNING: int
BODY_COMPLETE: int
BODY_CLOSED: int
BODY_MALFORMED: int
DECLINED: int
#: a read later than this after its segment landed counts as late (ns)
LATE_NS: int


class Accepted(tuple[Any, ...]):
    """The head the thread took for ``expect()`` (a struct sequence: a tuple with named fields)."""

    chunked: bool  # Transfer-Encoding: chunked
    length: int  # Content-Length (-1: none, until close)
    keep_alive: bool  # the connection may serve the next request
    start: float  # the request's start (perf_counter) the thread timed the answer from


class Parsed(tuple[Any, ...]):
    """What the SSE parser (``_sse.c``) made of a body's lines, up to the first it left to Python."""

    offsets: list[float]  # each token-bearing chunk's receive time, seconds after the request's start
    tokens: list[int]  # the tokens each of those chunks carried
    response_id: str | None
    content: str  # the answer's text
    reasoning: str  # the reasoning's text
    text: str  # a completion's text
    finish_reason: str | None
    prompt_tokens: int | None  # the server's usage (None: no usage)
    completion_tokens: int | None
    cached_tokens: int | None
    continuous: bool  # usage came with every chunk
    done: bool  # the [DONE] line was seen
    done_at: float | None  # its offset
    answer_at: float | None  # the answer's first chunk's offset
    reasoning_streamed: int  # reasoning chunks' tokens
    reasoning_reported: int | None  # the usage's reasoning_tokens
    late_merged: int  # chunk gaps of 0 made by a late read


class Taken(tuple[Any, ...]):
    """A socket's news: what ``lines(fd)`` returns."""

    lines: Lines  # the body's complete lines since the last call
    state: int  # its BODY_* state
    body_bytes: int  # body bytes read so far
    parsed: Parsed | None  # a parsed body's result, once, at its end


class Drained(tuple[Any, ...]):
    """One socket's news in ``drain()``: ``Taken``'s, with its fd and the errno that stopped it (not raised)."""

    fd: int
    lines: Lines
    state: int
    body_bytes: int
    err: int
    parsed: Parsed | None


class Lag(tuple[Any, ...]):
    """The thread's read lag since the last ``take_lag()``."""

    lag: float  # the latest read after its segment landed, seconds
    reads: int
    late: int  # of those, later than LATE_NS

class Reader:
    """One per process: a C thread reading every watched socket as data lands (epoll, kernel stamps)."""

    def __init__(self) -> None: ...
    def watch(self, fd: int, /) -> None: ...
    def unwatch(self, fd: int, /) -> None: ...
    def pop(self, fd: int, maxlen: int, /) -> tuple[bytes, Stamp] | None: ...
    def head(self, fd: int, /) -> bytes | None: ...
    def send(self, fd: int, data: bytes, /) -> int: ...
    def body(self, fd: int, chunked: bool, length: int, start_perf: float | None = None, limit: int = 0, /) -> None: ...
    def expect(self, fd: int, start_perf: float, from_send: bool, limit: int = 0, /) -> bool: ...
    def accepted(self, fd: int, /) -> Accepted | None: ...
    def lines(self, fd: int, flush: bool = False, /) -> Taken: ...
    def quiet(self, fd: int, /) -> float: ...
    def sent(self, fd: int, /) -> Stamp | None: ...
    def pending(self, fd: int, /) -> bool: ...
    def drain(self) -> list[Drained]: ...
    def fileno(self) -> int: ...
    def take_lag(self) -> Lag: ...
    def stats(self) -> dict[str, Any]: ...

def parse_sse(lines: list[tuple[bytes, int] | tuple[bytes, int, bool]], start_perf: float, limit: int = 0,
              /) -> tuple[Parsed, int]: ...
