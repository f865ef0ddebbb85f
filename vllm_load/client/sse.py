"""Incremental parser for the OpenAI / vLLM streaming (SSE) response, one line at a time.

It keeps the timing of every token-bearing chunk. With ``continuous_usage_stats`` vLLM puts a
running ``usage`` in every chunk, so the number of tokens each chunk carried is known exactly (a
chunk may carry several tokens, or none when a token ends inside a UTF-8 sequence). Without it, a
chunk with non-empty text counts as one token and the final ``usage`` corrects the total.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

if TYPE_CHECKING:  # the C extension's result type (absent where it was not built)
    from vllm_load.client._rxnative import Parsed


#: the most tokens a usage count may say: no model's context holds 2^31 tokens
MAX_USAGE_TOKENS = 2 ** 31 - 1


def _text(value: Any, what: str) -> str:
    """A chunk's text field: a string (empty when absent or null); anything else is the server's error, said as one
    (``"content": true`` crashed the parser, and with it the user's greenlet)."""
    if not value:
        return ""
    if not isinstance(value, str):
        raise StreamError(f"malformed chunk: {what} is {type(value).__name__}, not text")
    return value


def usage_count(value: Any) -> int | None:
    """A server's token count as an int, or None where it cannot be one (a string, a bool, a fraction, a negative,
    10^30): such a count is the server's error, and the run counts that request's tokens itself instead (its usage
    missing) rather than report 10^30 tokens a second, or a crash on a histogram that cannot hold it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not (value.is_integer() and math.isfinite(value)):
        return None
    return int(value) if 0 <= value <= MAX_USAGE_TOKENS else None


def usage_details(usage: dict, prompt: str, completion: str) -> tuple[int | None, int | None]:
    """A usage object's cached prompt tokens and reasoning tokens, each a sane count (``usage_count``) or None:
    ``{prompt}_details.cached_tokens`` and ``{completion}_details.reasoning_tokens`` (chat's prompt_tokens_details,
    the Responses API's input_tokens_details: one reading for both, the guard included)."""
    def detail(key: str, field: str) -> int | None:
        d = usage.get(f"{key}_details")
        return usage_count(d.get(field)) if isinstance(d, dict) else None
    return detail(prompt, "cached_tokens"), detail(completion, "reasoning_tokens")


class StreamError(Exception):
    """The stream broke the protocol or reported an error; the message is the failure reason."""


#: a stream may carry max_tokens plus this share of it (at least OVERRUN_MIN more) before it is cut: a server
#: that ignores max_tokens (1,853 tokens streamed for 16 asked) would otherwise be measured as if it were right
OVERRUN_SHARE = 1.0
OVERRUN_MIN = 16


def overrun_limit(max_tokens: int | None) -> int | None:
    """The most tokens a stream asked for ``max_tokens`` may carry before it is cut; None: no limit."""
    if not max_tokens or max_tokens < 1:
        return None
    return max_tokens + max(OVERRUN_MIN, int(max_tokens * OVERRUN_SHARE))


def data_of(line: bytes) -> bytes | None:
    """An SSE line's ``data:`` payload; None for what carries none (an event separator, a comment such as a
    keep-alive, an ``event:``/``id:``/``retry:`` field); StreamError for anything else."""
    line = line.strip()
    if not line or line[:1] == b":":
        return None
    if not line.startswith(b"data:"):
        if line.startswith((b"event:", b"id:", b"retry:")):
            return None
        raise StreamError(f"malformed SSE line: {line[:80]!r}")
    return line[5:].strip()


def json_object(payload: bytes) -> dict:
    """An SSE event's JSON object, or the StreamError that names what came instead."""
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise StreamError(f"malformed SSE JSON: {payload[:80]!r}") from None
    if not isinstance(data, dict):
        raise StreamError(f"malformed SSE JSON: {payload[:80]!r}")
    return data


@dataclass
class StreamState:
    """What a stream has delivered so far; ``feed`` it each raw line with its arrival time (an
    ``exchange.Decoder``: the native thread parses it itself, ``absorb``)."""

    parses_sse: ClassVar[bool] = True
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    text_parts: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens (vLLM --enable-prompt-tokens-details)
    finish_reason: str | None = None
    continuous_usage: bool = False
    done: bool = False
    bytes_read: int = 0
    response_id: str | None = None  # the server's id ("chatcmpl-..."), to join with server logs
    content_parts: list[str] = field(default_factory=list)  # the answer's text (not its reasoning)
    reasoning_parts: list[str] = field(default_factory=list)
    #: tool calls assembled from the streamed deltas, by index: id, type and name arrive once, the
    #: arguments in pieces that are concatenated
    tool_calls: dict[int, dict] = field(default_factory=dict)
    empty_tool_deltas: int = 0  # call deltas that carried nothing (no id, type, name or arguments): vLLM #54701
    #: the most tokens this stream may carry (``overrun_limit`` of its max_tokens) before it is cut as a protocol
    #: failure; None: no limit. The C parser hands every line past it to ``feed``, which raises.
    limit: int | None = None
    asked: int | None = None  # the max_tokens it was set from (said in the failure)
    #: --cancel: the client gives up once the stream carried this many tokens (the same cut as ``limit``'s), and
    #: whether it did
    cancel_after: int | None = None
    abandoned: bool = False
    streamed: int = 0  # tokens of the chunks so far (``sum(chunk_tokens)``, kept as they come)
    #: a reasoning model's phases: the offset of the first chunk of the answer (content, text or a tool call: not
    #: reasoning), the tokens of the chunks before it, and the server's own count of the reasoning tokens
    #: (usage.completion_tokens_details.reasoning_tokens; vLLM 0.32 says 0 whatever the model thought)
    answer_at: float | None = None
    reasoning_streamed: int = 0
    reasoning_reported: int | None = None
    #: chunk gaps of 0 that the native thread's late reads made (a read over 1 ms after landing that completed
    #: two chunks of this stream): the only way a late read moves a measured time
    late_merged: int = 0
    #: the server's own times of this request (vLLM's ``metrics``: queue_time_ms, time_to_first_token_ms counted
    #: from its scheduling, generation_time_ms, mean_itl_ms), when it sent them
    server_metrics: dict | None = None

    def feed(self, line: bytes, now: float) -> None:
        self.bytes_read += len(line)
        payload = data_of(line)
        if payload is None:
            return
        if payload == b"[DONE]":
            self.done = True
            return
        if self.done:
            raise StreamError("data after [DONE]")
        data = json_object(payload)
        if self.response_id is None:
            self.response_id = data.get("id")
        error = data.get("error")
        if error is not None:
            message = error.get("message", error) if isinstance(error, dict) else error
            raise StreamError(f"error in stream: {str(message)[:200]}")
        metrics = data.get("metrics")
        if isinstance(metrics, dict):  # vLLM's per-request metrics (--enable-per-request-metrics), in its last chunk
            self.server_metrics = metrics
        usage = data.get("usage")
        new_tokens = None
        if usage and not isinstance(usage, dict):
            raise StreamError(f"malformed chunk: usage is {type(usage).__name__}, not an object")
        if usage:
            before = self.completion_tokens or 0
            self.prompt_tokens = usage_count(usage.get("prompt_tokens", self.prompt_tokens))
            self.completion_tokens = usage_count(usage.get("completion_tokens", self.completion_tokens))
            cached, thought = usage_details(usage, "prompt_tokens", "completion_tokens")
            self.cached_tokens = self.cached_tokens if cached is None else cached
            self.reasoning_reported = self.reasoning_reported if thought is None else thought
            if data.get("choices") and (self.continuous_usage or not self.streamed):
                self.continuous_usage = True
                new_tokens = (self.completion_tokens or 0) - before
            # else: a server that reports usage once, in the chunk of its last choice (transformers serve): the
            # final count, not this chunk's tokens (it was booked as one chunk carrying the whole answer)
        choices = data.get("choices")
        choices = [] if choices is None else choices
        if not isinstance(choices, list):
            raise StreamError(f"malformed chunk: choices is {type(choices).__name__}, not a list")
        for choice in choices:
            if not isinstance(choice, dict):
                raise StreamError(f"malformed chunk: a choice is {type(choice).__name__}, not an object")
            delta = choice.get("delta")
            calls = None
            if delta and not isinstance(delta, dict):
                raise StreamError(f"malformed chunk: delta is {type(delta).__name__}, not an object")
            if delta:
                content = _text(delta.get("content"), "content")
                reasoning = _text(delta.get("reasoning_content"), "reasoning_content") or \
                    _text(delta.get("reasoning"), "reasoning")
                if content:
                    self.content_parts.append(content)
                if reasoning:
                    self.reasoning_parts.append(reasoning)
                text = content or reasoning
                calls = delta.get("tool_calls")
                if calls:
                    self._add_tool_calls(calls)
                answer = bool(content or calls)
            else:
                text = _text(choice.get("text"), "text")
                if text:
                    self.content_parts.append(text)
                answer = bool(text)
            if answer and self.answer_at is None:
                self.answer_at = now
            if text:
                self.text_parts.append(text)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            if new_tokens is None:
                new_tokens = 1 if text or calls else 0
        if new_tokens:
            self.chunk_times.append(now)
            self.chunk_tokens.append(new_tokens)
            self.streamed += new_tokens
            if self.answer_at is None:  # the thinking phase: every token until the answer's first (a <think>
                self.reasoning_streamed += new_tokens  # token streams no text, and is thinking too)
            self._check_limit()

    def end_offset(self, done_at: float | None) -> float | None:
        return done_at

    def incomplete(self) -> str | None:
        """Why the stream is not a whole answer (None: it is). A stream that ends cleanly after a chunk with a
        finish_reason is whole without ``[DONE]`` (transformers serve sends none); one cut before is not."""
        if self.done or self.finish_reason is not None:
            return None
        return f"stream ended before a finish_reason or [DONE] after {self.streamed} tokens"

    def _check_limit(self) -> None:
        if self.cancel_after is not None and self.streamed >= self.cancel_after:
            self.abandoned = True
            raise StreamError(f"abandoned by the client after {self.streamed} tokens (--cancel)")
        if self.limit is not None and self.streamed > self.limit:
            raise StreamError(f"protocol: the stream ran past {self.limit} tokens for max_tokens {self.asked}: cut")

    def cap(self, max_tokens: int | None) -> None:
        """Cut the stream (a protocol failure) once it carries more than ``overrun_limit(max_tokens)`` tokens, or
        (``cancel_after``) once it carried that many: the native parser hands ``feed`` every line past the limit."""
        self.asked, self.limit = max_tokens, overrun_limit(max_tokens)
        if self.cancel_after is not None:
            self.limit = self.cancel_after - 1 if self.limit is None else min(self.limit, self.cancel_after - 1)

    def feed_lines(self, lines: list[tuple[bytes, float]], start: float) -> float | None:
        """Feed the native reader's (line, landing stamp) pairs; the offset of the line that completed the
        stream (its ``[DONE]``) when one of them did."""
        feed, done_at, was_done = self.feed, None, self.done
        for line, stamp in lines:
            feed(line, stamp - start)
            if not was_done and self.done:
                done_at, was_done = stamp - start, True
        return done_at

    def absorb(self, p: Parsed) -> float | None:
        """Take what the receive thread's parser (``_sse.c``) made of the body's lines, as ``feed`` would have
        made of them (it leaves to ``feed`` every line it is not certain of, and the lines after it); the
        offset of the [DONE] line when it saw one. Only on a state nothing was fed yet: its token counts
        by usage difference start from none."""
        self.chunk_times += p.offsets
        self.chunk_tokens += p.tokens
        self.streamed += sum(p.tokens)
        if self.response_id is None:
            self.response_id = p.response_id
        if p.content:
            self.content_parts.append(p.content)
        if p.reasoning:
            self.reasoning_parts.append(p.reasoning)
        if p.text:
            self.text_parts.append(p.text)
        if p.finish_reason is not None:
            self.finish_reason = p.finish_reason
        if p.prompt_tokens is not None:
            self.prompt_tokens = p.prompt_tokens
        if p.completion_tokens is not None:
            self.completion_tokens = p.completion_tokens
        if p.cached_tokens is not None:
            self.cached_tokens = p.cached_tokens
        self.continuous_usage = self.continuous_usage or p.continuous
        if self.answer_at is None:
            self.answer_at = p.answer_at
        self.reasoning_streamed += p.reasoning_streamed
        self.late_merged += p.late_merged
        if p.reasoning_reported is not None:
            self.reasoning_reported = p.reasoning_reported
        self.done = self.done or p.done
        done_at = p.done_at
        self._check_limit()
        return done_at

    def _add_tool_calls(self, calls: Any) -> None:
        if not isinstance(calls, list):
            raise StreamError(f"malformed tool call delta: {str(calls)[:80]}")
        for call in calls:
            if not isinstance(call, dict):
                raise StreamError(f"malformed tool call delta: {str(call)[:80]}")
            index = call.get("index", len(self.tool_calls))
            fn = call.get("function") or {}
            if isinstance(index, bool) or not isinstance(index, int) or not isinstance(fn, dict):
                raise StreamError(f"malformed tool call delta: {str(call)[:80]}")
            cid, kind = _text(call.get("id"), "a tool call's id"), _text(call.get("type"), "a tool call's type")
            name, args = _text(fn.get("name"), "a tool call's name"), _text(fn.get("arguments"), "its arguments")
            if not (cid or kind or name or args):
                self.empty_tool_deltas += 1
                continue
            have = self.tool_calls.get(index)
            if have is None:
                have = self.tool_calls[index] = {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
            if cid:
                have["id"] = cid
            if kind:
                have["type"] = kind
            if name:
                have["function"]["name"] = name
            if args:
                have["function"]["arguments"] += args

    @property
    def text(self) -> str:
        """Everything generated as text (answer or reasoning): what a local token count counts."""
        return "".join(self.text_parts)

    @property
    def content(self) -> str:
        return "".join(self.content_parts)

    @property
    def calls(self) -> list[dict]:
        return [self.tool_calls[i] for i in sorted(self.tool_calls)]

    @property
    def streamed_tokens(self) -> int:
        return self.streamed


class NamedEvents(StreamState):
    """A stream of named events (the Responses API's, Anthropic's Messages), read into the state a chat stream fills:
    the C parser knows chat chunks only, so every line comes to ``feed``, and each event's object to ``event``."""

    parses_sse: ClassVar[bool] = False
    LAST: ClassVar[str] = ""  # the event that ends the stream (named when data follows it)

    def feed(self, line: bytes, now: float) -> None:
        self.bytes_read += len(line)
        payload = data_of(line)
        if payload is None:
            return
        if self.done:
            raise StreamError(f"data after {self.LAST}")
        data = json_object(payload)
        try:
            self.event(data, now)
        except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as exc:  # a field of a shape no
            # server of this API sends (a string where a count goes, a list where an object does): the request's
            # failure, said, never the user's greenlet's crash (Hypothesis found them: tests/test_sse_fuzz.py)
            raise StreamError(f"malformed {type(self).__name__.removesuffix('State')} event "
                              f"{str(data.get('type'))[:40]!r}: {type(exc).__name__}: {str(exc)[:120]}") from None

    def event(self, data: dict, now: float) -> None:
        raise NotImplementedError
