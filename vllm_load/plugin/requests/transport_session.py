"""The Locust-session transport: requests through a user's FastHttpSession (geventhttpclient), for https://
targets, the Python reader, and users that share a client pool or asked for loop times. Locust's session
fires the request event itself.

Lines are read with the raw geventhttpclient response's ``readline`` (Locust's ``iter_lines`` buffers 1 KB
and inflates TTFT). How a connection is read was decided when it was made (``RxSocket.reader``): the native
thread decodes the body (every line with its landing stamp), the socket's own reads carry the kernel's
stamp, or (TLS, a user's own pool) the clock at read time. geventhttpclient's response internals read here
(``_response``, ``_sock``, ``_body_buffer``, ``message_complete``, ``release``) are why setup.cfg bounds
its version (checked against 2.6.1).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from gevent import GreenletExit
from geventhttpclient.response import HTTPConnectionClosed
from locust.exception import CatchResponseError

from vllm_load.client import rxstamp
from vllm_load.client.exchange import Clock, Decoder, Exchange, Report, Transport, fault, locust_row, raise_for, retry_after
from vllm_load.client.transport_direct import DirectTransport
from vllm_load.client.apis.openai_api import error_message
from vllm_load.client.reader_choice import note_read
from vllm_load.client.rxstamp import CLOCK, NATIVE, STAMPED
from vllm_load.client.sse import StreamError


class SessionTransport:
    """One user's Locust session."""

    def __init__(self, session: Any, capture: frozenset[bytes] = frozenset()) -> None:
        self.session = session
        self.capture = [name.decode("latin-1") for name in capture]  # --capture-header
        #: its plain-HTTP connections are RxSockets (each says how it is read); any other socket is read by the clock
        self.rx_sockets = rxstamp.installed(session) and str(session.base_url).startswith("http://")

    def url(self, path: str) -> str:
        return str(self.session.base_url).rstrip("/") + path

    def close(self) -> None:  # Locust's session closes its own connections
        pass

    def exchange(self, path: str, body: bytes, headers: dict[str, str], decoder: Decoder, clock: Clock,
                 name: str, own: dict[str, str] | None = None) -> Exchange:
        ex = Exchange()
        end = None
        if own:
            headers = {**headers, **own}
        with self.session.request("POST", path, data=body, headers=headers, stream=True, catch_response=True,
                                  name=name) as resp:
            try:
                ex.status = resp.status_code
                if self.capture and resp.headers is not None:
                    got = {n: resp.headers.get(n) for n in self.capture}
                    ex.captured = {n: v for n, v in got.items() if v is not None} or None
                if not ex.status:
                    ex.error = f"connection failed: {resp.error!r}"[:240]
                elif ex.status != 200:
                    ex.error = f"HTTP {ex.status}: {error_message(resp.content or b'')}"
                    if ex.status in (429, 503):
                        ex.retry_after = retry_after(resp.headers.get("Retry-After"))
                else:
                    end = self._read(resp._response, decoder, clock)
                    ex.error = decoder.incomplete()
            except (Exception, GreenletExit) as exc:
                fault(exc, decoder.streamed, ex)
            if ex.error or end is None:
                end = time.perf_counter()
            ex.e2e = end - clock.t0
            resp.request_meta["response_time"] = ex.e2e * 1000.0
            resp.request_meta["response_length"] = decoder.bytes_read
            resp.request_meta["name"], error = locust_row(name, decoder, ex.error)
            if error:
                resp.failure(error)
            else:
                resp.success()
        return ex

    def _read(self, raw: Any, decoder: Decoder, clock: Clock) -> float | None:
        """Read a 200's body into ``decoder``; the perf_counter time the answer was complete, or None."""
        sock = raw._sock
        reader = sock.reader if self.rx_sockets else CLOCK
        note_read(reader)  # what the run says timed its chunks is what did
        if reader != CLOCK:
            clock.sent_at(sock.take_tx())
        t0 = clock.t0
        if reader == NATIVE and not raw._body_buffer and not raw.message_complete:
            try:  # the native thread decodes the body; the hub feeds each line with its own stamp
                done_at = _read_body_native(sock, raw, decoder, t0)
            finally:
                raw.release()  # back to the pool when the body ended cleanly, else closed
            done_at = decoder.end_offset(done_at)
            return None if done_at is None else t0 + done_at
        perf = time.perf_counter
        if reader == STAMPED:  # when the line's bytes reached this host
            def arrival() -> float:
                return sock.rx - t0
        else:  # when this greenlet got to read them
            def arrival() -> float:
                return perf() - t0
        feed = decoder.feed
        while True:
            line = bounded_readline(raw)
            if not line:
                break
            at = arrival()
            feed(line, at)
            if decoder.done:  # the E2E ends as the [DONE] landed (its stamp), as the native reader ends it
                while bounded_readline(raw):  # drain the terminating chunk so the connection can be reused
                    pass
                return t0 + at
        done_at = decoder.end_offset(None)
        return None if done_at is None else t0 + done_at


#: a body line longer than this is not an SSE stream's (the native reader's LINE_MAX_BYTES, _rx.h)
LINE_MAX_BYTES = 16 << 20


def bounded_readline(raw: Any, limit: int = LINE_MAX_BYTES) -> bytes:
    """geventhttpclient's ``readline(b"\\n")``, refused past ``limit`` bytes without a newline: a server sending
    bytes without one grew its buffer at ~190 MB/s (its ``_body_buffer`` and ``feed`` read here: geventhttpclient
    <2.8, setup.cfg)."""
    start = 0
    while True:
        buf = raw._body_buffer
        at = buf.find(b"\n", start)
        if at >= 0:
            line = bytes(buf[:at + 1])
            del buf[:at + 1]
            return line
        start = len(buf)
        if start > limit:
            raise StreamError(f"a body line over {limit >> 20} MiB without a line end: not an SSE stream")
        if raw.message_complete:
            return b""
        sock = raw._sock
        if sock is None:
            raise HTTPConnectionClosed("connection closed.")
        try:
            raw.feed(sock.recv(raw.block_size))
        except BaseException:
            raw.release()
            raise


def _read_body_native(sock: Any, raw: Any, decoder: Decoder, t0: float) -> float | None:
    """Read a 200 response's body with the native thread (``client/native.py``): every line is fed to
    ``decoder`` with its own landing time, with no greenlet switch per chunk. Returns the offset of the
    line that completed the stream (its ``[DONE]``), or None; raises what the Python reader would have
    raised for the same fault (a reset, a timeout, a connection closed mid-body, a protocol error)."""
    chunked = "chunked" in str(raw.get("transfer-encoding") or "").lower()
    length = raw.content_length
    length = -1 if chunked or length is None else length  # -1: until the server closes
    out = sock._native.stream_body(sock._fd, chunked, length, decoder, t0, sock.timeout)
    decoder.bytes_read = out.body_bytes
    raise_for(out)
    raw.message_complete = True  # read to its end: the connection can serve the next request
    return out.done_at


def warmup_admit(environment: Any) -> Callable[[float], bool] | None:
    """The running warm-up's rule for Locust's table (``warmup_reset.WarmupGate.admit``), if the run has one."""
    from vllm_load.plugin.lifecycle.process import process_of

    process = process_of(environment)
    gate = process.run.warmup if process is not None and process.run is not None else None
    return gate.admit if gate is not None else None


def transport_for(user: Any, target: str | None = None) -> Transport:
    """What carries a user's requests to ``target`` (None: its own host), chosen once per target: its direct
    connections (a plain-HTTP target and the native reader), else Locust's session (https://, the Python reader, a
    user that shares a client pool or asked for loop times with ``kernel_stamps = False``)."""
    host = target or user.host
    opts = user.environment.parsed_options
    capture = frozenset(str(n).strip().lower().encode("latin-1") for n in getattr(opts, "capture_header", None) or ())
    if user.kernel_stamps and user.client_pool is None:
        direct = DirectTransport.for_user(host, user.connection_timeout, user.network_timeout,
                                          locust_report(user.environment.events, user.context, warmup_admit(user.environment)),
                                          capture)
        if direct is not None:
            return direct
    if host == user.host:
        return SessionTransport(user.client, capture)
    # another replica of --host than its own (a fault plan drains its own): a session of its own to it
    return SessionTransport(type(user.client)(base_url=host, request_event=user.environment.events.request, user=user),
                            capture)


def locust_report(events: Any, context: Any, admit: Callable[[float], bool] | None = None) -> Report:
    """Report a direct exchange to Locust's request event as its session would (its row, its failure); with
    ``admit`` (a run's warm-up), only the requests it admits by their start."""
    fire = events.request.fire

    def report(name: str, url: str, seconds: float, length: int, error: str | None, start_wall: float) -> None:
        if admit is not None and not admit(start_wall):
            return
        fire(request_type="POST", name=name, response_time=seconds * 1000.0, response_length=length,
             response=None, context=dict(context() or {}),
             exception=CatchResponseError(error) if error else None, start_time=start_wall, url=url)

    return report
