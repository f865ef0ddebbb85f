"""The stream parsers fuzzed by Hypothesis (bounded, derandomized: the same examples on every machine): chunks
built from vLLM's shapes with any value in any field (huge, negative and fractional counts, strings where numbers
go, nulls, nesting, any unicode), and lines cut or corrupted at any byte. Whatever a server sends, the Python parser
raises nothing but ``StreamError`` (a parser's crash was a Generator greenlet's: issue 72), keeps no usage count no
server could mean, and the native parser (``_sse.c``) ends exactly where Python does."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_sse_native import by_native, by_python, stamped
from vllm_load.client import native
from vllm_load.client.sse import MAX_USAGE_TOKENS

pytestmark = pytest.mark.skipif(not native.built(), reason="the native reader is not built (its own test fails then)")

#: any JSON scalar a hostile server could put where a count or a text goes
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10 ** 40), max_value=10 ** 40),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12))
COUNT = st.one_of(st.integers(min_value=0, max_value=4096), SCALARS)
TEXT = st.one_of(st.text(max_size=24), SCALARS)


@st.composite
def chunk(draw: st.DrawFn) -> bytes:
    """One SSE line in vLLM's shapes, each field's value drawn from what a broken or hostile server could send."""
    kind = draw(st.sampled_from(["content", "reasoning", "text", "tool", "usage", "error", "done", "junk"]))
    if kind == "done":
        return b"data: [DONE]\n"
    if kind == "junk":
        return b"data: " + draw(st.binary(max_size=40)) + b"\n"
    obj: dict = {"id": draw(TEXT), "object": "chat.completion.chunk", "model": "m"}
    if kind == "usage":
        usage = {"prompt_tokens": draw(COUNT), "completion_tokens": draw(COUNT), "total_tokens": draw(COUNT)}
        if draw(st.booleans()):
            usage["prompt_tokens_details"] = {"cached_tokens": draw(COUNT)}
        if draw(st.booleans()):
            usage["completion_tokens_details"] = {"reasoning_tokens": draw(COUNT)}
        obj["choices"], obj["usage"] = [], usage
    elif kind == "error":
        obj["error"] = {"message": draw(TEXT)}
    else:
        if kind == "text":
            choice: dict = {"index": 0, "text": draw(TEXT)}
        elif kind == "tool":
            choice = {"index": 0, "delta": {"tool_calls": [{"index": draw(st.integers(0, 3)), "id": draw(TEXT),
                                                             "function": {"name": draw(TEXT),
                                                                          "arguments": draw(TEXT)}}]}}
        else:
            choice = {"index": 0, "delta": {"content" if kind == "content" else "reasoning_content": draw(TEXT)}}
        choice["finish_reason"] = draw(st.sampled_from([None, "stop", "length", "tool_calls"]))
        obj["choices"] = [choice]
        if draw(st.booleans()):
            obj["usage"] = {"prompt_tokens": draw(COUNT), "completion_tokens": draw(COUNT)}
    line = b"data: " + json.dumps(obj, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass") + b"\n"
    cut = draw(st.one_of(st.none(), st.integers(0, len(line))))
    if cut is not None and draw(st.booleans()):  # a line cut, or a byte changed
        line = line[:cut] + b"\n" if draw(st.booleans()) else line[:cut] + bytes([draw(st.integers(0, 255))]) + line[cut + 1:]
    return line


@settings(max_examples=600, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(chunk(), min_size=1, max_size=6))
def test_any_stream_ends_alike_in_both_parsers_and_only_as_a_stream_error(lines):
    lines = stamped(lines)
    want, want_done = by_python(lines)
    got, got_done, _ = by_native(lines)
    assert want["error"] is None or want["error"][0] == "StreamError", want["error"]
    assert got == want
    if want["error"] is None:
        assert got_done == want_done
    for key in ("prompt", "completion", "cached"):  # a usage count no server could mean is not kept
        value = want[key]
        assert value is None or (isinstance(value, int) and 0 <= value <= MAX_USAGE_TOKENS), (key, value)


#: the named-event APIs' event types, and any other
EVENT_TYPES = st.sampled_from(["message_start", "content_block_start", "content_block_delta", "message_delta",
                               "message_stop", "error", "response.created", "response.output_text.delta",
                               "response.reasoning_text.delta", "response.output_item.added",
                               "response.function_call_arguments.delta", "response.completed", "ping", "other"])
JSONISH = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(st.sampled_from(
                                                            ["type", "text", "thinking", "partial_json", "index",
                                                             "id", "name", "usage", "input_tokens", "output_tokens",
                                                             "cache_read_input_tokens", "delta", "stop_reason",
                                                             "message", "content_block", "item", "response",
                                                             "output_index", "error"]), inner, max_size=5)),
                    max_leaves=12)


@settings(max_examples=600, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["messages", "responses"]),
       st.lists(st.tuples(EVENT_TYPES, st.dictionaries(st.sampled_from(
           ["delta", "index", "content_block", "message", "usage", "item", "response", "output_index", "error"]),
           JSONISH, max_size=4)), min_size=1, max_size=5))
def test_any_named_event_stream_fails_only_as_a_stream_error(api, events):
    """Anthropic's Messages and the Responses API (every line to Python: the C parser knows chat chunks only)."""
    from vllm_load.client.apis.messages import MessagesState
    from vllm_load.client.apis.responses import ResponsesState
    from vllm_load.client.sse import StreamError

    state = MessagesState() if api == "messages" else ResponsesState()
    try:
        for i, (kind, fields) in enumerate(events):
            state.feed(b"data: " + json.dumps({"type": kind, **fields}).encode() + b"\n", 0.01 * i)
    except StreamError:
        pass
