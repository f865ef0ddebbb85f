"""The receive thread's SSE parser (``_sse.c``) makes of every line what ``StreamState.feed`` makes of it.

Each case runs twice: Python alone (``feed`` line by line), and the native way (the C parser takes the
lines it is certain of, ``StreamState.absorb`` takes its result, ``feed`` gets the line it left and every
one after). Both must end in the same state, or raise the same error. The cases are vLLM's real chunk
shapes (chat, completions, continuous usage, reasoning, tool calls, errors, unicode) and thousands of
seeded mutations of them, so JSON that orjson refuses is refused here too.
"""

from __future__ import annotations

import random

import orjson
import pytest

from vllm_load.client import native
from vllm_load.client.sse import StreamError, StreamState

pytestmark = pytest.mark.skipif(not native.built(), reason="the native reader is not built (its own test fails then)")

START_NS = 1_795_349_934_123_456_789
START_WALL = START_NS / 1e9 - 0.25  # the request left 250 ms before the first chunk


def seconds(ns: int) -> float:
    """A stamp as the thread hands it to Python (``seconds()`` in _rxnative.c)."""
    return float(ns // 1_000_000_000) + float(ns % 1_000_000_000) * 1e-9


def chat_chunk(cid: str, content: str | None = None, *, finish: str | None = None, usage: dict | None = None,
               role: bool = False, **delta_extra) -> bytes:
    delta: dict = {"role": "assistant", "content": ""} if role else {}
    if content is not None:
        delta["content"] = content
    delta.update(delta_extra)
    chunk = {"id": cid, "object": "chat.completion.chunk", "created": 1795349934, "model": "tiny",
             "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "token_ids": None}]}
    if usage is not None:
        chunk["usage"] = usage
    return b"data: " + orjson.dumps(chunk) + b"\n"


def completion_chunk(cid: str, text: str, finish: str | None = None) -> bytes:
    chunk = {"id": cid, "object": "text_completion", "created": 1795349934, "model": "tiny",
             "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}]}
    return b"data: " + orjson.dumps(chunk) + b"\n"


def usage_chunk(cid: str, prompt: int, completion: int, cached: int | None = None) -> bytes:
    usage: dict = {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return b"data: " + orjson.dumps({"id": cid, "object": "chat.completion.chunk", "choices": [],
                                      "usage": usage}) + b"\n"


DONE = b"data: [DONE]\n"
WORDS = ["Hello", " world", "é", " 中文", " 🙂", ' "quoted"', " back\\slash", "\n", "\t", " \x7f", "", " x"]


def vllm_chat(continuous: bool, n: int = 12, seed: int = 0) -> list[bytes]:
    rnd = random.Random(seed)
    lines = [chat_chunk("chatcmpl-1", None, role=True, usage={"prompt_tokens": 14, "completion_tokens": 0,
                                                                "total_tokens": 14} if continuous else None)]
    for i in range(1, n + 1):
        usage = {"prompt_tokens": 14, "completion_tokens": i, "total_tokens": 14 + i} if continuous else None
        lines.append(chat_chunk("chatcmpl-1", rnd.choice(WORDS), usage=usage,
                                finish="length" if i == n else None))
    lines.append(usage_chunk("chatcmpl-1", 14, n, cached=rnd.choice([None, 0, 7])))
    return lines + [DONE]


CASES: dict[str, list[bytes]] = {
    "chat, continuous usage": vllm_chat(True),
    "chat, usage at the end": vllm_chat(False, seed=1),
    "completions": [completion_chunk("cmpl-1", w) for w in ["sed", "IN", " user", '""', ""]]
    + [completion_chunk("cmpl-1", "x", "length"), usage_chunk("cmpl-1", 5, 6), DONE],
    "reasoning then content": [chat_chunk("c", None, reasoning_content="think"), chat_chunk("c", None, reasoning="more"),
                               chat_chunk("c", "answer", reasoning_content=""), chat_chunk("c", "", reasoning=None), DONE],
    "reasoning phase with continuous usage and details (vLLM 0.32 says 0)": [
        chat_chunk("r", None, role=True, usage={"prompt_tokens": 5, "completion_tokens": 0}),
        chat_chunk("r", None, reasoning="a", usage={"prompt_tokens": 5, "completion_tokens": 1}),
        chat_chunk("r", None, reasoning=" bc", usage={"prompt_tokens": 5, "completion_tokens": 3}),
        chat_chunk("r", " x", usage={"prompt_tokens": 5, "completion_tokens": 4}),
        chat_chunk("r", "y", reasoning="z", usage={"prompt_tokens": 5, "completion_tokens": 6}),
        b'data: {"id":"r","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":6,'
        b'"completion_tokens_details":{"reasoning_tokens":0}}}\n', DONE],
    "reasoning details: a count, null, odd types": [
        chat_chunk("r", None, reasoning_content="t"),
        b'data: {"id":"r","choices":[],"usage":{"completion_tokens":1,"completion_tokens_details":null}}\n',
        b'data: {"id":"r","choices":[],"usage":{"completion_tokens":1,"completion_tokens_details":{"reasoning_tokens":null}}}\n',
        b'data: {"id":"r","choices":[],"usage":{"completion_tokens":1,"completion_tokens_details":{"reasoning_tokens":7,"x":[1]}}}\n',
        b'data: {"id":"r","choices":[],"usage":{"completion_tokens":1,"completion_tokens_details":{"reasoning_tokens":7.0}}}\n',
        DONE],
    "several tokens in a chunk, none in another": [
        chat_chunk("c", "ab", usage={"prompt_tokens": 3, "completion_tokens": 2}),
        chat_chunk("c", "", usage={"prompt_tokens": 3, "completion_tokens": 2}),
        chat_chunk("c", "\ufffd", usage={"prompt_tokens": 3, "completion_tokens": 5}), DONE],
    "tool calls (Python assembles them)": [
        chat_chunk("c", None, role=True),
        chat_chunk("c", None, tool_calls=[{"index": 0, "id": "abcdefghi", "type": "function",
                                            "function": {"name": "get", "arguments": ""}}]),
        chat_chunk("c", None, tool_calls=[{"index": 0, "function": {"arguments": "{\"a\": 1}"}}]),
        chat_chunk("c", None, finish="tool_calls"), DONE],
    "an empty tool_calls list stays native": [chat_chunk("c", "a", tool_calls=[]), chat_chunk("c", "b", tool_calls=None), DONE],
    "error event mid-stream": [chat_chunk("c", "a"), b'data: {"error": {"message": "engine dead", "code": 500}}\n'],
    "error as a string": [b'data: {"id": "x", "error": "boom"}\n'],
    "data after [DONE]": [chat_chunk("c", "a"), DONE, chat_chunk("c", "b")],
    "[DONE] twice": [chat_chunk("c", "a"), DONE, DONE],
    "SSE comments, event and id lines, CRLF, spaces": [
        b": keep-alive\n", b"event: message\n", b"id: 7\n", b"retry: 100\n",
        chat_chunk("c", "a")[:-1] + b"\r\n", b"data:" + chat_chunk("c", "b")[5:], b"  \t\r\n", DONE],
    "not SSE": [chat_chunk("c", "a"), b"garbage line\n"],
    "not an object": [b"data: [1, 2]\n"],
    "n = 2 choices": [b'data: {"id":"c","choices":[{"delta":{"content":"a"}},{"delta":{"content":"b"}}]}\n', DONE],
    "no id on the first chunk": [b'data: {"choices":[{"delta":{"content":"a"}}]}\n', chat_chunk("late-id", "b"), DONE],
    "null id, empty id": [b'data: {"id":null,"choices":[{"delta":{"content":"a"}}]}\n',
                          b'data: {"id":"","choices":[{"delta":{"content":"b"}}]}\n', chat_chunk("third", "c"), DONE],
    "escapes": [b'data: {"id":"c","choices":[{"delta":{"content":"\\u00e9\\ud83d\\ude42\\n\\t\\"\\\\\\/\\b\\f\\r\\u0000"}}]}\n', DONE],
    "lone surrogates": [b'data: {"id":"c","choices":[{"delta":{"content":"\\ud800"}}]}\n'],
    "escaped key": [b'data: {"\\u0069d":"sneaky","choices":[{"delta":{"content":"a"}}]}\n', DONE],
    "duplicate keys": [b'data: {"id":"c","choices":[{"delta":{"content":"a","content":"b"}}]}\n', DONE],
    "usage nulls and odd types": [
        b'data: {"id":"c","choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":null,"completion_tokens":1}}\n',
        b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":3.0,"completion_tokens":1}}\n', DONE],
    "usage empty, zero, details null": [
        b'data: {"id":"c","choices":[{"delta":{"content":"a"}}],"usage":{}}\n',
        b'data: {"id":"c","choices":[{"delta":{"content":"b"}}],"usage":0}\n',
        b'data: {"id":"c","choices":[{"delta":{"content":"c"}}],"usage":{"completion_tokens":3,'
        b'"prompt_tokens_details":null}}\n',
        b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":2,"completion_tokens":3,'
        b'"prompt_tokens_details":{"cached_tokens":null}}}\n', DONE],
    "negative and huge counts": [
        b'data: {"id":"c","choices":[{"delta":{"content":"a"}}],"usage":{"completion_tokens":-1}}\n',
        b'data: {"id":"c","choices":[],"usage":{"completion_tokens":123456789012345678901234}}\n', DONE],
    "numbers orjson refuses": [b'data: {"id":"c","x":1e400,"choices":[{"delta":{"content":"a"}}]}\n'],
    "numbers orjson takes": [b'data: {"id":"c","x":[-0,1.5e308,1e-400,0.0,12345678901234567890],'
                             b'"choices":[{"delta":{"content":"a"}}]}\n', DONE],
    "empty delta falls back to text": [b'data: {"id":"c","choices":[{"delta":{},"text":"t"}]}\n',
                                       b'data: {"id":"c","choices":[{"delta":null,"text":"u","finish_reason":""}]}\n', DONE],
    "deep nesting": [b'data: {"id":"c","x":' + b"[" * 100 + b"]" * 100 + b',"choices":[{"delta":{"content":"a"}}]}\n', DONE],
    "invalid UTF-8": [b'data: {"id":"c","choices":[{"delta":{"content":"\xed\xa0\x80"}}]}\n'],
    "control character": [b'data: {"id":"c","choices":[{"delta":{"content":"a\x01"}}]}\n'],
    "empty data": [b"data:\n"],
    "trailing garbage": [b'data: {"id":"c","choices":[]} x\n'],
}


def outcome(state: StreamState, error: Exception | None) -> dict:
    return {"error": None if error is None else (type(error).__name__, str(error)),
            "chunk_times": state.chunk_times, "chunk_tokens": state.chunk_tokens, "text": state.text,
            "content": state.content, "reasoning": "".join(state.reasoning_parts), "text_parts": bool(state.text_parts),
            "prompt": state.prompt_tokens, "completion": state.completion_tokens, "cached": state.cached_tokens,
            "finish": state.finish_reason, "continuous": state.continuous_usage, "done": state.done,
            "id": state.response_id, "calls": state.calls, "answer_at": state.answer_at,
            "reasoning_streamed": state.reasoning_streamed, "reasoning_reported": state.reasoning_reported}


def stamped(lines: list[bytes]) -> list[tuple[bytes, int]]:
    return [(line, START_NS + i * 7_654_321) for i, line in enumerate(lines)]


def by_python(lines: list[tuple[bytes, int]], max_tokens: int | None = None) -> tuple[dict, float | None]:
    state, error, done_at = StreamState(), None, None
    state.cap(max_tokens)
    try:
        for line, ns in lines:
            was = state.done
            state.feed(line, seconds(ns) - START_WALL)
            if state.done and not was:
                done_at = seconds(ns) - START_WALL
    except Exception as exc:  # noqa: BLE001 - the error is part of the outcome compared
        error = exc
    return outcome(state, error), done_at


def by_native(lines: list[tuple[bytes, int]], max_tokens: int | None = None) -> tuple[dict, float | None, int]:
    from vllm_load.client import _rxnative
    state, error, done_at = StreamState(), None, None
    state.cap(max_tokens)
    parsed, taken = _rxnative.parse_sse(lines, START_WALL, state.limit or 0)
    try:
        done_at = state.absorb(parsed)
        rest = [(line, seconds(ns)) for line, ns in lines[taken:]]
        later = state.feed_lines(rest, START_WALL) if rest else None
        done_at = done_at if done_at is not None else later
    except Exception as exc:  # noqa: BLE001
        error = exc
    return outcome(state, error), done_at, taken


@pytest.mark.parametrize("name", list(CASES))
def test_the_native_parser_ends_where_python_does(name):
    lines = stamped(CASES[name])
    want, want_done = by_python(lines)
    got, got_done, _taken = by_native(lines)
    assert got == want
    if want["error"] is None:
        assert got_done == want_done


def test_the_usual_vllm_stream_is_parsed_natively_to_its_last_line():
    # the point of the parser: nothing of a usual body is left for the event loop
    for name in ("chat, continuous usage", "chat, usage at the end", "completions", "reasoning then content",
                 "reasoning phase with continuous usage and details (vLLM 0.32 says 0)",
                 "several tokens in a chunk, none in another", "escapes", "numbers orjson takes"):
        lines = stamped(CASES[name])
        _got, _done, taken = by_native(lines)
        assert taken == len(lines), name
    # and what it must leave to Python, it leaves at the right line
    assert by_native(stamped(CASES["tool calls (Python assembles them)"]))[2] == 1
    assert by_native(stamped(CASES["error event mid-stream"]))[2] == 1


def _mutations(rnd: random.Random, line: bytes) -> bytes:
    alphabet = b'{}[]",:\\ -0123456789eE.tfnul\x00\x1f\x7f\xc3\xa9\xed\xa0\x80\xf0\x9f\x99\x82'
    data = bytearray(line.rstrip(b"\n"))
    for _ in range(rnd.randint(1, 3)):
        pos = rnd.randrange(len(data) + 1)
        op = rnd.random()
        if op < 0.4 and pos < len(data):
            data[pos] = rnd.choice(alphabet)
        elif op < 0.7:
            data.insert(pos, rnd.choice(alphabet))
        elif pos < len(data):
            del data[pos]
    return bytes(data) + b"\n"


def test_thousands_of_mutated_lines_end_alike():
    rnd = random.Random(20261124)
    pool = [line for lines in CASES.values() for line in lines]
    natively = 0
    for _ in range(20000):
        lines = [rnd.choice(pool) for _ in range(rnd.randint(1, 4))]
        i = rnd.randrange(len(lines))
        lines[i] = _mutations(rnd, lines[i])
        lines = stamped(lines)
        want, want_done = by_python(lines)
        got, got_done, taken = by_native(lines)
        assert got == want, lines
        if want["error"] is None:  # a failed request's end is its failure's time, not its [DONE]'s
            assert got_done == want_done, lines
        natively += taken == len(lines)
    assert natively > 2000  # many mutations leave valid JSON (a changed digit, a letter in a string): native


def test_absorb_then_feed_is_one_stream():
    # a body whose parser gave up half-way: Python goes on from the native state (usage differences included)
    lines = stamped(vllm_chat(True, n=6)[:4] + [b'data: {"error": "late failure"}\n'])
    got, _done, taken = by_native(lines)
    assert taken == 4
    assert got["error"] == ("StreamError", "error in stream: late failure")
    assert got["chunk_tokens"] == [1, 1, 1] and got["completion"] == 3
    with pytest.raises(StreamError):
        StreamState().feed(lines[-1][0], 0.0)


def test_a_stream_past_its_limit_ends_alike_and_the_parser_stops_at_it():
    # a server running past max_tokens: the C parser hands every line past the limit to Python, which cuts
    lines = stamped(vllm_chat(True, n=60))
    want, _ = by_python(lines, max_tokens=10)
    got, _done, taken = by_native(lines, max_tokens=10)
    assert got == want and want["error"] == ("StreamError",
                                             "protocol: the stream ran past 26 tokens for max_tokens 10: cut")
    assert taken < len(lines) - 30
    for name, case in CASES.items():  # every shape, every small limit: the same end
        for max_tokens in (1, 2, 3):
            assert by_native(stamped(case), max_tokens)[0] == by_python(stamped(case), max_tokens)[0], name


def test_only_a_late_read_that_merged_chunks_counts_against_the_run():
    """Chunks under one stamp are the client's doing only when the read that completed them was late; the
    same merge from an on-time read is the server's (it wrote them together)."""
    from vllm_load.client import _rxnative
    chunks = vllm_chat(True, n=6)
    same = START_NS + 50_000_000
    # chunks 1-3 completed by one late read (2 gaps of 0), 4-5 by one on-time read (1 gap of 0)
    lines = ([(chunks[0], START_NS, False)] + [(c, same, True) for c in chunks[1:4]]
             + [(c, same + 30_000_000, False) for c in chunks[4:6]] + [(c, same + 60_000_000 + i, False)
                                                                      for i, c in enumerate(chunks[6:])])
    parsed, taken = _rxnative.parse_sse(lines, START_WALL)
    state = StreamState()
    state.absorb(parsed)
    assert taken == len(lines) and state.late_merged == 2
    gaps = [b - a for a, b in zip(state.chunk_times, state.chunk_times[1:])]
    assert sum(g == 0 for g in gaps) == 3  # all three gaps of 0 read 0; only two were the client's
