"""Both stream readers (the native thread and the Python fallback) read every body shape and fault
the same way: chunked bodies cut anywhere, Content-Length and close-delimited bodies, keep-alive
reuse, and a server that closes, resets, garbles or stalls mid-body."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from locust.contrib.fasthttp import FastHttpSession
from locust.event import EventHook

from vllm_load.client import exchange, native, rxstamp
from vllm_load.client.direct import Connections
from vllm_load.client.stream import build_request, stream_request
from vllm_load.client.transport_direct import DirectTransport
from vllm_load.plugin.requests import transport_session
from vllm_load.plugin.requests.transport_session import SessionTransport, locust_report

SERVER = Path(__file__).parent / "scripted_http.py"
TOKENS = 5


class Server:
    def __init__(self, scenario: str, gap: float = 0.01) -> None:
        self.p = subprocess.Popen([sys.executable, str(SERVER), scenario, "--gap", str(gap)], stdout=subprocess.PIPE,
                                  text=True)
        line = self.p.stdout.readline()
        assert line.startswith("port "), line
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def log(self) -> list[str]:
        self.p.kill()
        out, _ = self.p.communicate(timeout=10)
        return out.split()


#: direct: the native thread sends and reads (direct.Connections); native: Locust's session sends, the native
#: thread reads the body; python: Locust's session and the Python reader
@pytest.fixture(params=["direct", "native", "python"])
def any_reader(request, monkeypatch):
    if request.param != "python" and not native.built():
        pytest.fail("the native reader is not built")
    monkeypatch.setenv(native.ENV, "0" if request.param == "python" else "1")
    return request.param


@pytest.fixture
def reader(any_reader, monkeypatch):
    """A reader under test that must read a 200's streamed body."""
    calls = []
    real = transport_session._read_body_native
    monkeypatch.setattr(transport_session, "_read_body_native", lambda *a: calls.append(1) or real(*a))
    yield any_reader
    # the body went through the reader under test: the native thread decoded it, or Python did
    assert bool(calls) == (any_reader == "native")


class Transport:
    """One user's transport of the reader under test, and the Locust rows it reported."""

    def __init__(self, url: str, reader: str, timeout: float) -> None:
        self.hook = EventHook()
        self.rows: list[dict] = []
        self.hook.add_listener(lambda **kw: self.rows.append(kw))
        if reader == "direct":
            self.via = DirectTransport.for_user(url, 5.0, timeout,
                                                locust_report(SimpleNamespace(request=self.hook), lambda: {"u": 1}))
            assert self.via is not None
        else:
            session = FastHttpSession(url, self.hook, None, network_timeout=timeout, connection_timeout=5.0)
            rxstamp.install(session)
            self.via = SessionTransport(session)

    def send(self):
        req = build_request("completions", "m", "hello", 8, TOKENS)
        rec = stream_request(self.via, req, {"Content-Type": "application/json"})
        row = self.rows[-1]  # Locust's row, whichever transport fired it
        assert row["name"] == "/v1/completions" and row["request_type"] == "POST"
        assert abs(row["response_time"] - rec.e2e * 1000) < 1e-6
        assert (row["exception"] is None) == rec.ok
        if not rec.ok:
            assert rec.error in str(row["exception"])
        return rec


def session(url: str, reader: str, timeout: float = 10.0) -> Transport:
    return Transport(url, reader, timeout)


def send(s: Transport):
    return s.send()


@pytest.mark.parametrize("scenario", ["chunked", "split", "length", "headcut"])
def test_bodies_of_every_shape_read_whole_and_reuse_the_connection(scenario, reader):
    srv = Server(scenario)
    s = session(srv.url, reader)
    recs = [send(s) for _ in range(2)]
    for rec in recs:
        assert rec.ok, rec.error
        assert rec.output_tokens == TOKENS and rec.input_tokens == 8 and rec.tokens_from_usage
        assert len(rec.chunk_offsets) == TOKENS and rec.response_id == "cmpl-scripted"
        # each event is its own segment, 10 ms apart (split: some share one): offsets rise, no gap is negative
        assert all(b >= a for a, b in zip(rec.chunk_offsets, rec.chunk_offsets[1:]))
        assert rec.e2e >= rec.chunk_offsets[-1]
    assert srv.log().count("connection") == 1  # the second request reused the first's connection


def test_usage_no_server_could_mean_is_not_taken_and_the_tokens_are_counted(reader):
    """A usage of 10^30 prompt tokens and -3 answer tokens (a hostile or broken server) crashed a Generator
    greenlet, or reported 10^32 tokens a second: it is no usage, and the client's own counts stand."""
    srv = Server("absurd")
    rec = send(session(srv.url, reader))
    assert rec.ok, rec.error
    assert not rec.tokens_from_usage and rec.input_tokens == 8 and rec.output_tokens == TOKENS
    assert rec.cached_tokens is None
    srv.log()


def test_a_request_built_long_before_its_send_counts_every_line_from_the_send(reader, monkeypatch):
    """A closed loop counts from the send (its kernel stamp), not from the request's build: a new connection's
    connect comes between them. The thread's parsed chunks counted from the send while the lines it leaves to
    Python (vLLM's usage event with its body metrics, then the [DONE]: the E2E) counted from the build, so on a
    busy host a first request's E2E ended 3-12 ms after its exchange returned. Here the build is moved 0.3 s
    before the send, and the usage event carries vLLM's body metrics."""
    real = exchange.Clock.now.__func__
    early = 0.3

    def built_early(cls, intended_start):
        c = real(cls, intended_start)
        return cls(c.now_perf - early, c.now_wall - early, c.t0 - early, c.start_wall - early, c.open_loop)

    monkeypatch.setattr(exchange.Clock, "now", classmethod(built_early))
    srv = Server("metrics")
    s = session(srv.url, reader)
    for _ in range(2):  # a new connection, then the same one again
        before = time.time()
        rec = send(s)
        after = time.time()
        assert rec.ok, rec.error
        # the E2E ends when [DONE] came: after the last chunk (two 10 ms gaps later), before the exchange returned
        assert rec.start + rec.e2e <= after
        assert 0.0 <= rec.e2e - rec.chunk_offsets[-1] < early / 2, (rec.e2e, rec.chunk_offsets)
        assert rec.start >= before - 0.01  # counted from the send, not from the build 0.3 s earlier
    srv.log()


def test_a_close_delimited_body_ends_at_the_close(reader):
    srv = Server("close")
    s = session(srv.url, reader)
    recs = [send(s) for _ in range(2)]
    assert all(r.ok and r.output_tokens == TOKENS for r in recs), [r.error for r in recs]
    assert srv.log().count("connection") == 2  # a closed connection is not reused


@pytest.mark.parametrize("scenario,reason", [
    ("cut", "connection closed mid-stream after 2 tokens"),
    ("reset", "after 2 tokens"),
    ("malformed", "after 1 tokens"),
])
def test_a_broken_body_fails_with_its_reason_and_the_tokens_it_had(scenario, reason, reader):
    srv = Server(scenario)
    s = session(srv.url, reader)
    rec = send(s)
    assert not rec.ok and reason in rec.error, rec.error
    assert rec.output_tokens == int(reason.split(" tokens")[0].split()[-1])
    rec2 = send(s)  # the broken connection is dropped; the next request opens a new one
    assert not rec2.ok
    assert srv.log().count("connection") == 2


def test_a_stalled_body_times_out(reader):
    srv = Server("stall")
    s = session(srv.url, reader, timeout=0.5)
    rec = send(s)
    assert not rec.ok and rec.error.startswith("timeout after 2 tokens"), rec.error
    srv.log()


def test_a_body_longer_than_the_timeout_but_never_quiet_that_long_does_not_time_out(reader):
    # the timeout is a read's (Locust's network_timeout), not the body's: 9 pieces 0.2 s apart under a 0.5 s
    # timeout. The native thread parses the SSE itself, so the loop hears of the body only at its end and
    # asks the thread how long the socket has been quiet.
    srv = Server("chunked", gap=0.2)
    s = session(srv.url, reader, timeout=0.5)
    rec = send(s)
    assert rec.ok, rec.error
    assert rec.e2e > 1.0 and rec.output_tokens == TOKENS
    srv.log()


@pytest.mark.parametrize("via", ["direct", "native"])
def test_a_user_stopped_mid_body_fails_with_the_tokens_it_had(via, monkeypatch):
    # the native thread parses the body itself and hands it over at its end: a stop before the end must
    # still take what it parsed, so the failure counts the tokens that came
    import gevent
    from tests.scripted_http import HEAD_CHUNKED, chunk, events
    if not native.built():
        pytest.fail("the native reader is not built")
    monkeypatch.setenv(native.ENV, "1")
    srv = Server("stall")
    s = session(srv.url, via)
    reader = native.reads().reader
    before = reader.stats()["bytes"]
    req = build_request("completions", "m", "hello", 8, TOKENS)
    g = gevent.spawn(stream_request, s.via, req, {"Content-Type": "application/json"})
    two_events = len(HEAD_CHUNKED) + sum(len(chunk(e)) for e in events()[:2])
    deadline = time.monotonic() + 10
    while reader.stats()["bytes"] - before < two_events:  # the thread has read both events
        assert time.monotonic() < deadline, "the two events never arrived"
        gevent.sleep(0.005)
    g.kill(block=True)
    rec = g.value.record  # StreamCancelled, a GreenletExit: the greenlet's value
    assert rec.error == "cancelled after 2 tokens: the test stopped mid-request"
    assert len(rec.chunk_offsets) == 2 and rec.output_tokens == 2 and rec.response_id == "cmpl-scripted"
    assert rec.status == 200 and not rec.connection_failed  # its head came: a stop, not a connection failure
    srv.log()


def test_a_refusal_keeps_its_reason_and_retry_after_and_the_connection(any_reader):
    srv = Server("error")
    s = session(srv.url, any_reader)
    recs = [send(s) for _ in range(2)]
    for rec in recs:
        assert not rec.ok and rec.status == 429 and rec.error == "HTTP 429: slow down", rec.error
        assert rec.retry_after == 2.0 and not rec.connection_failed
    assert srv.log().count("connection") == 1


def test_a_connection_the_server_closed_while_idle_is_replaced_not_failed(reader):
    srv = Server("idle")
    s = session(srv.url, reader)
    recs = []
    for _ in range(3):
        recs.append(send(s))
        deadline = time.monotonic() + 5  # until the server's close of the idle connection has landed here
        while time.monotonic() < deadline and not _closed_by_peer(srv):
            time.sleep(0.01)
    assert all(r.ok for r in recs), [r.error for r in recs]
    assert srv.log().count("connection") == 3


def _closed_by_peer(srv: Server) -> bool:
    """The server's side of its connections is gone (ss: no ESTAB socket on its port)."""
    port = srv.url.rsplit(":", 1)[1]
    out = subprocess.run(["ss", "-tn", "state", "established", f"( sport = :{port} )"], capture_output=True,
                         text=True).stdout
    return port not in out


def test_no_server_is_a_connection_failure():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    s = Transport(f"http://127.0.0.1:{port}", "direct", 5.0)
    rec = send(s)
    assert rec.connection_failed and rec.error.startswith("connection failed: ConnectionRefusedError"), rec.error


def test_which_targets_go_over_direct_connections(monkeypatch):
    """Plain HTTP with the native reader; TLS, credentials in the URL or the Python reader keep Locust's session
    (and the generator's smaller fold slices, which keep the Python reader's chunks from waiting)."""
    monkeypatch.setenv(native.ENV, "1")
    assert Connections.reads_natively("http://127.0.0.1:8000")
    assert Connections.reads_natively("http://gateway.internal/openai/")
    for host in ("https://api.example.com", "http://user:pw@127.0.0.1:8000", None, ""):
        assert not Connections.reads_natively(host)
        assert Connections.for_user(host, 1.0, 1.0) is None
    monkeypatch.setenv(native.ENV, "0")
    assert not Connections.reads_natively("http://127.0.0.1:8000")
    from vllm_load.client.direct import Origin
    origin = Origin.parse("http://gateway.internal:8080/openai/")
    assert (origin.host, origin.port, origin.base, origin.authority) == ("gateway.internal", 8080, "/openai",
                                                                       "gateway.internal:8080")
    conns = Connections(None, origin, 1.0, 1.0)  # the bytes before the body, built once per path
    headers = {"Content-Type": "application/json", "Authorization": "Bearer k", "Host": "ignored"}
    head = conns.prefix("/v1/completions", headers)
    assert head.startswith(b"POST /openai/v1/completions HTTP/1.1\r\nHost: gateway.internal:8080\r\n")
    assert b"Authorization: Bearer k\r\n" in head and b"ignored" not in head and head.endswith(b"\r\n")
    assert b"Content-Length" not in head  # each request's own fields, then its length, follow
    assert conns.prefix("/v1/completions", headers) is head
