"""Anthropic's Messages API (/v1/messages, as vLLM 0.32 serves it): its event stream read like a chat stream
(TTFT, TTFO from a thinking block, every gap, the usage of message_delta), the emulator serving it, and the
workload and a user's own calls counted exactly."""

from __future__ import annotations

import json

import orjson
import pytest

from tests.helpers import ROOT, run_in_process, stream_fault
from vllm_load.client.apis.messages import MessagesState, messages_request
from vllm_load.rundir.reqlog import read_log


def events(*pairs: tuple[str, dict]) -> list[bytes]:
    out = []
    for kind, data in pairs:
        out += [b"event: " + kind.encode(), b"data: " + orjson.dumps({"type": kind, **data}), b""]
    return out


# vLLM 0.32's event order for a reasoning model (vllm/entrypoints/anthropic/serving.py, message_stream_converter):
# the first chunk's usage in message_start, a thinking block closed by its signature, the text block, the final usage
STREAM = events(
    ("message_start", {"message": {"id": "chatcmpl-1", "type": "message", "role": "assistant", "content": [],
                                   "model": "tiny", "stop_reason": None, "stop_sequence": None,
                                   "usage": {"input_tokens": 6, "output_tokens": 0, "cache_read_input_tokens": 2}}}),
    ("content_block_start", {"index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
    ("content_block_delta", {"index": 0, "delta": {"type": "thinking_delta", "thinking": " running"}}),
    ("content_block_delta", {"index": 0, "delta": {"type": "signature_delta", "signature": "ab12"}}),
    ("content_block_stop", {"index": 0}),
    ("content_block_start", {"index": 1, "content_block": {"type": "text", "text": ""}}),
    ("content_block_delta", {"index": 1, "delta": {"type": "text_delta", "text": "ish"}}),
    ("content_block_delta", {"index": 1, "delta": {"type": "text_delta", "text": " dst"}}),
    ("content_block_stop", {"index": 1}),
    ("message_delta", {"delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                       "usage": {"input_tokens": 6, "output_tokens": 3, "cache_read_input_tokens": 2}}),
    ("message_stop", {}),
)


def test_a_messages_stream_is_read_like_a_chat_stream():
    st = MessagesState()
    for t, line in enumerate(STREAM):
        st.feed(line, 0.01 * t)
    assert st.done and st.incomplete() is None and st.response_id == "chatcmpl-1"
    # Anthropic's input_tokens leaves the cached tokens out: the prompt is their sum
    assert (st.prompt_tokens, st.cached_tokens, st.completion_tokens, st.finish_reason) == (8, 2, 3, "length")
    assert st.content == "ish dst" and "".join(st.reasoning_parts) == " running"
    assert st.chunk_tokens == [1, 1, 1] and st.chunk_times[0] < st.answer_at == st.chunk_times[1]
    assert st.reasoning_streamed == 1


def test_a_tool_use_block_is_a_call_and_ends_the_thinking():
    st = MessagesState()
    for t, line in enumerate(events(
            ("content_block_start", {"index": 0, "content_block": {"type": "tool_use", "id": "t1", "name": "f",
                                                                   "input": {}}}),
            ("content_block_delta", {"index": 0, "delta": {"type": "input_json_delta", "partial_json": '{"a":'}}),
            ("content_block_delta", {"index": 0, "delta": {"type": "input_json_delta", "partial_json": " 1}"}}),
            ("message_delta", {"delta": {"stop_reason": "tool_use"}, "usage": {"input_tokens": 5, "output_tokens": 2}}),
            ("message_stop", {}))):
        st.feed(line, 0.01 * t)
    assert st.calls == [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]
    assert st.answer_at == st.chunk_times[0] and st.finish_reason == "tool_calls" and st.streamed == 2


@pytest.mark.parametrize("lines,reason", [
    (STREAM[:-12], "stream ended before message_stop after 2 tokens"),
    (events(("error", {"error": {"type": "internal_error", "message": "engine dead"}})), "error in stream: engine dead"),
    (events(("content_block_delta", {"index": 3, "delta": {"type": "input_json_delta", "partial_json": "{"}})),
     "input_json_delta for block 3"),
    (STREAM + events(("message_stop", {})), "data after message_stop"),
    ([b"garbage"], "malformed SSE line"),
])
def test_a_broken_messages_stream_says_why(lines, reason):
    got = stream_fault(MessagesState(), lines)
    assert got is not None and got.startswith(reason), got


def test_the_request_puts_the_system_prompt_in_system_and_never_forces_the_length():
    ready = messages_request("m", [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}], 9, 16)
    body = orjson.loads(ready.body)
    assert body["system"] == "sys" and body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["max_tokens"] == 16 and body["stream"] is True and "ignore_eos" not in body
    assert (ready.path, ready.input_tokens, ready.output_tokens, ready.max_tokens) == ("/v1/messages", 9, None, 16)


def test_messages_locustfile_against_the_emulator(tmp_path):
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/messages.py"), "--headless", "-u", "2", "-r", "2", "-t", "60s",
                          "--num-requests", "6", "--emulator-reasoning-tokens", "4", "--input-tokens", "100",
                          "--output-tokens", "20", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = read_log(run_dir / "requests.jsonl")
    assert len(logs) == 6 and all(r["ok"] and r["api"] == "messages" for r in logs), [r["error"] for r in logs][:3]
    for r in logs:  # exact input (the system prompt in ``system`` counts as chat's system message), whole output
        assert r["tokens_from_usage"] and r["input_tokens"] == r["input_tokens_asked"] == 100
        assert r["output_tokens"] == 20 and len(r["chunk_offsets"]) == 20 and r["reasoning_tokens"] == 4
        assert r["finish_reason"] == "length" and r["ttfo"] > r["ttft"]
    s = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert s["input_drift_requests"] == 0 and s["output_mismatch"] == 0


def test_a_users_own_messages_calls_are_counted_as_the_server_counts(tmp_path):
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "tests/locustfiles/anthropic.py"), "--headless", "-u", "2", "-r", "2",
                          "-t", "60s", "--num-requests", "4", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = read_log(run_dir / "requests.jsonl")
    assert {r["name"] for r in logs} == {"one turn", "two turns"} and all(r["ok"] for r in logs), \
        [r["error"] for r in logs][:3]
    assert all(r["input_tokens"] == r["input_tokens_asked"] for r in logs)
    assert all(r["output_tokens"] == (8 if r["name"] == "one turn" else 12) for r in logs)


def test_the_emulator_counts_and_answers_messages_as_vllm(emulator_factory):
    """count_tokens is the converted chat request's count; a whole answer has Anthropic's shape; a bad body is 400."""
    from tests.helpers import post_json

    emu = emulator_factory("--reasoning-tokens", "2")

    def post(path, body):
        return post_json(emu.url + path, body)

    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    status, whole = post("/v1/chat/completions", {"messages": chat, "max_tokens": 3})
    assert status == 200
    status, counted = post("/v1/messages/count_tokens", {"model": whole["model"], "system": "be brief",
                                                         "messages": chat[1:]})
    assert status == 200 and counted == {"input_tokens": whole["usage"]["prompt_tokens"]}
    status, answer = post("/v1/messages", {"system": [{"type": "text", "text": "be brief"}], "messages": chat[1:],
                                           "max_tokens": 5})
    assert status == 200 and answer["type"] == "message" and answer["stop_reason"] == "max_tokens"
    assert [b["type"] for b in answer["content"]] == ["thinking", "text"]
    assert answer["usage"]["input_tokens"] + answer["usage"]["cache_read_input_tokens"] == counted["input_tokens"]
    assert answer["usage"]["output_tokens"] == 5
    assert post("/v1/messages", {"messages": chat[1:]})[0] == 400  # max_tokens is required
    assert post("/v1/messages", {"messages": [], "max_tokens": 3})[0] == 400
