"""The Responses API (/v1/responses): its event stream read like a chat stream (TTFT, TTFO, every gap, the
usage of response.completed), against vLLM 0.32's recorded shapes and the embedded emulator."""

from __future__ import annotations

import json

import orjson
import pytest

from tests.helpers import ROOT, run_in_process, stream_fault
from vllm_load.client.apis.responses import ResponsesState
from vllm_load.rundir.reqlog import read_log


def events(*pairs: tuple[str, dict]) -> list[bytes]:
    out = []
    for n, (kind, data) in enumerate(pairs):
        out += [b"event: " + kind.encode(), b"data: " + orjson.dumps({**data, "sequence_number": n, "type": kind}), b""]
    return out


USAGE = {"input_tokens": 8, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
         "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0},
         "total_tokens": 11}
# vLLM 0.32's event order, trimmed (tests/../shared notes: a reasoning parser's item, then the message)
STREAM = events(
    ("response.created", {"response": {"id": "resp_1", "status": "in_progress", "usage": None}}),
    ("response.in_progress", {"response": {"id": "resp_1", "status": "in_progress", "usage": None}}),
    ("response.output_item.added", {"item": {"id": "rs_1", "type": "reasoning"}, "output_index": 0}),
    ("response.reasoning_text.delta", {"delta": " running", "item_id": "rs_1"}),
    ("response.reasoning_text.done", {"text": " running", "item_id": "rs_1"}),
    ("response.output_item.added", {"item": {"id": "msg_1", "type": "message"}, "output_index": 1}),
    ("response.output_text.delta", {"delta": "ish", "item_id": "msg_1"}),
    ("response.output_text.delta", {"delta": " dst", "item_id": "msg_1"}),
    ("response.output_text.done", {"text": "ish dst", "item_id": "msg_1"}),
    ("response.completed", {"response": {"id": "resp_1", "status": "incomplete", "usage": USAGE,
                                         "incomplete_details": {"reason": "max_output_tokens"}}}),
)


def test_a_responses_stream_is_read_like_a_chat_stream():
    st = ResponsesState()
    for t, line in enumerate(STREAM):
        st.feed(line, 0.01 * t)
    assert st.done and st.incomplete() is None and st.response_id == "resp_1"
    assert (st.prompt_tokens, st.completion_tokens, st.finish_reason) == (8, 3, "length")
    assert st.content == "ish dst" and "".join(st.reasoning_parts) == " running"
    assert st.chunk_tokens == [1, 1, 1] and st.chunk_times[0] < st.answer_at == st.chunk_times[1]
    assert (st.reasoning_streamed, st.reasoning_reported) == (1, 0)


def test_a_hostile_responses_usage_is_no_usage_as_chats_is():
    """The Responses API's usage went through int() (a server's 10^30, -5 or "9" taken as a count, or a crash):
    it goes through chat's guard (``sse.usage_count``): no count, and the run counts the tokens itself."""
    hostile = {"input_tokens": 1e30, "output_tokens": -5, "input_tokens_details": {"cached_tokens": "9"},
               "output_tokens_details": {"reasoning_tokens": 1.5}}
    st = ResponsesState()
    for t, line in enumerate(STREAM[:-3] + events(("response.completed", {"response": {
            "id": "resp_1", "status": "completed", "usage": hostile}}))):
        st.feed(line, 0.01 * t)
    assert st.done and (st.prompt_tokens, st.completion_tokens) == (None, None)
    assert st.cached_tokens in (None, 0) and st.reasoning_reported is None


@pytest.mark.parametrize("lines,reason", [
    (STREAM[:-3], "stream ended before response.completed after 3 tokens"),
    (events(("error", {"error": {"message": "engine dead"}})), "error in stream: engine dead"),
    (events(("response.failed", {"response": {"error": {"message": "bad"}}})), "error in stream: bad"),
    ([b"garbage"], "malformed SSE line"),
])
def test_a_broken_responses_stream_says_why(lines, reason):
    got = stream_fault(ResponsesState(), lines)
    assert got is not None and got.startswith(reason), got


def test_responses_locustfile_against_the_emulator(tmp_path):
    # counts, not times (the reasoning gap's timing is tests/test_reasoning.py's subject): beside the others of -n
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/responses.py"), "--headless", "-u", "2", "-r", "2", "-t", "60s",
                          "--num-requests", "6", "--emulator-ttft", "0.04", "--emulator-itl", "0.01",
                          "--emulator-reasoning-tokens", "6", "--input-tokens", "100", "--output-tokens", "20",
                          "--run-dir", str(run_dir)], cwd=tmp_path, emulator_process=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = read_log(run_dir / "requests.jsonl")
    assert len(logs) == 6 and all(r["ok"] and r["api"] == "responses" for r in logs)
    for r in logs:  # exact input (the template and the BOS vLLM adds to a Responses input), exact output
        assert r["tokens_from_usage"] and r["input_tokens"] == r["input_tokens_asked"] == 100 and r["output_tokens"] == 20
        assert r["reasoning_tokens"] == 6 and r["ttfo"] >= r["ttft"]
        assert len(r["chunk_offsets"]) == 20 and r["finish_reason"] == "length"
    s = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert s["input_drift_requests"] == 0 and s["output_mismatch"] == 0


def test_a_users_own_respond_calls(tmp_path):
    run_dir = tmp_path / "run"
    # each user's task sends a string input, then the two-turn input: four requests, two of each (a 3 s run on a
    # busy host once finished only the first kind)
    res = run_in_process(["-f", str(ROOT / "tests/locustfiles/respond.py"), "--headless", "-u", "2", "-r", "2", "-t",
                          "60s", "--num-requests", "4", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = read_log(run_dir / "requests.jsonl")
    names = {r["name"] for r in logs}
    assert names == {"string input", "messages"} and all(r["ok"] for r in logs), [r["error"] for r in logs][:3]
    assert all(r["input_tokens"] == r["input_tokens_asked"] for r in logs)
    assert all(r["output_tokens"] == (8 if r["name"] == "string input" else 12) for r in logs)
