"""The gevent side of the native receive thread (``_rxnative.c``): which reader a process uses, and
how a greenlet waits for its socket's next segment.

With the native reader, a C thread reads every streaming socket as data lands and queues each segment
with its kernel stamp; a greenlet's ``recv`` pops the next segment, or waits until the thread says its
socket has news. Wake-ups come in batches: one eventfd wake of the event loop hands over every socket
that got data since the last one, and each waiting greenlet is switched to directly (no per-socket
watcher, no failed ``recv`` before each wait). The loop may then be late by any amount (a turnover wave,
a GC pass, a blocking user task): the chunks' times were taken when they landed.

``VLLM_LOAD_NATIVE=0`` (or a build without a C compiler) reads in Python (``rxstamp.RxSocket``'s own
``recvmsg``): exact while the loop keeps up, merged chunks when it stalls longer than a token gap.
"""

from __future__ import annotations

import os
import socket
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from gevent import GreenletExit
from gevent.hub import Waiter, get_hub

from vllm_load.client.reader_choice import (  # noqa: F401  (the choice, where callers found it first)
    DECLINED, ENV, LATE_S, BodyState, _rxnative, built, describe, enabled, python_lag, reader_name)

#: how often waits are checked against their socket's timeout (Locust's network_timeout: 600 s by default)
SWEEP_S = 0.1
#: the longest stretch the hub hands news to greenlets before it lets due timers and other I/O run: each
#: switch records a request and sends the next (~85 us), and a wave of 256 completions handed over at once
#: kept an open-loop arrival or a heartbeat due meanwhile waiting behind all of them (turnover.py, 256
#: streams: 14 and 7 loop stalls over 2 ms in 10 s, max 3.9 ms; 4 and 4, max 2.9 ms with it)
HANDOFF_S = 0.001


@dataclass(slots=True)
class BodyOutcome:
    """How a streamed body ended (``state``, ``BodyState``): COMPLETE, CLOSED before its end, MALFORMED chunking,
    RUNNING when an error stopped it (``error``), DECLINED an expected head left to the event loop.
    ``done_at``: the stamp of the line that completed the stream (``[DONE]``), in seconds after the request's
    start."""

    state: int
    body_bytes: int = 0
    done_at: float | None = None
    error: BaseException | None = None


@dataclass(slots=True)
class _Body:
    sink: Any  # feed_lines(lines, start) -> the offset of the line that completed the stream, or None
    start: float
    waiter: Waiter
    timeout: float | None
    deadline: float
    parsed: bool  # the thread parses its SSE (sink.absorb): the hub hears of it only at its end
    done_at: float | None = None
    #: an expected answer's start is the thread's, taken as it accepted the head (the send's stamp, as
    #: exchange.Clock.sent_at): the lines it leaves to Python count from it too, read at their first batch
    settle: bool = False


class LineSink(list):
    """A body's lines, kept whole (an error's JSON, read to quote it)."""

    parses_sse = False

    def feed_lines(self, lines: list[tuple[bytes, float]], start: float) -> None:
        self.extend(line for line, _stamp in lines)


class NativeReads:
    """One per process: the C reader, the greenlets waiting on its sockets, and the eventfd watcher."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.reader = _rxnative.Reader()
        self.waiters: dict[int, tuple[Waiter, float]] = {}
        self.bodies: dict[int, _Body] = {}  # streamed bodies fed line by line in the hub, no switch per chunk
        #: greenlets to switch to, with what they wait for: the news is applied as it is drained, the switches
        #: (each one a request's own work) run in stretches of HANDOFF_S
        self.ready: deque[tuple[Waiter, Any]] = deque()
        loop = get_hub().loop
        self._more = loop.timer(0.0)  # the rest of the switches, once due timers and other I/O had their turn
        # ref=False: these watchers never keep a finished gevent program alive
        self._wake_watcher = loop.io(self.reader.fileno(), 1, ref=False)
        self._wake_watcher.start(self._wake)
        self._sweeper = loop.timer(SWEEP_S, SWEEP_S, ref=False)
        self._sweeper.start(self._sweep)

    def _wake(self) -> None:
        """In the hub: every socket with news, taken in one call and applied at once: a streamed body's lines
        (or parsed result) go to its sink, and its greenlet is due when the body ends; a greenlet waiting on
        any other socket is due. The news must be applied when it is taken: a socket's state is its body's at
        that instant (applied later, a previous body's end once completed the next request on that
        connection with nothing in it). The due greenlets are switched to in arrival order, in stretches."""
        waiters, bodies, ready = self.waiters, self.bodies, self.ready
        for fd, lines, state, body_bytes, err, parsed in self.reader.drain():  # each a Drained, in its order
            body = bodies.get(fd)
            if body is not None:
                outcome = self._take(fd, body, lines, state, body_bytes, err, parsed)
                if outcome is not None:
                    del bodies[fd]
                    ready.append((body.waiter, outcome))
                continue
            waiter = waiters.pop(fd, None)
            if waiter is not None:
                ready.append((waiter[0], None))
        self._hand_over()

    def _hand_over(self) -> None:
        """Switch to due greenlets for at most HANDOFF_S (at least one), then let the loop run the rest."""
        ready = self.ready
        end = time.perf_counter() + HANDOFF_S
        while ready:
            waiter, value = ready.popleft()
            waiter.switch(value)  # a greenlet stopped meanwhile no longer waits: the value is then only kept
            if ready and time.perf_counter() >= end:
                if not self._more.active:
                    self._more.start(self._hand_over)
                return

    def _feed(self, fd: int, body: _Body) -> BodyOutcome | None:
        """What the thread decoded of a body before it was registered (it came with the headers)."""
        try:
            taken = self.reader.lines(fd)
        except OSError as exc:
            return BodyOutcome(BodyState.RUNNING, error=exc, done_at=body.done_at)
        return self._take(fd, body, taken.lines, taken.state, taken.body_bytes, 0, taken.parsed)

    def _take(self, fd: int, body: _Body, lines: list, state: int, body_bytes: int, err: int,
              parsed: tuple | None) -> BodyOutcome | None:
        """Hand a body's parsed result, then its new lines, each with its own stamp, to its sink; the outcome
        once it ended."""
        if parsed is not None or lines:
            try:
                done_at = body.sink.absorb(parsed) if parsed is not None else None
                if lines:
                    later = self._feed_lines(fd, body, lines)
                    done_at = done_at if done_at is not None else later
            except Exception as exc:  # the stream broke the protocol (StreamError): its reason is the failure
                return BodyOutcome(BodyState.RUNNING, body_bytes, body.done_at, exc)
            if done_at is not None and body.done_at is None:
                body.done_at = done_at
            if body.timeout is not None:
                body.deadline = time.monotonic() + body.timeout
        if not state and err:  # a read error once its lines are taken
            return BodyOutcome(BodyState.RUNNING, body_bytes, body.done_at, OSError(err, os.strerror(err)))
        return BodyOutcome(state, body_bytes, body.done_at) if state else None

    def _feed_lines(self, fd: int, body: _Body, lines: list) -> float | None:
        """Hand lines the thread left to Python to the body's sink. An expected answer's count from the start the
        thread gave its parsed ones (the send's stamp when it came after the request was built), read at their
        first batch. With the build's start instead, these lines (a usage event carrying vLLM's body metrics,
        then the [DONE]: the E2E) counted the build too, and on a new connection its connect: an E2E 0.05 ms
        longer, and 3-12 ms on a first request beside 4 busy loops (tests/test_stream_readers.py)."""
        if body.settle:
            taken = self.reader.accepted(fd)
            if taken is not None:
                body.start, body.settle = taken.start, False
        return body.sink.feed_lines(lines, body.start)

    def _sweep(self) -> None:
        if not self.waiters and not self.bodies:
            return
        now = time.monotonic()
        for fd, (waiter, deadline) in list(self.waiters.items()):
            if now >= deadline:
                del self.waiters[fd]
                waiter.throw(socket.timeout("timed out"))
        for fd, body in list(self.bodies.items()):
            if now >= body.deadline:
                if body.parsed:  # its reads reach the hub only at its end: the thread knows when it last read
                    quiet = self.reader.quiet(fd)
                    if quiet < body.timeout:
                        body.deadline = now + body.timeout - quiet
                        continue
                    self._flush(fd, body)
                del self.bodies[fd]
                body.waiter.switch(BodyOutcome(BodyState.RUNNING, done_at=body.done_at,
                                               error=socket.timeout("timed out")))

    def _flush(self, fd: int, body: _Body) -> None:
        """A parsed body stops before its end (a timeout, its socket closed, its user stopped): its sink takes
        what the thread parsed so far, so the failure says how many tokens came."""
        try:
            taken = self.reader.lines(fd, True)
            lines, parsed = taken.lines, taken.parsed
            if parsed is not None:
                body.sink.absorb(parsed)
            if lines:
                self._feed_lines(fd, body, lines)
        except Exception:  # noqa: BLE001 - the request fails anyway, for the reason the caller gives
            pass

    def expect(self, fd: int, sink: Any, start: float, from_send: bool, timeout: float | None) -> _Body:
        """Before a request is sent on ``fd``: the thread takes its answer's head itself when it is a 200 it can
        frame, and reads the body on into ``sink`` (a ``StreamState``), so the request wakes this process once,
        at its end (``response``). Registered before the send: whatever comes is applied when it is drained."""
        body = _Body(sink, start, Waiter(), timeout, _deadline(timeout), True, settle=True)
        self.bodies[fd] = body
        # bytes queued before the request are not its answer; the thread's parser cuts the body at sink.limit tokens
        if self.reader.expect(fd, start, from_send, sink.limit or 0):
            del self.bodies[fd]
            raise ConnectionResetError("the connection had bytes queued before the request was sent")
        return body

    def forget(self, fd: int, body: _Body) -> None:
        """The send of an expected request failed: nothing will come for it."""
        if self.bodies.get(fd) is body:
            del self.bodies[fd]

    def response(self, fd: int, body: _Body) -> BodyOutcome:
        """Wait for an expected request's outcome: its body's end (``reader.accepted(fd)`` then says how the
        thread read the head), state ``DECLINED`` (read the head with ``reader.head``: not a 200 it frames,
        or the connection ended first), or an error (a timeout, the socket closed)."""
        if self.bodies.get(fd) is not body:  # settled by a drain while the send waited for buffer space
            return body.waiter.get()
        try:
            return self._park(self.bodies, fd, body, body.waiter)
        except GreenletExit as stop:  # the user was stopped: what came still counts in its failure (its status
            self._flush(fd, body)  # too: the stop is raised by the caller, once it knows the head)
            return BodyOutcome(BodyState.RUNNING, done_at=body.done_at, error=stop)
        except BaseException:
            self._flush(fd, body)
            raise

    def stream_body(self, fd: int, chunked: bool, length: int, sink: Any, start: float,
                    timeout: float | None) -> BodyOutcome:
        """Read a response body (its headers parsed, none of it yet) until it ends: the thread decodes it and,
        for a ``StreamState`` sink, parses its SSE too, handed over at the end (``sink.absorb``); lines it
        leaves to Python (and every line for any other sink, e.g. a ``LineSink``) go to ``sink.feed_lines``
        with their stamps, batch by batch. This greenlet wakes once, at the end (or on an error, a protocol
        fault, a timeout)."""
        parsed = sink.parses_sse  # StreamState: the thread parses the SSE itself (_sse.c)
        self.reader.body(fd, chunked, length, start if parsed else None, (sink.limit or 0) if parsed else 0)
        body = _Body(sink, start, Waiter(), timeout, _deadline(timeout), parsed)
        outcome = self._feed(fd, body)  # what arrived with the headers
        if outcome is not None:
            return outcome
        try:
            return self._park(self.bodies, fd, body, body.waiter)
        except BaseException:  # the user was stopped mid-body: what came still counts in its failure
            if parsed:
                self._flush(fd, body)
            raise

    def release(self, fd: int) -> None:
        """The socket closes: stop reading it, and fail a greenlet still waiting on it."""
        body = self.bodies.pop(fd, None)
        if body is not None and body.parsed:
            self._flush(fd, body)
        self.reader.unwatch(fd)
        entry = self.waiters.pop(fd, None)
        if entry is not None:
            get_hub().loop.run_callback(entry[0].throw, OSError(9, "socket closed while a read waited"))
        if body is not None:
            get_hub().loop.run_callback(body.waiter.switch,
                                        BodyOutcome(BodyState.RUNNING, error=OSError(9, "socket closed mid-body")))

    def wait(self, fd: int, timeout: float | None) -> None:
        """Block this greenlet until ``fd`` has news (raises ``socket.timeout`` after ``timeout``)."""
        waiter = Waiter()
        self._park(self.waiters, fd, (waiter, _deadline(timeout)), waiter)

    def _park(self, table: dict[int, Any], fd: int, entry: Any, waiter: Waiter) -> Any:
        """Wait in ``table`` under ``fd`` until the hub switches back (with an outcome, or an exception)."""
        table[fd] = entry
        self._wake_watcher.ref = True  # a waiting read keeps the loop alive, as gevent's own waits do
        try:
            return waiter.get()
        finally:
            if table.get(fd) is entry:
                del table[fd]
            if not self.waiters and not self.bodies:
                self._wake_watcher.ref = False


def _deadline(timeout: float | None) -> float:
    return float("inf") if timeout is None else time.monotonic() + timeout


_reads: NativeReads | None = None


def _started() -> NativeReads | None:
    """This process's native reader if it was started here (a forked worker's copy of its parent's is not)."""
    return _reads if _reads is not None and _reads.pid == os.getpid() else None


def reads() -> NativeReads | None:
    """This process's native reader (started on first use; a forked worker starts its own), or None."""
    global _reads
    if not enabled():
        return None
    if _started() is None:
        _reads = NativeReads()
    return _reads


def take_lag() -> tuple[float, int, int]:
    """How late this process read segments after they landed (kernel stamps), since the last call: (the
    largest lag in seconds, reads, reads later than 1 ms), from the native thread and the Python reader."""
    py = python_lag.take()
    started = _started()
    if started is None:
        return py
    native = started.reader.take_lag()
    return max(native.lag, py[0]), native.reads + py[1], native.late + py[2]
