"""The direct transport: a user's own keep-alive connections (``direct.Connections``), sent and read by
the native thread. Used for every plain-HTTP target when the native reader is built; its exchanges are
reported to Locust through the ``report`` the plugin gives it (only ``plugin/`` imports Locust)."""

from __future__ import annotations

import time

from gevent import GreenletExit

from vllm_load.client.direct import ConnectFailed, Connections
from vllm_load.client.exchange import Clock, Decoder, Exchange, Report, fault, locust_row, raise_for, retry_after
from vllm_load.client.reader_choice import BodyState, note_read
from vllm_load.client.native import LineSink
from vllm_load.client.apis.openai_api import error_message


class DirectTransport:
    """One user's direct connections, and where their exchanges are reported."""

    def __init__(self, conns: Connections, report: Report | None = None) -> None:
        self.conns = conns
        self.report = report

    @classmethod
    def for_user(cls, host: str | None, connect_timeout: float, timeout: float,
                 report: Report | None = None, capture: frozenset[bytes] = frozenset()) -> DirectTransport | None:
        """The direct transport to ``host``, or None where Locust's session must serve (TLS, the Python reader)."""
        conns = Connections.for_user(host, connect_timeout, timeout, capture)
        return None if conns is None else cls(conns, report)

    def url(self, path: str) -> str:
        return self.conns.url(path)

    def close(self) -> None:
        self.conns.close()

    def exchange(self, path: str, body: bytes, headers: dict[str, str], decoder: Decoder, clock: Clock,
                 name: str, own: dict[str, str] | None = None) -> Exchange:
        ex = self._exchange(path, body, headers, decoder, clock, own)
        note_read("native")
        if self.report is not None:
            row, error = locust_row(name, decoder, ex.error)
            self.report(row, self.url(path), ex.e2e, decoder.bytes_read, error, clock.start_wall)
        return ex

    def _exchange(self, path: str, body: bytes, headers: dict[str, str], decoder: Decoder,
                  clock: Clock, own: dict[str, str] | None) -> Exchange:
        """Sent, its head and its body read by the native thread: a streamed 200's head and body are taken
        by the thread itself when the decoder is one it parses (``expect``), so the greenlet wakes once."""
        conns = self.conns
        ex = Exchange()
        conn = head = None
        complete = False
        end = None
        try:
            expect = ((decoder, clock.t0, not clock.open_loop) if decoder.parses_sse and not conns.capture
                      else None)
            answer = conns.open(path, headers, body, expect, own)
            conn, head = answer.conn, answer.head
            ex.status = head.status
            if head.captured:
                ex.captured = dict(head.captured)
            fd = conn.fd
            if head.status != 200:
                parts = LineSink()
                out = conns.reads.stream_body(fd, head.chunked, head.length, parts, clock.t0, conns.timeout)
                complete = out.state == BodyState.COMPLETE
                ex.error = f"HTTP {head.status}: {error_message(b''.join(parts))}"
                if head.status in (429, 503):
                    ex.retry_after = retry_after(head.retry_after)
            else:
                if answer.body is not None:  # the native thread took the head and read the body on
                    clock.sent_at(answer.start)  # the start its offsets already count from
                    out = answer.body
                else:
                    clock.sent_at(conns.reads.reader.sent(fd))
                    out = conns.reads.stream_body(fd, head.chunked, head.length, decoder, clock.t0,
                                                  conns.timeout)
                decoder.bytes_read = out.body_bytes
                raise_for(out)
                complete = True
                done_at = decoder.end_offset(out.done_at)
                if done_at is not None:
                    end = clock.t0 + done_at
                ex.error = decoder.incomplete()
        except ConnectFailed as exc:
            ex.error = f"connection failed: {exc.cause!r}"[:240]
        except (Exception, GreenletExit) as exc:  # every fault becomes the record's reason; a stop is re-raised after
            fault(exc, decoder.streamed, ex)
        if conn is not None:
            if head is not None:
                conns.done(conn, head, complete and ex.cancelled is None)
            else:
                conns.discard(conn)
        if ex.error or end is None:
            end = time.perf_counter()
        ex.e2e = end - clock.t0
        return ex
