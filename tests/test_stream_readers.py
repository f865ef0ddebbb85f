"""Both stream readers (the native thread and the Python fallback) read every body shape and fault
the same way: chunked bodies cut anywhere, Content-Length and close-delimited bodies, keep-alive
reuse, and a server that closes, resets, garbles or stalls mid-body."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from locust.contrib.fasthttp import FastHttpSession
from locust.event import EventHook

from vllm_load.client import native, rxstamp, stream
from vllm_load.client.stream import build_request, stream_request

SERVER = Path(__file__).parent / "scripted_http.py"
TOKENS = 5


class Server:
    def __init__(self, scenario: str) -> None:
        self.p = subprocess.Popen([sys.executable, str(SERVER), scenario], stdout=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        assert line.startswith("port "), line
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def log(self) -> list[str]:
        self.p.kill()
        out, _ = self.p.communicate(timeout=10)
        return out.split()


@pytest.fixture(params=["native", "python"])
def reader(request, monkeypatch):
    if request.param == "native" and not native.built():
        pytest.fail("the native reader is not built")
    monkeypatch.setenv(native.ENV, "1" if request.param == "native" else "0")
    calls = []
    real = stream._read_body_native
    monkeypatch.setattr(stream, "_read_body_native", lambda *a: calls.append(1) or real(*a))
    yield request.param
    # the body went through the reader under test: the native thread decoded it, or Python did
    assert bool(calls) == (request.param == "native")


def session(url: str, timeout: float = 10.0) -> FastHttpSession:
    s = FastHttpSession(url, EventHook(), None, network_timeout=timeout, connection_timeout=5.0)
    rxstamp.install(s)
    return s


def send(s: FastHttpSession):
    req = build_request("completions", "m", "hello", 8, TOKENS)
    return stream_request(s, req, {"Content-Type": "application/json"})


@pytest.mark.parametrize("scenario", ["chunked", "split", "length"])
def test_bodies_of_every_shape_read_whole_and_reuse_the_connection(scenario, reader):
    srv = Server(scenario)
    s = session(srv.url)
    recs = [send(s) for _ in range(2)]
    for rec in recs:
        assert rec.ok, rec.error
        assert rec.output_tokens == TOKENS and rec.input_tokens == 8 and rec.tokens_from_usage
        assert len(rec.chunk_offsets) == TOKENS and rec.response_id == "cmpl-scripted"
        # each event is its own segment, 10 ms apart (split: some share one): offsets rise, no gap is negative
        assert all(b >= a for a, b in zip(rec.chunk_offsets, rec.chunk_offsets[1:]))
        assert rec.e2e >= rec.chunk_offsets[-1]
    assert srv.log().count("connection") == 1  # the second request reused the first's connection


def test_a_close_delimited_body_ends_at_the_close(reader):
    srv = Server("close")
    s = session(srv.url)
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
    s = session(srv.url)
    rec = send(s)
    assert not rec.ok and reason in rec.error, rec.error
    assert rec.output_tokens == int(reason.split(" tokens")[0].split()[-1])
    rec2 = send(s)  # the broken connection is dropped; the next request opens a new one
    assert not rec2.ok
    assert srv.log().count("connection") == 2


def test_a_stalled_body_times_out(reader):
    srv = Server("stall")
    s = session(srv.url, timeout=0.5)
    rec = send(s)
    assert not rec.ok and rec.error.startswith("timeout after 2 tokens"), rec.error
    srv.log()
