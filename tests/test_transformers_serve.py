"""Any OpenAI server, against a real one that is not vLLM: `transformers serve` (Hugging Face transformers 5.x, CPU)
serving the fixture's tiny Llama, and the seed comparison this project began with: the same model under vLLM and
under a plain transformers backend (with and without its continuous batching), the same load, `vllm-load compare`.

`transformers serve` ends a stream after the chunk that carries finish_reason and usage (no `data: [DONE]`),
says owned_by "local" and refuses vLLM's body fields: every request failed before ("stream ended before [DONE]")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REAL_VLLM_DIR, ROOT, free_port, one_server_starting, run_locust, serve_real_vllm
from vllm_load.rundir.reqlog import read_log

TRANSFORMERS_DIR = os.environ.get("VLLM_LOAD_TRANSFORMERS_DIR", "")
SCRIPT = ROOT / "tests" / "real_servers" / "transformers-serve.sh"
CHAT = str(ROOT / "locustfiles" / "chat.py")

pytestmark = pytest.mark.skipif(not (TRANSFORMERS_DIR and REAL_VLLM_DIR),
                                reason="no transformers serve or tiny model installed (.ci/run installs them)")


def _serve(*flags: str):
    env = dict(os.environ, T=TRANSFORMERS_DIR, PORT=str(free_port()))
    model = os.path.join(REAL_VLLM_DIR, "tiny")
    with one_server_starting():
        started = subprocess.run(["bash", str(SCRIPT), "serve", model, *flags], env=env, capture_output=True,
                                 text=True, timeout=300)
    try:
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
        yield f"http://127.0.0.1:{env['PORT']}", model
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def transformers_serve():
    yield from _serve()


@pytest.fixture(scope="module")
def transformers_serve_batching():
    yield from _serve("--continuous-batching")


def _chat(tmp_path, name, url, tokenizer, requests=8, users="2"):
    """A run ended by its count (a 10 s run of transformers serve with batching once completed nothing on a busy
    host): what the tests compare are its counts and rates, over whatever time they took."""
    run_dir = tmp_path / name
    res = run_locust(["-f", CHAT, "--headless", "-u", users, "-r", users, "-t", "240s", "--num-requests",
                      str(requests), "--host", url, "--tokenizer",
                      tokenizer, "--input-tokens", "32", "--output-tokens", "16", "--run-dir", str(run_dir),
                      # the servers and the client share 2 cores: what is checked is counts, not the client's timing
                      "--allow-untrustworthy"], tmp_path, timeout=300)
    return res, run_dir


def test_a_chat_run_against_transformers_serve_is_whole_and_exact(tmp_path, transformers_serve):
    url, model = transformers_serve
    res, run_dir = _chat(tmp_path, "run", url, model, requests=12)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "the server is not vLLM (/v1/models owned_by 'local'" in res.stdout
    logs = read_log(run_dir / "requests.jsonl")
    assert len(logs) >= 10 and all(r["ok"] for r in logs), [r["error"] for r in logs if not r["ok"]][:3]
    # input exact (the chat template counted here equals the server's usage), output as the server reports it
    assert all(r["tokens_from_usage"] and r["input_tokens"] == r["input_tokens_asked"] == 32 for r in logs)
    assert all(1 <= r["output_tokens"] <= 16 and r["finish_reason"] in ("length", "stop") for r in logs)
    # its one usage, in the last choice's chunk, is the total, not one chunk carrying every token
    assert all(max(r["chunk_tokens"]) == 1 for r in logs if r["chunk_tokens"])
    s = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert s["failed"] == 0 and s["input_drift_requests"] == 0 and s["one_token_chunks"] == len(logs)


def test_the_seed_comparison_vllm_against_transformers_with_and_without_batching(
        tmp_path, transformers_serve, transformers_serve_batching):
    """The recipe in docs/any-openai-server.md, as it is run: three runs of the same load, then compare."""
    url, model = transformers_serve
    with_batching, _ = transformers_serve_batching
    vllm = serve_real_vllm("tiny", "tiny")
    vllm_url, _ = next(vllm)
    try:
        runs = {}
        for name, target in (("vllm", vllm_url), ("transformers", url), ("transformers-cb", with_batching)):
            res, runs[name] = _chat(tmp_path, name, target, model, requests=16, users="4")
            assert res.returncode == 0, (name, res.stdout[-2000:], res.stderr[-2000:])
    finally:
        vllm.close()
    for other in ("transformers", "transformers-cb"):
        out = subprocess.run([str(Path(sys.executable).parent / "vllm-load"), "compare",
                              str(runs["vllm"]), str(runs[other])], capture_output=True, text=True, timeout=120,
                             cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
        lines = out.stdout.splitlines()
        assert lines[1].startswith("  A: vLLM ") and "OpenAI-compatible server (owned_by 'local')" in lines[2]
        assert lines[3].startswith("  conclusion: B served ") and lines[4].startswith("  throughput: request rate")
        assert "(B/A " in lines[4], lines[4]
