"""Incremental parser for the OpenAI / vLLM streaming (SSE) response, one line at a time.

It keeps the timing of every token-bearing chunk. With ``continuous_usage_stats`` vLLM puts a
running ``usage`` in every chunk, so the number of tokens each chunk carried is known exactly (a
chunk may carry several tokens, or none when a token ends inside a UTF-8 sequence). Without it, a
chunk with non-empty text counts as one token and the final ``usage`` corrects the total.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson


class StreamError(Exception):
    """The stream broke the protocol or reported an error; the message is the failure reason."""


@dataclass
class StreamState:
    """What a stream has delivered so far; ``feed`` it each raw line with its arrival time."""

    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    text_parts: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    continuous_usage: bool = False
    done: bool = False
    bytes_read: int = 0
    response_id: str | None = None  # the server's id ("chatcmpl-..."), to join with server logs

    def feed(self, line: bytes, now: float) -> None:
        self.bytes_read += len(line)
        line = line.strip()
        if not line or line[:1] == b":":
            return  # event separator or SSE comment (keep-alive)
        if not line.startswith(b"data:"):
            if line.startswith((b"event:", b"id:", b"retry:")):
                return
            raise StreamError(f"malformed SSE line: {line[:80]!r}")
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return
        if self.done:
            raise StreamError("data after [DONE]")
        try:
            data = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise StreamError(f"malformed SSE JSON: {payload[:80]!r}") from None
        if not isinstance(data, dict):
            raise StreamError(f"malformed SSE JSON: {payload[:80]!r}")
        if self.response_id is None:
            self.response_id = data.get("id")
        error = data.get("error")
        if error is not None:
            message = error.get("message", error) if isinstance(error, dict) else error
            raise StreamError(f"error in stream: {str(message)[:200]}")
        usage = data.get("usage")
        new_tokens = None
        if usage:
            before = self.completion_tokens or 0
            self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
            self.completion_tokens = usage.get("completion_tokens", self.completion_tokens)
            if data.get("choices"):
                self.continuous_usage = True
                new_tokens = (self.completion_tokens or 0) - before
        for choice in data.get("choices") or ():
            delta = choice.get("delta")
            text = (delta.get("content") or delta.get("reasoning_content") or "") if delta else choice.get("text") or ""
            if text:
                self.text_parts.append(text)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            if new_tokens is None:
                new_tokens = 1 if text else 0
        if new_tokens:
            self.chunk_times.append(now)
            self.chunk_tokens.append(new_tokens)

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    @property
    def streamed_tokens(self) -> int:
        return sum(self.chunk_tokens)
