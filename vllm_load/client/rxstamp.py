"""Kernel receive timestamps: when a chunk reached this host, not when a busy loop got round to it.

Linux stamps each received packet; a socket with ``SO_TIMESTAMPNS`` set is handed the stamp of the
last packet a read consumed. A chunk's time then no longer depends on how long the event loop took
to wake the greenlet that reads it, so the client's own load (hundreds of streams, a burst of
chunks, request turnover, a GC pass) stays out of TTFT and inter-token gaps. Where stamps are not
available (TLS sockets, other systems) reads fall back to the clock at read time.

Stamps are CLOCK_REALTIME, the only clock the kernel stamps with, and a wall clock is set while it runs (a CI
machine's VM clock was stepped 21 s forward mid-run, then moved 0.5 ms every 80 ms: one request read 21.6 s and
every E2E 0.5 % long). So a stamp is moved onto ``perf_counter`` as it is read, by the wall clock's lead over it at
that moment (``on_perf``), and ``RxSocket.rx`` counts from the request's ``perf_counter`` start: only a step
between a packet's landing and its read (microseconds) can still reach an offset.
"""

from __future__ import annotations

import socket
import struct
import sys
import time
from typing import Any

import gevent.socket
from gevent.monkey import get_original
from geventhttpclient.client import HTTPClient, HTTPClientPool

from vllm_load.client import native

# Linux's asm-generic value (x86, ARM, RISC-V); Python's socket module does not export it.
SO_TIMESTAMPNS: int = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("@qq")  # struct timespec on 64-bit Linux: seconds, nanoseconds
ANCBUF = socket.CMSG_SPACE(_TIMESPEC.size)
_select = get_original("select", "select")  # the system call itself: polls, never switches greenlets


def enable(sock: Any) -> bool:
    """Ask the kernel for receive stamps on ``sock``; False where it cannot give them."""
    if not sys.platform.startswith("linux") or _TIMESPEC.size != 16:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        return bool(sock.getsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS))
    except OSError:
        return False


#: the wall clock was set between two reads when its lead over perf_counter moved by more than this (_rx.h's)
CLOCK_SET_S = 0.001
_lead_seen: list[float] = []  # the lead at this process's previous stamped read


def on_perf(stamp: float) -> tuple[float, float]:
    """A wall-clock stamp read just now, on the ``perf_counter`` clock, and how long ago it was: when the wall
    clock was set since the previous read the stamp may predate it, and the read's own time stands in (age 0), as
    the native thread does (``_rx.h``'s ``monotonic_of_stamp``)."""
    perf, wall = time.perf_counter(), time.time()
    lead = wall - perf
    was = _lead_seen[0] if _lead_seen else lead
    _lead_seen[:] = [lead]
    if abs(lead - was) > CLOCK_SET_S:
        return perf, 0.0
    return stamp - lead, wall - stamp


def stamp_of(ancdata: list[tuple[int, int, bytes]]) -> float | None:
    """The receive stamp in a ``recvmsg`` answer's ancillary data, as a ``time.time()`` value."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
            sec, nsec = _TIMESPEC.unpack_from(data)
            return sec + nsec * 1e-9
    return None


#: how a connection's answers are read (``RxSocket.reader``); any other socket (TLS, a user's own pool) is CLOCK
NATIVE, STAMPED, CLOCK = "native", "stamped", "clock"


class RxSocket(gevent.socket.socket):
    """A gevent socket whose reads keep the kernel's stamp of the data they return in ``rx``.

    ``rx`` is the stamp of the last packet the latest ``recv`` consumed, on ``perf_counter`` (the clock at the read
    if the kernel gave none; unused when ``stamped`` is False), so a line taken from bytes a read returned belongs to that read.
    ``tx`` is the clock just before a request's first send: building the request (Locust, headers,
    the connection pool) can wait on the GIL or other greenlets, and is the client's time, not the server's.

    With the native reader (``native.py``) the socket is read by a C thread from its connect on, and
    ``recv`` pops what that thread read, one kernel read (one stamp) at a time: a loop that comes late
    still gets every chunk's own landing time.
    """

    __slots__ = ("rx", "tx", "stamped", "reader", "_native", "_fd")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rx = 0.0
        self.tx: float | None = None  # when a request's first byte went out; the reader takes and clears it
        self.stamped = enable(self)
        #: how its answers are read, decided at the connect: NATIVE (the thread decodes the body), STAMPED (this
        #: socket's own reads, each with the kernel's stamp) or CLOCK (timed when the loop reads them)
        self.reader = STAMPED if self.stamped else CLOCK
        self._native: native.NativeReads | None = None
        self._fd = -1

    def connect(self, address: Any) -> None:
        super().connect(address)
        reads = native.reads()
        if reads is not None:
            fd = self.fileno()
            reads.reader.watch(fd)
            self._native, self._fd, self.stamped = reads, fd, True  # the thread's clock where the kernel gives no stamp
            self.reader = NATIVE

    def _real_close(self, *args: Any) -> None:  # gevent's close, once no makefile() holds the socket
        reads, self._native = self._native, None
        if reads is not None:
            reads.release(self._fd)  # before the fd number can be reused
        super()._real_close(*args)

    def take_tx(self) -> float | None:
        """When the latest request left, and forget it (the next request on this connection stamps its own):
        the kernel's stamp of its last byte leaving with the native reader (a thread preempted or a loop
        held between the send's call and the wire does not count), else the clock just before the send."""
        tx, self.tx = self.tx, None
        if self._native is not None:
            sent = self._native.reader.sent(self._fd)
            if sent is not None:
                return sent
        return tx

    def pending(self) -> bool:
        """The native thread holds bytes, an end or an error for this socket (an idle one is then dirty)."""
        return self._native is not None and self._native.reader.pending(self._fd)

    def sendall(self, data: Any, flags: int = 0) -> None:
        if self.tx is None:
            self.tx = time.perf_counter()
        super().sendall(data, flags)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        reads = self._native
        if reads is not None:
            pop, fd = reads.reader.pop, self._fd
            while True:
                got = pop(fd, bufsize)
                if got is not None:
                    data, stamp = got
                    if data:
                        self.rx = stamp
                    return data
                reads.wait(fd, self.timeout)
        if not self.stamped:  # readers time these lines themselves (``stamped`` tells them)
            return super().recv(bufsize, flags)
        data, ancdata, _flags, _addr = self.recvmsg(bufsize, ANCBUF, flags)
        stamp = stamp_of(ancdata) if ancdata else None
        if stamp is None:
            self.rx = time.perf_counter()
        else:
            self.rx, lag = on_perf(stamp)
            native.python_lag.note(lag)
        return data


def _stamped_socket(family: int, socktype: int, protocol: int) -> RxSocket:
    return RxSocket(family, socktype, protocol)


def _socket_alive(sock: Any) -> bool:
    """geventhttpclient's check of a pooled keep-alive connection (readable while idle = closed or
    dirty), minus its ``gevent.sleep(0)``: that yield sat between the request's start time and its
    send, so every ready greenlet's work (hundreds of chunk reads under load) was counted in TTFT."""
    if sock is None:
        return False
    try:
        if sock.fileno() < 0:
            return False
        readable, _, _ = _select([sock], [], [], 0.0)
        return not readable
    except (OSError, ValueError):
        return False


def _rx_socket_alive(sock: RxSocket | None) -> bool:
    """The same for a pool of ``RxSocket``s: one the native thread reads is asked what the thread holds."""
    if sock is not None and sock.reader == NATIVE:
        try:
            return sock.fileno() >= 0 and not sock.pending()
        except (OSError, ValueError):
            return False
    return _socket_alive(sock)


class StampedClientPool(HTTPClientPool):
    """geventhttpclient's per-host client pool, whose plain-TCP connections are ``RxSocket``s and
    whose requests go out without yielding to other greenlets first."""

    def get_client(self, url: Any) -> HTTPClient:
        known = len(self.clients)
        client = super().get_client(url)  # called for every request: only a new client is set up
        if len(self.clients) != known:
            pool = client._connection_pool
            pool._is_socket_alive = _socket_alive
            if not client.ssl:  # TLS decrypts in user space: the kernel's stamp is of ciphertext we cannot split
                pool._create_tcp_socket = _stamped_socket  # the pool's documented socket-factory hook
                pool._is_socket_alive = _rx_socket_alive
        return client


def install(session: Any) -> None:
    """Make a Locust ``FastHttpSession`` open stamped connections (before its first request)."""
    agent = session.client
    agent.clientpool = StampedClientPool(**agent.clientpool.client_args)


def installed(session: Any) -> bool:
    """The session opens ``RxSocket``s for its plain-HTTP connections (``install`` was applied)."""
    return isinstance(session.client.clientpool, StampedClientPool)
