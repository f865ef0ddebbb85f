"""The server's OpenTelemetry spans joined to the client's requests (--otlp-receiver): every request carries a
traceparent of its own; the receiver takes OTLP/HTTP protobuf exports (and nothing else); the report joins each span
to its request by trace id (else response id) and counts what did not join."""

import json
import urllib.error
import urllib.request

import pytest

from tests.helpers import ROOT, free_port, run_in_process
from vllm_load.errors import EXIT_SLO_MISS, UsageError
from vllm_load.metrics.fleet.spans import export_request, join, parse_export
from vllm_load.plugin.sources.span_receiver import SpanReceiver, parse_address
from vllm_load.rundir.reqlog import read_log

CHAT = str(ROOT / "locustfiles" / "chat.py")


def _span(trace: str, rid: str, queue=0.01, prefill=0.02, decode=0.3) -> dict:
    return {"trace_id": trace, "request_id": rid, "queue": queue, "prefill": prefill, "decode": decode,
            "ttft": queue + prefill + 0.001, "e2e": queue + prefill + decode + 0.002, "prompt_tokens": 12,
            "completion_tokens": 7}


def test_an_export_round_trips_and_other_spans_are_left_out():
    rows = [_span("ab" * 16, "chatcmpl-1"), _span("cd" * 16, "cmpl-2", queue=0.5)]
    got = parse_export(export_request(rows))
    assert got == [{k: v for k, v in r.items()} for r in rows]
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    msg = trace_service_pb2.ExportTraceServiceRequest()
    msg.resource_spans.add().scope_spans.add().spans.add(name="load_model", trace_id=b"\x01" * 16)
    assert parse_export(msg.SerializeToString()) == []  # vLLM's start-up spans are no request's
    with pytest.raises(ValueError):
        parse_export(b"\xff\xff not protobuf")


def test_spans_join_by_trace_id_then_by_response_id_and_the_rest_is_counted():
    records = [
        {"ok": True, "trace_id": "a" * 32, "response_id": "x", "ttft": 0.05},  # by trace id; no server parts yet
        {"ok": True, "trace_id": "b" * 32, "response_id": "chatcmpl-2", "ttft": 0.06},  # by response id
        {"ok": True, "trace_id": "c" * 32, "response_id": "y", "ttft": 0.07, "server_queue": 0.001,
         "server_prefill": 0.002, "server_ttft": 0.003},  # the stream's own parts stand
        {"ok": True, "trace_id": "d" * 32, "response_id": "z", "ttft": 0.08},  # its span never came
    ]
    spans = [_span("a" * 32, "r1"), _span("f" * 32, "chatcmpl-2", queue=0.02), _span("c" * 32, "y"),
             _span("e" * 32, "other-client")]
    counts = join(records, spans)
    assert counts == {"spans": 4, "joined": 3, "unmatched": 1, "requests_without": 1}
    a, b, c, _ = records
    assert (a["server_queue"], a["server_prefill"], a["server_decode"]) == (0.01, 0.02, 0.3)
    assert a["server_ttft"] == pytest.approx(0.03) and a["client_overhead"] == pytest.approx(0.02)
    assert b["server_queue"] == 0.02
    assert c["server_queue"] == 0.001 and c["span_ttft"] == pytest.approx(0.031)


def _post(url, body=b"", headers=None, method="POST"):
    """Sent from a thread of gevent's pool: the receiver is served by this thread's gevent loop meanwhile."""
    import gevent
    return gevent.get_hub().threadpool.spawn(_send, url, body, headers, method).get()


def _send(url, body, headers, method):
    req = urllib.request.Request(url, data=body if method == "POST" else None, method=method,
                                 headers={"Content-Type": "application/x-protobuf", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_receiver_takes_protobuf_exports_from_its_own_host_only():
    rx = SpanReceiver("127.0.0.1:0")
    try:
        url = rx.endpoint
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1/traces")
        body = export_request([_span("ab" * 16, "chatcmpl-1")])
        assert _post(url, body) == 200 and len(rx.spans) == 1
        assert _post(url, body, {"Host": "evil.example"}) == 403  # DNS rebinding
        assert _post(url, body, {"Origin": "http://127.0.0.1:8089"}) == 403  # any browser page
        assert _post(url, body, {"Content-Type": "application/json"}) == 415
        assert _post(url.replace("/v1/traces", "/v1/metrics"), body) == 404
        assert _post(url, method="GET") == 405
        assert _post(url, b"\xff\xff not protobuf") == 400
        assert len(rx.spans) == 1 and rx.refused == 6
        assert rx.wait_for(1, timeout=0.1) and not rx.wait_for(2, timeout=0.2)
        assert "warning" not in rx.banner()  # loopback: nothing to warn of
    finally:
        rx.close()


def test_the_receiver_parses_an_export_off_the_event_loop(monkeypatch):
    """A 16 MB export parsed on the loop held it ~0.3 s, the streams' stamps and the run's trust with it
    (benchmarks/span_parse.py): it is parsed in gevent's thread pool, and what it held is kept as before."""
    from gevent.monkey import get_original

    from vllm_load.plugin.sources import span_receiver

    thread_id = get_original("_thread", "get_ident")  # the OS thread's (patched, get_ident names the greenlet)
    where: list[int] = []

    def parse(body: bytes) -> list:
        where.append(thread_id())
        return parse_export(body)

    monkeypatch.setattr(span_receiver, "parse_export", parse)
    rx = SpanReceiver("127.0.0.1:0")
    try:
        assert _post(rx.endpoint, export_request([_span("cd" * 16, "chatcmpl-2")])) == 200
        assert len(rx.spans) == 1 and rx.spans[0]["trace_id"] == "cd" * 16
        assert _post(rx.endpoint, b"\xff\xff not protobuf") == 400  # a bad body still one refusal, from the thread
    finally:
        rx.close()
    assert len(where) == 2 and thread_id() not in where


def test_the_receiver_keeps_at_most_its_cap_of_spans_and_warns_of_a_wide_bind(monkeypatch):
    """Every span sent was kept (three 16 MB exports: 159 -> 686 MB); past the cap the rest is dropped, counted."""
    from vllm_load.plugin.sources import span_receiver

    monkeypatch.setattr(span_receiver, "MAX_SPANS", 5)
    rx = SpanReceiver("127.0.0.1:0")
    try:
        body = export_request([_span(f"{i:032x}", f"chatcmpl-{i}") for i in range(4)])
        assert _post(rx.endpoint, body) == 200 and _post(rx.endpoint, body) == 200  # the exporter is not refused
        assert len(rx.spans) == 5 and rx.dropped == 3
        rx.clear()  # a new run: room again
        assert _post(rx.endpoint, body) == 200 and len(rx.spans) == 4 and rx.dropped == 0
    finally:
        rx.close()
    wide = SpanReceiver("0.0.0.0:0")
    try:
        assert "warning: it listens on every interface, unauthenticated" in wide.banner()
    finally:
        wide.close()


@pytest.mark.parametrize("text,expected", [("4318", ("127.0.0.1", 4318)), ("0.0.0.0:4318", ("0.0.0.0", 4318)),
                                           ("[::1]:0", ("::1", 0))])
def test_receiver_addresses(text, expected):
    assert parse_address(text) == expected


@pytest.mark.parametrize("text", ["", "host:", "host:port", "127.0.0.1:70000"])
def test_bad_receiver_addresses_are_one_line(text):
    with pytest.raises(UsageError, match="--otlp-receiver"):
        parse_address(text)


def test_a_busy_receiver_port_is_one_line_and_exit_2(tmp_path):
    rx = SpanReceiver("127.0.0.1:0")
    try:
        res = run_in_process(["-f", CHAT, "--headless", "-u", "1", "-t", "2s", "--otlp-receiver",
                              f"127.0.0.1:{rx.server.server_port}", "--run-dir", str(tmp_path / "run")], tmp_path)
    finally:
        rx.close()
    assert res.returncode == 2 and "--otlp-receiver 127.0.0.1:" in res.stderr and "cannot listen there" in res.stderr
    assert "Traceback" not in res.stderr


def _summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())["summary"]


def test_the_embedded_emulators_spans_join_every_request_exactly(tmp_path):
    """The default target exports its spans to the run's receiver: each request's span equals the emulator's own
    per-request metrics in the stream (the same numbers, two paths), every trace id is the request's own."""
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", CHAT, "--headless", "-u", "4", "-r", "4", "-t", "4s", "--otlp-receiver", "0",
                          "--output-tokens", "16", "--run-dir", str(run_dir)], tmp_path, timeout=120)
    assert res.returncode in (0, 5), res.stdout[-3000:] + res.stderr[-3000:]  # 5: a busy host; trust is not tested
    assert "OTLP trace receiver at http://127.0.0.1:" in res.stdout
    logs = [r for r in read_log(run_dir / "requests.jsonl") if r["ok"]]
    spans = {s["trace_id"]: s for s in read_log(run_dir / "spans.jsonl")}
    assert len(logs) >= 8 and len({r["trace_id"] for r in logs}) == len(logs)
    assert set(spans) == {r["trace_id"] for r in logs}
    for r in logs:
        s = spans[r["trace_id"]]
        assert s["request_id"] == r["response_id"]
        assert abs(s["queue"] - r["server_queue"]) < 1e-3 and abs(s["prefill"] - r["server_prefill"]) < 1e-3
        assert abs(s["decode"] - r["server_decode"]) < 1e-3 and r["client_overhead"] >= 0
    timing = _summary(run_dir)["timing"]
    assert timing["spans"] == {"spans": len(logs), "joined": len(logs), "unmatched": 0, "requests_without": 0}
    assert f"server spans: {len(logs)} of {len(logs)} joined" in res.stdout
    # the join request by request, beside the log (which the workers wrote: left as it was)
    timing_lines = read_log(run_dir / "timing.jsonl")
    assert sorted(t["trace_id"] for t in timing_lines) == sorted(r["trace_id"] for r in logs)
    assert all(t["server_queue"] is not None and t["span_ttft"] is not None for t in timing_lines)
    # the report shows where the time went: each part's row, a stacked bar per tail, the join's line
    page = (run_dir / "report.html").read_text()
    assert "id='where-time-went'" in page and f"server spans: {len(logs)} of {len(logs)} joined" in page
    assert page.count("class='tbar'") >= 4 and "title='prefill " in page and "title='decode " in page


def test_spans_alone_give_each_request_its_parts_and_gate_the_run(tmp_path, emulator_factory):
    """A server without the per-request metrics in its stream (vLLM without --enable-per-request-metrics): the
    spans give every request its queue, prefill and decode; an SLO on a part fails the run."""
    port = free_port()
    emu = emulator_factory("--otlp-traces-endpoint", f"http://127.0.0.1:{port}/v1/traces", "--profile",
                           "a100-llama8b", "--max-num-seqs", "1")  # one at a time: the others queue
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", CHAT, "--headless", "-u", "4", "-r", "4", "-t", "4s", "--host", emu.url,
                          "--otlp-receiver", f"127.0.0.1:{port}", "--output-tokens", "32", "--slo",
                          "server_queue.p90<=1ms", "--run-dir", str(run_dir), "--allow-untrustworthy"], tmp_path,
                         timeout=120)
    logs = [r for r in read_log(run_dir / "requests.jsonl") if r["ok"]]
    assert logs and all(r["server_queue"] is None for r in logs)  # nothing in the stream
    summary = _summary(run_dir)
    assert summary["timing"]["spans"]["joined"] == len(logs) == summary["timing"]["requests"]
    assert summary["timing"]["parts"]["server_queue"]["p90"] > 0.01  # four users, one sequence at a time
    assert res.returncode == EXIT_SLO_MISS and "FAIL  server_queue.p90<=1ms" in res.stdout, res.stdout[-3000:]


def test_a_spans_service_name_says_which_replica_served_the_request():
    """vLLM names no replica in its answers (nor does its router); each replica's OTEL_SERVICE_NAME does, in its
    spans: the routing verdict takes it where no response header names one."""
    from vllm_load.metrics.fleet.routing import routing
    spans = parse_export(export_request([_span("a" * 32, "r-1")], "replica-a"))
    spans += parse_export(export_request([_span("b" * 32, "r-2")], "replica-b"))
    spans += parse_export(export_request([_span("c" * 32, "r-3")]))  # OpenTelemetry's default name: no one
    assert [s.get("replica") for s in spans] == ["replica-a", "replica-b", None]
    records = [{"ok": True, "trace_id": t * 32, "response_id": "", "ttft": 0.1, "start": i, "session": "s1",
                "input_tokens": 40, "output_tokens": 4} for i, t in enumerate("abc")]
    join(records, spans)
    verdict = routing(records)
    assert set(verdict["replicas"]) == {"replica-a", "replica-b"} and verdict["session_stickiness"] == 0.0


@pytest.mark.parametrize("value,expected", [
    ("00-" + "AB" * 16 + "-" + "cd" * 8 + "-01", "ab" * 16),
    ("00-" + "zz" * 16 + "-" + "cd" * 8 + "-01", None),  # not hex: not a traceparent
    ("00-" + "ab" * 16 + "-" + "cd" * 7 + "-01", None),  # a short parent id
    ("garbage", None), ("", None)])
def test_one_parser_reads_a_traceparent_for_the_client_and_the_emulator(value, expected):
    from server.emulator.spans import trace_of
    from vllm_load.client.trace_context import trace_id
    assert trace_id({"Traceparent": value}) == trace_of({"HTTP_TRACEPARENT": value}) == expected
