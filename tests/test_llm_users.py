"""Programmable LLM users: locustfiles written against the public API (``LLMUser``, ``self.llm``), per-name
metrics merged exactly across workers, conversations that the prefix cache sees, tool calls, user errors."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlparse

import orjson
import pytest

from tests.helpers import ROOT, run_in_process
from tests.test_e2e import load_run
from vllm_load.client.sse import StreamState
from vllm_load.metrics.histogram import Histogram

HERE = ROOT / "tests" / "locustfiles"
BLOCK = 16  # the emulator's --block-size


def _by_name(logs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in logs:
        out.setdefault(r["name"], []).append(r)
    return out


def test_conversations_from_the_public_api_per_turn_across_two_workers(emulator_factory, tmp_path):
    emu = emulator_factory("--ttft", "0.02", "--itl", "0.004", "--enable-prompt-tokens-details")
    run_dir = tmp_path / "run"
    # ended by its count: 9 requests a worker, one conversation of 3 turns for each of its 3 users (6 s on a busy
    # host once ended 0.2 s after two in-process workers were ready, with first turns only)
    res = run_in_process(["-f", str(HERE / "conversation.py"), "--headless", "-u", "6", "-r", "6", "-t", "60s",
                          "--num-requests", "18", "--processes", "2", "--host", emu.url, "--turns", "3",
                          "--input-tokens", "100",
                          "--turn-input-tokens", "30", "--run-dir", str(run_dir),
                          "--slo", "ttft[turn 3].p99<=5s", "--slo", "error_rate[turn 1]<=0%"], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    stats, logs = load_run(run_dir)
    s = stats["summary"]
    assert len({r["worker"] for r in logs}) == 2
    groups = _by_name(logs)
    assert set(groups) == set(s["names"]) == {"turn 1", "turn 2", "turn 3"}
    # one row per name, merged exactly: counts and histograms equal what the per-request logs hold
    assert s["requests"] == len(logs) == sum(n["requests"] for n in s["names"].values())
    for name, recs in groups.items():
        named = s["names"][name]
        assert named["requests"] == len(recs) and named["failed"] == 0
        ttft = Histogram()
        for r in recs:
            ttft.record(r["ttft"])
        assert named["metrics"]["ttft"]["count"] == ttft.count
        for p in ("p50", "p99"):
            assert named["metrics"]["ttft"][p] == pytest.approx(ttft.percentile(float(p[1:])), rel=1e-3)
        assert named["input_tokens"] == sum(r["input_tokens"] for r in recs)
    # every turn's input tokens were counted before sending, the whole history under the chat template
    assert all(r["tokens_from_usage"] and r["input_tokens"] == r["input_tokens_asked"] for r in logs)
    inputs = {name: {r["input_tokens"] for r in recs} for name, recs in groups.items()}
    assert all(len(v) == 1 for v in inputs.values()), inputs  # fixed lengths: one prompt size per turn
    n1, n2, n3 = (inputs[f"turn {k}"].pop() for k in (1, 2, 3))
    assert n1 < n2 < n3
    # the emulator's prefix cache: nothing on the first turn (unique text), the history on the later ones
    assert all(r["cached_tokens"] == 0 for r in groups["turn 1"])
    for prev, name, n in ((n1, "turn 2", n2), (n2, "turn 3", n3)):
        history = prev + 12  # the previous prompt and its answer
        for r in groups[name]:
            assert history // BLOCK * BLOCK - BLOCK <= r["cached_tokens"] < n, (name, r["cached_tokens"], history, n)
    verdict = json.loads((run_dir / "summary.json").read_text())
    assert [c["passed"] for c in verdict["slo"]] == [True, True]
    assert "turn 3" in (run_dir / "summary.md").read_text()
    report = (run_dir / "report.html").read_text()
    assert "id='by-name'" in report and "turn 2" in report


def test_open_loop_conversations_count_the_first_turn_from_its_arrival(emulator_factory, tmp_path):
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002")
    run_dir = tmp_path / "run"
    # ended by its count (4 s on a busy host once sent no second turn); one conversation in flight per user, so
    # second turns end among the first 20 whatever the host's pace (a starved one once ended 20 first turns, each
    # ~3 s, before any second turn, its arrivals piling up at 4/s)
    res = run_in_process(["-f", str(HERE / "conversation.py"), "--headless", "-u", "2", "-r", "2", "-t", "60s",
                          "--num-requests", "20", "--host", emu.url, "--turns", "2", "--request-rate", "4",
                          "--max-concurrency", "1",
                          "--run-dir", str(run_dir),
                          # near-regular arrivals (gamma shape 50: 14 % spread), so the count does not ride on
                          # Poisson luck: CI once drew 6 arrivals where 16 were due
                          "--burstiness", "50", "--seed", "11"],
                         cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    _, logs = load_run(run_dir)
    groups = _by_name(logs)
    assert len(groups["turn 1"]) >= 10 and len(groups.get("turn 2", [])) >= len(groups["turn 1"]) - 2, groups.keys()
    assert all(r["send_lag"] is not None for r in groups["turn 1"])  # timed from the arrival's intended start
    assert all(r["send_lag"] is None for r in groups["turn 2"])  # a later turn: from its own send


def test_the_emulator_streams_tool_calls_in_vllm_chunks_and_the_parser_assembles_them(emulator_factory):
    emu = emulator_factory()
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    body = {"model": "emulator/mistral-7b-v0.1", "stream": True, "tools": tools, "tool_choice": "required",
            "messages": [{"role": "user", "content": "find the weather"}],
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    url = urlparse(emu.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.request("POST", "/v1/chat/completions", orjson.dumps(body), {"Content-Type": "application/json"})
    raw = conn.getresponse().read()
    state = StreamState()
    for i, line in enumerate(raw.split(b"\n")):
        state.feed(line + b"\n", float(i))
    assert state.done and state.finish_reason == "tool_calls"
    (call,) = state.calls
    assert call["function"]["name"] == "lookup" and len(call["id"]) == 9 and call["id"].isalnum()
    assert isinstance(json.loads(call["function"]["arguments"]), dict)
    assert sum(state.chunk_tokens) == state.completion_tokens == 16  # each argument piece is a timed token


def test_a_tool_call_loop_completes_its_rounds(emulator_factory, tmp_path):
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002")
    run_dir = tmp_path / "run"
    # by its count: one user's tasks, two tool calls and the answer each, so 6 requests are two whole rounds (4 s on
    # a busy host once ended inside one; two users' 6 once held one answer, the other user a round behind)
    res = run_in_process(["-f", str(ROOT / "locustfiles" / "agent.py"), "--headless", "-u", "1", "-r", "1", "-t", "60s",
                          "--num-requests", "6",
                          "--host", emu.url, "--tool-rounds", "2", "--tool-result-tokens", "40", "--output-tokens", "8",
                          "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    stats, logs = load_run(run_dir)
    groups = _by_name(logs)
    assert set(groups) == {"tool call 1", "tool call 2", "answer"}
    assert all(r["finish_reason"] == "tool_calls" for n in ("tool call 1", "tool call 2") for r in groups[n])
    assert all(r["finish_reason"] == "length" and r["output_tokens"] == 8 for r in groups["answer"])
    # the history with the calls and their results was counted exactly before each request
    assert all(r["input_tokens"] == r["input_tokens_asked"] for r in logs)
    assert [len(groups[n]) for n in ("tool call 1", "tool call 2", "answer")] == [2, 2, 2]
    assert stats["summary"]["failed"] == 0


@pytest.mark.parametrize("rate", ["0", "6"])
def test_a_task_that_raises_is_reported_by_locust_and_leaves_the_llm_stats_whole(emulator_factory, tmp_path, rate):
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002")
    run_dir = tmp_path / "run"
    # ended by its count (3 s on a busy host once completed none: the users' own prompts are counted in a helper
    # thread at low priority)
    res = run_in_process(["-f", str(HERE / "raising.py"), "--headless", "-u", "3", "-r", "3", "-t", "60s",
                          "--num-requests", "6", "--host", emu.url, "--request-rate", rate, "--burstiness", "50",
                          "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-3000:]  # Locust's rule: user errors fail the run
    assert "boom in the user's own task" in res.stderr
    stats, logs = load_run(run_dir)
    s = stats["summary"]
    assert len(logs) == 6 and s["requests"] == len(logs) and s["failed"] == 0
    assert s["names"]["asked"]["requests"] == len(logs)
    assert all(r["ok"] and r["input_tokens"] == r["input_tokens_asked"] for r in logs)


def test_a_locustfile_refuses_its_own_bad_options_with_one_line(tmp_path):
    res = run_in_process(["-f", str(ROOT / "locustfiles" / "multiturn.py"), "--headless", "-u", "1", "-t", "2s",
                          "--turns", "0", "--run-dir", str(tmp_path / "run")], cwd=tmp_path, timeout=90)
    assert res.returncode == 2, res.stderr[-2000:]
    errors = [line for line in res.stderr.splitlines() if line.startswith("vllm-load: error:")]
    assert len(errors) == 1 and "--turns 0" in errors[0], res.stderr[-2000:]


def test_multiturn_replays_every_user_turn_of_a_sharegpt_conversation(emulator_factory, tmp_path):
    convs = [{"conversations": [
        {"from": "human", "value": f"first question of conversation {c} about caching"},
        {"from": "gpt", "value": "an answer from the file that is not sent"},
        {"from": "human", "value": f"second question of conversation {c}"},
        {"from": "gpt", "value": "another answer"},
        {"from": "human", "value": f"third question of conversation {c}"},
    ]} for c in ("alpha", "beta")]
    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps(convs))
    sent = tmp_path / "sent.jsonl"
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002", "--request-log", str(sent))
    res = run_in_process(["-f", str(ROOT / "locustfiles" / "multiturn.py"), "--headless", "-u", "2", "-r", "2", "-t", "60s",
                          "--num-requests", "6",  # each user's conversation, whole (3 s did not finish one, once)
                          "--host", emu.url, "--dataset", str(data), "--turns", "3", "--output-tokens", "6",
                          "--run-dir", str(tmp_path / "run")], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    bodies = [json.loads(line)["body"] for line in sent.read_text().splitlines()]
    third = [b["messages"] for b in bodies if len(b["messages"]) == 5]
    assert third
    for msgs in third:
        users = [m["content"] for m in msgs if m["role"] == "user"]
        # which conversation: from its later turns, sent verbatim (the first turn's unique digest words are
        # drawn from the tokenizer's vocabulary and once included "alpha" in a beta conversation)
        conv = "alpha" if "alpha" in users[1] else "beta"
        # the first turn behind the run's unique digest words, the later ones as the file has them
        assert users[0].endswith(f"\nfirst question of conversation {conv} about caching")
        assert users[1:] == [f"second question of conversation {conv}", f"third question of conversation {conv}"]
        assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant", "user"]
        assert "from the file" not in json.dumps(msgs)  # assistant turns are the live replies
    _, logs = load_run(tmp_path / "run")
    assert {r["name"] for r in logs} == {"turn 1", "turn 2", "turn 3"}


def test_the_public_api_refuses_bad_arguments_at_the_call_and_sends_nothing(emulator_factory, tmp_path):
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002", "--max-model-len", "4096")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(HERE / "misuse.py"), "--headless", "-u", "1", "-r", "1", "-t", "20s",
                          "--host", emu.url, "--run-dir", str(run_dir)], cwd=tmp_path)
    said = [line for line in res.stdout.splitlines() if line.startswith("MISUSE ")]
    assert said[:3] == ["MISUSE TypeError: self.llm.chat(messages): messages must be a non-empty list of "
                        "{'role': ..., 'content': ...} dicts, got str",
                        "MISUSE TypeError: self.llm.chat(messages): messages must be a non-empty list of "
                        "{'role': ..., 'content': ...} dicts, got dict",
                        "MISUSE TypeError: self.llm.chat(messages): messages[0] must be a dict with 'role' and "
                        "'content', got keys ['content']"], res.stdout[-3000:] + res.stderr[-2000:]
    assert "max_tokens=0): give a positive int" in said[3] and "max_tokens=-3)" in said[4]
    assert "exceeds the served model's context of 4096 tokens" in said[5]
    assert said[6] == "MISUSE TypeError: self.llm.complete(prompt): the prompt must be a str, got list"
    _stats, logs = load_run(run_dir)
    assert [r["name"] for r in logs] == ["fine"]  # nothing of the misuse reached the server


def test_a_run_with_requests_only_through_self_client_says_so(emulator_factory, tmp_path):
    emu = emulator_factory()
    res = run_in_process(["-f", str(HERE / "client_only.py"), "--headless", "-u", "1", "-r", "1", "-t", "2s",
                          "--host", emu.url, "--run-dir", str(tmp_path / "run")], cwd=tmp_path)
    assert res.returncode == 4, res.stdout[-2000:]  # measured nothing LLM-timed: invalid
    assert "no self.llm request completed; the " in res.stdout and "went through self.client" in res.stdout


def test_the_in_process_testing_example_in_the_docs_runs_as_written(tmp_path, monkeypatch):
    """docs/testing.md's example, taken from the page and run (from the checkout, where its locustfile path is)."""
    import re

    text = (ROOT / "docs" / "testing.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    space: dict = {}
    exec(compile(code, "docs/testing.md", "exec"), space)  # noqa: S102 (the page's own code)
    monkeypatch.chdir(ROOT)
    space["test_my_conversation_sends_three_turns"](tmp_path)
