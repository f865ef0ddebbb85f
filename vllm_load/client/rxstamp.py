"""Kernel receive timestamps: when a chunk reached this host, not when a busy loop got round to it.

Linux stamps each received packet; a socket with ``SO_TIMESTAMPNS`` set is handed the stamp of the
last packet a read consumed. A chunk's time then no longer depends on how long the event loop took
to wake the greenlet that reads it, so the client's own load (hundreds of streams, a burst of
chunks, request turnover, a GC pass) stays out of TTFT and inter-token gaps. Where stamps are not
available (TLS sockets, other systems) reads fall back to the clock at read time.

Stamps are CLOCK_REALTIME, the only clock the kernel stamps with: ``RxSocket.rx`` is a ``time.time()``
value, compared with a ``time.time()`` read next to the request's ``perf_counter`` start.
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


def stamp_of(ancdata: list[tuple[int, int, bytes]]) -> float | None:
    """The receive stamp in a ``recvmsg`` answer's ancillary data, as a ``time.time()`` value."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
            sec, nsec = _TIMESPEC.unpack_from(data)
            return sec + nsec * 1e-9
    return None


class RxSocket(gevent.socket.socket):
    """A gevent socket whose reads keep the kernel's stamp of the data they return in ``rx``.

    ``rx`` is the stamp of the last packet the latest ``recv`` consumed (``time.time()`` at the read
    if the kernel gave none; unused when ``stamped`` is False), so a line taken from bytes a read returned belongs to that read.
    ``tx`` is the clock just before a request's first send: building the request (Locust, headers,
    the connection pool) can wait on the GIL or other greenlets, and is the client's time, not the server's.
    """

    __slots__ = ("rx", "tx", "stamped")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rx = 0.0
        self.tx: float | None = None  # when a request's first byte went out; the reader takes and clears it
        self.stamped = enable(self)

    def sendall(self, data: Any, flags: int = 0) -> None:
        if self.tx is None:
            self.tx = time.time()
        super().sendall(data, flags)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        if not self.stamped:  # readers time these lines themselves (``stamped`` tells them)
            return super().recv(bufsize, flags)
        data, ancdata, _flags, _addr = self.recvmsg(bufsize, ANCBUF, flags)
        stamp = stamp_of(ancdata) if ancdata else None
        self.rx = time.time() if stamp is None else stamp
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
        return client


def install(session: Any) -> None:
    """Make a Locust ``FastHttpSession`` open stamped connections (before its first request)."""
    agent = session.client
    agent.clientpool = StampedClientPool(**agent.clientpool.client_args)
