"""Pooling requests (embeddings, rerank) against the embedded emulator: exact input tokens on every request,
inputs per request and inputs/s, a user's own embed/rerank calls through the public API, and the emulator's
400s for bodies vLLM refuses."""

from __future__ import annotations

import json

import pytest

from tests.helpers import ROOT, post_json, run_in_process
from vllm_load.rundir.reqlog import read_log


def _run(tmp_path, locustfile, *args):
    run_dir = tmp_path / "run"
    # by its count: 12 requests, each user's task whole in the RAG locustfile (4 s on a busy host once sent none)
    res = run_in_process(["-f", str(locustfile), "--headless", "-u", "4", "-r", "4", "-t", "60s", "--num-requests", "12",
                          "--run-dir", str(run_dir), *args], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = [r for f in run_dir.glob("requests*.jsonl") for r in read_log(f)]
    return res, logs, json.loads((run_dir / "summary.json").read_text())["summary"]


@pytest.mark.parametrize("api,batch,texts", [("embeddings", 3, 3), ("rerank", 4, 5)])
def test_pooling_locustfiles_send_exact_unique_inputs(tmp_path, api, batch, texts):
    res, logs, s = _run(tmp_path, ROOT / "locustfiles" / f"{api}.py", "--batch-size", str(batch),
                        "--input-tokens", "40")
    assert len(logs) >= 8 and all(r["ok"] and r["api"] == api for r in logs)
    # every input is 40 tokens as the server counted it (rerank: the query and each document)
    assert all(r["tokens_from_usage"] and r["input_tokens"] == r["input_tokens_asked"] == 40 * texts for r in logs)
    # the prompts the server ran: a bi-encoder's rerank embeds the query and each document (it counted the
    # documents only, 4 where the server ran 5)
    assert all(r["items"] == texts and r["ttft"] is None and r["output_tokens"] is None for r in logs)
    assert s["inputs"] == texts * len(logs) and s["input_drift_requests"] == 0
    assert s["input_rate"] == pytest.approx(s["inputs"] / s["duration_s"])
    assert f"pooling: {texts * len(logs)} inputs" in res.stdout
    result = json.loads((tmp_path / "run" / "vllm-result.json").read_text())  # as vllm bench serve's pooling result
    assert result["total_input_sequences"] == s["inputs"] and "mean_ttft_ms" not in result
    assert result["input_sequence_throughput"] == pytest.approx(s["input_rate"]) and "median_e2el_ms" in result
    assert "TTFT" not in res.stdout and "Output tokens" not in res.stdout and "tokens per text" in res.stdout


def test_a_users_own_embed_and_rerank_calls(tmp_path):
    res, logs, s = _run(tmp_path, ROOT / "tests" / "locustfiles" / "pooling.py")
    by_name = {n: [r for r in logs if r["name"] == n] for n in ("embed", "rerank", "score")}
    assert all(by_name.values()) and all(r["ok"] for r in logs), [r["error"] for r in logs][:3]
    # the prompts a bi-encoder runs: the query and each passage
    assert all(r["input_tokens"] == r["input_tokens_asked"] and r["items"] == 3 + 1 for r in by_name["score"])
    assert all(r["input_tokens"] == r["input_tokens_asked"] and r["items"] == 5 for r in by_name["embed"])
    assert all(r["input_tokens"] == r["input_tokens_asked"] and r["items"] == 4 + 1 for r in by_name["rerank"])
    assert set(s["names"]) == {"embed", "rerank", "score"}
    assert "Traceback" not in res.stderr, res.stderr[-3000:]


def test_the_emulator_refuses_what_vllm_refuses(emulator_factory):
    emu = emulator_factory()

    def post(path, body):
        return post_json(emu.url + path, body)

    assert post("/v1/embeddings", {"input": []})[0] == 400
    assert post("/v1/rerank", {"query": "", "documents": ["a"]})[0] == 400
    assert post("/v1/embeddings", {"model": "nope", "input": "a"})[0] == 404
    status, body = post("/v1/embeddings", {"input": ["same", "same", "other"]})
    vectors = [d["embedding"] for d in body["data"]]
    assert status == 200 and vectors[0] == vectors[1] != vectors[2] and body["usage"]["completion_tokens"] == 0
    status, body = post("/rerank", {"query": "q", "documents": ["a", "b", "c"], "top_n": 1})
    assert status == 200 and len(body["results"]) == 1 and set(body["usage"]) == {"prompt_tokens", "total_tokens"}
