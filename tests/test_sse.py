"""SSE parsing on vLLM's real chunk shapes (../shared/notes/vllm-0.32-sse-samples.txt) and on faults."""

import orjson
import pytest

from vllm_load.client.sse import StreamError, StreamState

ROLE = b'data: {"id":"chatcmpl-b2","object":"chat.completion.chunk","created":1,"model":"tiny","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}\n'
EMPTY = b'data: {"id":"chatcmpl-b2","object":"chat.completion.chunk","created":1,"model":"tiny","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":null,"token_ids":null}]}\n'
USAGE = b'data: {"id":"chatcmpl-b2","object":"chat.completion.chunk","created":1,"model":"tiny","choices":[],"usage":{"prompt_tokens":14,"total_tokens":30,"completion_tokens":16},"system_fingerprint":"vllm-0.32.0-d5e9bee5"}\n'


def chat_chunk(text, finish=None, usage=None):
    d = {"id": "x", "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish, "token_ids": None}]}
    if usage is not None:
        d["usage"] = {"prompt_tokens": 14, "completion_tokens": usage, "total_tokens": 14 + usage}
    return b"data: " + orjson.dumps(d) + b"\n"


def feed_all(lines):
    s = StreamState()
    for i, line in enumerate(lines):
        s.feed(line, float(i))
        s.feed(b"\n", float(i))
    return s


def test_real_vllm_chat_stream_without_continuous_usage():
    lines = [ROLE, EMPTY, chat_chunk("\ufffdinstance"), chat_chunk(" pla"), chat_chunk("", finish="length"), USAGE, b"data: [DONE]\n"]
    s = feed_all(lines)
    assert s.done
    # role chunk and empty-content chunks carry no visible token: first token is line 2
    assert s.chunk_times == [2.0, 3.0]
    assert s.prompt_tokens == 14 and s.completion_tokens == 16
    assert s.finish_reason == "length"
    assert s.text == "\ufffdinstance pla"
    assert not s.continuous_usage
    assert s.response_id == "chatcmpl-b2"  # kept to join the request with the server's logs


def test_continuous_usage_counts_multi_token_and_empty_chunks():
    lines = [ROLE.replace(b',"prompt_token_ids"', b',"usage":{"prompt_tokens":14,"completion_tokens":0,"total_tokens":14},"prompt_token_ids"'),
             chat_chunk("", usage=1),  # a token that ended inside a UTF-8 sequence: still a token
             chat_chunk(" a b c", usage=4),  # three tokens in one chunk
             chat_chunk(" d", finish="length", usage=5), USAGE.replace(b'"completion_tokens":16', b'"completion_tokens":5'),
             b"data: [DONE]\n"]
    s = feed_all(lines)
    assert s.continuous_usage
    assert s.chunk_times == [1.0, 2.0, 3.0]
    assert s.chunk_tokens == [1, 3, 1]
    assert s.completion_tokens == 5


def test_completions_text_chunks():
    d = {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "sed", "logprobs": None,
                                                                  "finish_reason": None, "stop_reason": None}]}
    s = feed_all([b"data: " + orjson.dumps(d) + b"\n", b"data: [DONE]\n"])
    assert s.chunk_tokens == [1] and s.text == "sed" and s.done


def test_comments_and_crlf_are_ignored():
    s = feed_all([b": keep-alive\r\n", chat_chunk("x").rstrip(b"\n") + b"\r\n", b"data: [DONE]\r\n"])
    assert s.chunk_tokens == [1] and s.done


@pytest.mark.parametrize("line, reason", [
    (b'data: {"error":{"message":"boom","type":"InternalServerError","code":500}}\n', "error in stream: boom"),
    (b'data: {"object":"error","error":"overloaded"}\n', "error in stream: overloaded"),
    (b"data: {not json\n", "malformed SSE JSON"),
    (b"garbage line\n", "malformed SSE line"),
])
def test_faults_raise_with_reason(line, reason):
    s = StreamState()
    s.feed(chat_chunk("a"), 0.0)
    with pytest.raises(StreamError, match=reason.replace("(", r"\(")):
        s.feed(line, 1.0)


def test_data_after_done_is_a_protocol_error():
    s = feed_all([b"data: [DONE]\n"])
    with pytest.raises(StreamError):
        s.feed(chat_chunk("late"), 2.0)


def test_tool_call_deltas_are_assembled_by_index_in_vllms_shape():
    s = StreamState()
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk"}
    deltas = [
        {"role": "assistant", "content": ""},
        {"tool_calls": [{"id": "abcDEF123", "type": "function", "index": 0,
                         "function": {"name": "search", "arguments": "{\"q\": "}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": "\"kv cache\"}"}}]},
        {"tool_calls": [{"id": "zzzYYY999", "type": "function", "index": 1,
                         "function": {"name": "fetch", "arguments": "{}"}}]},
    ]
    for i, d in enumerate(deltas):
        s.feed(b"data: " + orjson.dumps({**head, "choices": [{"index": 0, "delta": d, "finish_reason": None}]}),
               0.1 * (i + 1))
    s.feed(b"data: [DONE]", 1.0)
    assert s.calls == [
        {"id": "abcDEF123", "type": "function", "function": {"name": "search", "arguments": "{\"q\": \"kv cache\"}"}},
        {"id": "zzzYYY999", "type": "function", "function": {"name": "fetch", "arguments": "{}"}},
    ]
    assert s.chunk_times == pytest.approx([0.2, 0.3, 0.4]) and s.content == ""  # each call delta is a timed chunk


def test_the_body_merges_a_users_keys_and_forces_the_length_only_when_asked():
    from vllm_load.client.stream import build_request

    msgs = [{"role": "user", "content": "hi"}]
    forced = build_request("chat", "m", msgs, 10, 32)
    body = orjson.loads(forced.body)
    assert body["ignore_eos"] is True and body["min_tokens"] == 32 and forced.output_tokens == 32
    free = orjson.loads(build_request("chat", "m", msgs, 10, None).body)
    assert "max_tokens" not in free and "ignore_eos" not in free and "min_tokens" not in free
    capped = build_request("chat", "m", msgs, 10, 32, extra={"ignore_eos": False, "temperature": 0.7,
                                                              "tools": [{"type": "function"}], "stream": False,
                                                              "stream_options": {"include_usage": False}})
    body = orjson.loads(capped.body)
    assert body["ignore_eos"] is False and "min_tokens" not in body and capped.output_tokens is None
    assert body["temperature"] == 0.7 and body["tools"] == [{"type": "function"}] and body["max_tokens"] == 32
    # what the measurement reads stays on
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


def test_a_reasoning_stream_splits_into_its_phases():
    """TTFT stamps the first reasoning token, TTFO the answer's first; the reasoning tokens come from the
    running usage when vLLM 0.32 reports 0 for them or a count that differs from it, from the server when it
    counts them otherwise, else from the run's tokenizer over the reasoning text (at most the tokens generated)."""
    import orjson

    from vllm_load.client.stream import reasoning_count

    def chunk(delta: dict | None, done: int | None = None, details: int | None = None) -> bytes:
        body: dict = {"id": "r", "choices": [] if delta is None else [{"index": 0, "delta": delta}]}
        if done is not None:
            body["usage"] = {"prompt_tokens": 5, "completion_tokens": done}
            if details is not None:
                body["usage"]["completion_tokens_details"] = {"reasoning_tokens": details}
        return b"data: " + orjson.dumps(body)

    def stream(continuous: bool, details: int | None) -> StreamState:
        st = StreamState()
        lines = [({"reasoning": "a"}, 1), ({"reasoning": " bc"}, 3), ({"content": " x"}, 4), ({"content": "y"}, 5)]
        for t, (delta, done) in enumerate(lines):
            st.feed(chunk(delta, done if continuous else None), 0.1 * (t + 1))
        st.feed(chunk(None, 5, details), 0.6)
        st.feed(b"data: [DONE]", 0.6)
        return st

    st = stream(True, 0)
    assert st.chunk_times[0] == pytest.approx(0.1) and st.answer_at == pytest.approx(0.3)
    assert (st.reasoning_streamed, st.reasoning_reported) == (3, 0)
    assert reasoning_count(st, None) == (3, "stream")  # the server's 0 is not a count
    # a server's count that differs from the running usage's exact one does not replace it (it did, silently)
    assert reasoning_count(stream(True, 4), None) == (3, "stream")
    assert reasoning_count(stream(True, 3), None) == (3, "usage")  # where they agree, the server's own
    assert reasoning_count(stream(False, 4), None) == (4, "usage")  # no running usage: the server's count
    st = stream(False, None)
    assert st.reasoning_streamed == 2  # a chunk counts as one token without the running usage
    assert reasoning_count(st, lambda text: len(text.split())) == (2, "tokenizer")  # "a bc": 2 words
    plain = StreamState()
    plain.feed(chunk({"content": "x"}, 1), 0.2)
    assert plain.answer_at == pytest.approx(0.2) and reasoning_count(plain, None) == (None, None)
