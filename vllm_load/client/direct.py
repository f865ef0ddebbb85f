"""HTTP/1.1 keep-alive connections driven by the native thread: the streaming requests' own transport.

With the native reader (``native.py``) a request no longer goes through Locust's FastHttpSession and
geventhttpclient: they cost ~36 % of the event loop's time per request at 1,700 requests/s (py-spy),
most of it building a request object, headers and cookies for bytes that are the same every time. Here
the bytes before the body are built once per path, the send is one call that keeps the GIL (releasing
it around a 10 us loopback send handed it to the prompt thread for a whole switch interval), and the C
thread reads the answer from the connect on. A streamed request is expected (``Reader.expect``) before it
is sent: the thread parses a 200's header block itself and reads the body on, so the request's greenlet
wakes once, at the body's end (a wait for the head cost a second wake: 6-11 % of the loop per request,
turnover.py). Any other answer's header block (an error status, HTTP/1.0, a framing the thread is unsure of) is left
whole to ``Reader.head`` and parsed here for the fields the request needs. Plain ``http://`` only: TLS
decrypts in user space, so those targets, and the Python reader, keep Locust's session.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from gevent.socket import getaddrinfo, wait_write

from vllm_load.client import native
from vllm_load.client.rxstamp import RxSocket


class ConnectFailed(Exception):
    """No connection to the target (refused, unreachable, connect timeout): no HTTP answer at all."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def header_lines(headers: dict[str, str]) -> bytes:
    """Header fields as request lines, each ending in CRLF (those the connection sets itself left out)."""
    return "".join(f"{k}: {v}\r\n" for k, v in headers.items()
                   if k.lower() not in ("host", "content-length", "connection")).encode("latin-1")


class ClosedBeforeAnswer(ConnectionError):
    """The server closed (or reset) the connection before a response's headers were complete."""


@dataclass(frozen=True, slots=True)
class Origin:
    """Where requests go, read once from the user's ``host`` (``http://HOST[:PORT][/BASE]``)."""

    host: str
    port: int
    base: str  # a path prefix, e.g. a gateway's /openai ("" when none)
    authority: str  # the Host header

    @classmethod
    def parse(cls, url: str | None) -> Origin | None:
        """The origin of a plain-HTTP ``url``; None for anything else (https:// stays on Locust's session)."""
        if not url:
            return None
        parts = urlsplit(url)
        # credentials in the URL (Basic auth) stay with Locust's session, which sends them
        if parts.scheme != "http" or not parts.hostname or parts.query or parts.fragment or parts.username:
            return None
        try:
            port = parts.port or 80
        except ValueError:
            return None
        return cls(parts.hostname, port, parts.path.rstrip("/"), parts.netloc.rsplit("@", 1)[-1])


@dataclass(frozen=True, slots=True)
class Head:
    """A response's status line and the header fields a streaming request reads."""

    status: int
    chunked: bool
    length: int  # Content-Length, -1 when absent (chunked, or until the server closes)
    keep_alive: bool
    retry_after: str | None
    #: the header fields asked for (--capture-header, lower-cased names), as (name, value) pairs
    captured: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, block: bytes, capture: frozenset[bytes] = frozenset()) -> Head:
        lines = block.split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        code = rest[:3]
        if not version.startswith(b"HTTP/1.") or not code.isdigit():
            raise ValueError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        chunked, length, retry_after = False, -1, None
        captured: list[tuple[str, str]] = []
        keep_alive = version != b"HTTP/1.0"
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                continue
            name = name.strip().lower()
            if name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"content-length":
                length = int(value.strip())
            elif name == b"connection":
                word = value.strip().lower()
                keep_alive = word != b"close" and (keep_alive or word == b"keep-alive")
            elif name == b"retry-after":
                retry_after = value.strip().decode("latin-1")
            if name in capture:
                captured.append((name.decode("latin-1"), value.strip().decode("latin-1")))
        return cls(int(code), chunked, -1 if chunked else length, keep_alive, retry_after, tuple(captured))


@dataclass(slots=True)
class Answer:
    """A sent request's answer so far: its connection and head, and, when the native thread took the head
    itself and read the body on (``NativeReads.expect``), the body's outcome and the start its offsets count
    from (the kernel's stamp of the send, in a closed loop)."""

    conn: Connection
    head: Head
    body: native.BodyOutcome | None = None
    start: float | None = None


@dataclass(slots=True)
class Connection:
    sock: RxSocket
    fd: int
    used: int = 0  # requests sent on it (a reused connection may have been closed by the server while idle)


@dataclass
class Connections:
    """One Locust user's keep-alive connections to its origin (usually one; more when a task's greenlets
    stream concurrently), read by this process's native thread."""

    reads: native.NativeReads
    origin: Origin
    connect_timeout: float
    timeout: float  # a read's or a send's (Locust's network_timeout)
    idle: list[Connection] = field(default_factory=list)
    #: response header fields to keep (--capture-header, lower-cased): their answers' heads are parsed here, not
    #: taken by the native thread (which keeps only the framing)
    capture: frozenset[bytes] = frozenset()
    _prefixes: dict[tuple[str, int], tuple[dict[str, str], bytes]] = field(default_factory=dict)

    @classmethod
    def for_user(cls, host: str | None, connect_timeout: float, timeout: float,
                 capture: frozenset[bytes] = frozenset()) -> Connections | None:
        """Direct connections for a user of ``host``, or None where Locust's session must serve (TLS, the
        Python reader)."""
        origin = Origin.parse(host)
        reads = native.reads() if origin is not None else None
        if reads is None or origin is None:
            return None
        return cls(reads, origin, connect_timeout, timeout, capture=capture)

    @staticmethod
    def reads_natively(host: str | None) -> bool:
        """Requests to ``host`` go over direct connections, every chunk read by the native thread."""
        return native.enabled() and Origin.parse(host) is not None

    def url(self, path: str) -> str:
        return f"http://{self.origin.authority}{self.origin.base}{path}"

    def prefix(self, path: str, headers: dict[str, str]) -> bytes:
        """The request's bytes up to its own header fields, built once per path and header set (the run's
        headers: one dict for every request)."""
        key = (path, id(headers))
        known = self._prefixes.get(key)
        if known is not None and known[0] is headers:
            return known[1]
        lines = [f"POST {self.origin.base}{path} HTTP/1.1", f"Host: {self.origin.authority}", "User-Agent: vllm-load"]
        built = ("\r\n".join(lines) + "\r\n").encode("latin-1") + header_lines(headers)
        self._prefixes[key] = (headers, built)
        return built

    def open(self, path: str, headers: dict[str, str], body: bytes,
             stream: tuple[Any, float, bool] | None = None, own: dict[str, str] | None = None) -> Answer:
        """Send the request on an idle connection (else a new one) and wait for its answer's headers. A reused
        connection the server closed while idle is retried once on a new one, before any answer was read.
        With ``stream`` (a ``StreamState``, the request's start, whether it counts from the send) the native
        thread takes a 200's headers itself and reads the body on: the answer comes at the body's end."""
        data = b"%s%sContent-Length: %d\r\n\r\n%s" % (self.prefix(path, headers), header_lines(own) if own else b"",
                                                          len(body), body)
        while self.idle:
            conn = self.idle.pop()
            if conn.sock.pending():  # the server closed it while it sat in the pool (its keep-alive timeout)
                self.discard(conn)
                continue
            try:
                return self._exchange(conn, data, stream)
            except (ClosedBeforeAnswer, BrokenPipeError, ConnectionResetError):
                self.discard(conn)  # stale: the server closed it while it sat in the pool
            except BaseException:
                self.discard(conn)
                raise
        conn = self._connect()
        try:
            return self._exchange(conn, data, stream)
        except BaseException:
            self.discard(conn)
            raise

    def _connect(self) -> Connection:
        try:
            family, kind, proto, _name, address = getaddrinfo(self.origin.host, self.origin.port, 0,
                                                              socket.SOCK_STREAM)[0]
            sock = RxSocket(family, kind, proto)
            sock.settimeout(self.connect_timeout)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.connect(address)  # the native thread reads it from here on
            except BaseException:
                sock.close()
                raise
        except OSError as exc:
            raise ConnectFailed(exc) from None
        return Connection(sock, sock.fileno())

    def _exchange(self, conn: Connection, data: bytes, stream: tuple[Any, float, bool] | None) -> Answer:
        conn.used += 1
        reads, fd = self.reads, conn.fd
        expected = reads.expect(fd, *stream, self.timeout) if stream is not None else None
        send = reads.reader.send
        try:
            sent = send(fd, data)
            while sent < len(data):  # a body larger than the socket's send buffer
                wait_write(fd, timeout=self.timeout, timeout_exc=socket.timeout("timed out sending the request"))
                sent += send(fd, data[sent:])
        except BaseException:
            if expected is not None:
                reads.forget(fd, expected)
            raise
        if expected is not None:
            out = reads.response(fd, expected)
            if out.state != native.DECLINED:
                taken = reads.reader.accepted(fd)
                if taken is None:  # failed before the head came: as a wait for it would have
                    raise out.error if out.error is not None else ClosedBeforeAnswer("no answer")
                return Answer(conn, Head(200, taken.chunked, taken.length, taken.keep_alive, None), out, taken.start)
        head = reads.reader.head
        while True:
            block = head(fd)
            if block is None:
                reads.wait(fd, self.timeout)
            elif not block:
                raise ClosedBeforeAnswer("the server closed the connection before answering")
            else:
                return Answer(conn, Head.parse(block, self.capture))

    def done(self, conn: Connection, head: Head, complete: bool) -> None:
        """The exchange is over: a connection whose body was read to its end goes back to the pool."""
        if complete and head.keep_alive and not conn.sock.pending():
            self.idle.append(conn)
        else:
            self.discard(conn)

    def discard(self, conn: Connection) -> None:
        conn.sock.close()  # RxSocket's close stops the native thread's reads of it first

    def close(self) -> None:
        while self.idle:
            self.discard(self.idle.pop())
