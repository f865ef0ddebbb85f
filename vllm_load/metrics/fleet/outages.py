"""Outages: spans where the server could not be reached at all, told apart from a slow or failing server.

Every request lands in 100 ms buckets at the time its evidence is of: an answer at its first token (at its end
without one: "to its first answer again");
a connection-level failure (no HTTP response: refused, reset, connect timeout) or another failure from when the
server went silent on it (its last chunk, or its send when it got none). The buckets are counters, so workers ship
them as deltas and the master's merge is exact like every other count. An outage is a span that starts
with a connection-level failure after the last success and ends with the next success, when it lasted at
least ``--outage-after`` seconds (an ongoing one ends at "now"). A failure storm is the same with any
failure (HTTP 5xx on every request): the client's CPU in either is the failures' doing, not the load's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

#: bucket width in seconds: an outage's start and end are known to this (plus the retry backoff)
BUCKET = 0.1


def bucket(t: float) -> int:
    return int(t / BUCKET)


@dataclass
class Window:
    start: float  # wall clock
    end: float
    attempts: int  # failed requests inside
    connection: int  # of which connection-level
    ongoing: bool = False
    conn_seconds: float = 0.0  # from the first connection-level failure inside to the last (one bucket at least)

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def is_outage(self) -> bool:
        """Unreachable, not merely failing: most attempts got no HTTP response at all, or connection-level
        failures went on through most of the span. (A vLLM shutting down refused new connections for 53 s
        while answering 500 in ~1 ms on one kept-alive connection: 18,000 answered failures, which are not
        backed off, outnumbered 207 backed-off refusals.)"""
        return self.connection * 2 > self.attempts or (self.connection > 0 and self.conn_seconds * 2 >= self.seconds)

    def to_json(self) -> dict:
        return {**asdict(self), "seconds": self.seconds, "outage": self.is_outage}


def find_windows(ok: Counter, conn: Counter, other: Counter, min_seconds: float, now: float | None = None
                 ) -> list[Window]:
    """Spans of failures with no success in between, at least ``min_seconds`` long; with ``now``, one still
    going on at the end counts up to ``now``."""
    out: list[Window] = []
    start: float | None = None
    attempts = connection = 0
    first = last = None  # buckets of the span's first and last connection-level failures
    for b in sorted(set(ok) | set(conn) | set(other)):
        t = b * BUCKET
        if ok.get(b):
            if start is not None and t - start >= min_seconds:
                out.append(Window(start, t, attempts, connection, conn_seconds=_span(first, last)))
            start, attempts, connection, first, last = None, 0, 0, None, None
            if not (conn.get(b) or other.get(b)):
                continue
            # an answer and a failure in one bucket: a request answered, then went silent (its own first token and
            # its cut, 10 ms apart): the failures may begin a span here (dropped, they hid a 33 s outage's start)
        if start is None:
            start = t
        attempts += conn.get(b, 0) + other.get(b, 0)
        if conn.get(b):
            connection += conn[b]
            first = b if first is None else first
            last = b
    if start is not None and now is not None and now - start >= min_seconds:
        out.append(Window(start, now, attempts, connection, ongoing=True, conn_seconds=_span(first, last)))
    return out


def _span(first: int | None, last: int | None) -> float:
    """Seconds from the bucket ``first`` through the bucket ``last`` (0 without any)."""
    return 0.0 if first is None or last is None else (last - first + 1) * BUCKET


def short_reason(error: str) -> str:
    """A connection failure's reason in a few words ("connection refused")."""
    low = error.lower()
    for needle, words in (("refused", "connection refused"), ("reset", "connection reset"),
                          ("timed out", "connect timeout"), ("timeout", "connect timeout"),
                          ("name or service", "host name not found"), ("unreachable", "network unreachable")):
        if needle in low:
            return words
    return error[:80]


def describe(w: Window, run_start: float, last_error: str = "", live: bool = False) -> str:
    """"server unreachable from 14.0 s to 30.0 s: 16.0 s, 61 attempts, connection refused"."""
    what = "server unreachable" if w.is_outage else "every request failed"
    why = f", {short_reason(last_error)}" if last_error else ""
    if live:
        return f"{what} since {w.start - run_start:.1f} s: {w.seconds:.1f} s so far, {w.attempts} attempts{why}"
    until = "until the run ended" if w.ongoing else f"to {w.end - run_start:.1f} s"
    return f"{what} from {w.start - run_start:.1f} s {until}: {w.seconds:.1f} s, {w.attempts} attempts{why}"


class LiveOutage:
    """The failure span going on now, for the live notice: each ``check`` reads only the last ``horizon``
    seconds of buckets, so it costs the same at minute 1 and hour 2. (``find_windows`` over a whole run
    sorts every bucket: 7 ms a call after an hour of 100 ms buckets, on the loop the local run's streams
    are timed by, every second.) A span longer than the horizon keeps the start and the count of the
    buckets that slid out of it."""

    def __init__(self, min_seconds: float, horizon: float = 30.0) -> None:
        self.min_seconds, self.horizon = min_seconds, horizon
        self.start: int | None = None  # bucket of the span's first failure
        self.carried = [0, 0]  # attempts, connection failures in buckets that left the horizon
        self.low: int | None = None  # the horizon's first bucket at the last check
        self.conn_first: int | None = None  # the span's first and last connection-level failures (buckets)
        self.conn_last: int | None = None

    def check(self, ok: Counter, conn: Counter, other: Counter, now: float) -> Window | None:
        lo, hi = bucket(now - self.horizon), bucket(now)
        if self.start is not None and self.low is not None:
            for b in range(max(self.low, self.start), lo):
                self.carried[0] += conn.get(b, 0) + other.get(b, 0)
                self.carried[1] += conn.get(b, 0)
        self.low = lo
        last_ok = next((b for b in range(hi, lo - 1, -1) if ok.get(b)), None)
        if last_ok is not None and self.start is not None and last_ok > self.start:
            self.start = None  # a success since the span began: it is over
        if self.start is None:
            first = lo if last_ok is None else last_ok  # failures in the answer's bucket may begin it (find_windows)
            self.start = next((b for b in range(first, hi + 1) if conn.get(b) or other.get(b)), None)
            self.carried = [0, 0]
            self.conn_first = self.conn_last = None
            if self.start is None:
                return None
        inside = range(max(self.start, lo), hi + 1)
        attempts = self.carried[0] + sum(conn.get(b, 0) + other.get(b, 0) for b in inside)
        connection = self.carried[1] + sum(conn.get(b, 0) for b in inside)
        hits = [b for b in inside if conn.get(b)]
        if hits:
            self.conn_first = hits[0] if self.conn_first is None else self.conn_first
            self.conn_last = hits[-1]
        if now - self.start * BUCKET < self.min_seconds:
            return None
        return Window(self.start * BUCKET, now, attempts, connection, ongoing=True,
                      conn_seconds=_span(self.conn_first, self.conn_last))
