"""--otlp-endpoint: the run's metrics over OpenTelemetry, received by a collector started here (an OTLP/HTTP
endpoint that decodes what it gets), with the summary's counts; the token never reaches a file."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from tests.helpers import ROOT, run_in_process


def test_a_collector_receives_the_ttft_histogram_with_the_summarys_count(tmp_path):
    got: list[tuple[str, dict, bytes]] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.append((self.path, dict(self.headers), body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        run_dir = tmp_path / "run"
        res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "3s",
                              "--output-tokens", "8", "--otlp-endpoint", f"http://127.0.0.1:{server.server_port}",
                              "--otlp-token", "otel-secret-1", "--run-dir", str(run_dir)], cwd=tmp_path)
    finally:
        server.shutdown()
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert len(got) == 1
    path, headers, body = got[0]
    assert path == "/v1/metrics" and headers["Content-Type"] == "application/x-protobuf"
    assert headers["Authorization"] == "Bearer otel-secret-1"
    request = ExportMetricsServiceRequest.FromString(body)
    metrics = {m.name: m for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    ttft = metrics["vllm_load:time_to_first_token_seconds"].histogram.data_points[0]
    assert ttft.count == summary["metrics"]["ttft"]["count"] > 0 and sum(ttft.bucket_counts) == ttft.count
    assert abs(ttft.sum / ttft.count - summary["metrics"]["ttft"]["mean"]) < 1e-9
    assert list(ttft.explicit_bounds)[:3] == [0.001, 0.005, 0.01]  # vLLM's buckets, as the Prometheus export
    ok = {p.attributes[0].value.string_value: p.as_int for p in metrics["vllm_load:requests"].sum.data_points}
    assert ok == {"ok": summary["succeeded"], "failed": summary["failed"]}
    resource = {a.key: a.value.string_value for a in request.resource_metrics[0].resource.attributes}
    assert resource["service.name"] == "vllm-load" and resource["vllm_load.target"] == "emulator"
    assert "metrics sent over OTLP" in res.stdout
    assert not any("otel-secret-1" in f.read_text(errors="replace") for f in run_dir.rglob("*") if f.is_file())


def test_an_unreachable_collector_is_said_and_the_run_keeps_its_verdict(tmp_path):
    from tests.helpers import free_port

    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "1", "-r", "1", "-t", "2s",
                          "--output-tokens", "4", "--otlp-endpoint", f"http://127.0.0.1:{free_port()}",
                          "--run-dir", str(tmp_path / "run")], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "the metrics did not go over OTLP: the OTLP endpoint" in res.stderr
