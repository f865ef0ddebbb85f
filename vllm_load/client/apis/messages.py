"""Anthropic's Messages API (``POST /v1/messages``, what agents built on Anthropic's SDK send to vLLM): its request,
and its event stream read into the same ``StreamState`` a chat stream fills, so it is timed and recorded like chat.

vLLM 0.32 (``entrypoints/anthropic/serving.py``) converts the request to a chat completion (the ``system`` field
first as a system message, each message's string content as is: the chat template's count holds), streams it with
``continuous_usage_stats`` and turns each chat chunk into named events: ``message_start`` (the first chunk's
usage), ``content_block_start`` / ``content_block_delta`` (``text_delta``, ``thinking_delta`` from a reasoning
parser, ``input_json_delta`` of a tool call, ``signature_delta`` closing a thinking block) / ``content_block_stop``,
``message_delta`` (``stop_reason`` and the final usage) and ``message_stop``. Usage there is Anthropic's:
``input_tokens`` excludes the cached tokens (``cache_read_input_tokens``, with ``--enable-prompt-tokens-details``),
so the prompt's count is their sum. Each delta counts as one token and the final usage corrects the total, as for
the Responses API. The request has no ``ignore_eos`` (vLLM passes only Anthropic's own fields on), so an answer's
length is the model's, at most ``max_tokens``: checked against the usage, never forced.
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson

from vllm_load.client.sse import NamedEvents, StreamError
from vllm_load.client.stream import BodyDefaults, ReadyRequest, int_or_none

#: Anthropic's stop reasons as a chat completion's finish reasons (the record's vocabulary)
FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls"}


class MessagesState(NamedEvents):
    """An Anthropic Messages event stream, read as ``StreamState`` reads a chat stream."""

    LAST: ClassVar[str] = "message_stop"

    def event(self, data: dict, now: float) -> None:
        kind = data.get("type")
        if kind == "content_block_delta":
            self._delta(data.get("delta") or {}, data.get("index"), now)
        elif kind == "content_block_start":
            block = data.get("content_block") or {}
            if block.get("type") == "tool_use":
                self.tool_calls[int(data.get("index") or 0)] = {
                    "id": str(block.get("id") or ""), "type": "function",
                    "function": {"name": str(block.get("name") or ""), "arguments": ""}}
        elif kind == "message_start":
            message = data.get("message") or {}
            self.response_id = message.get("id")
            self._usage(message.get("usage"))
        elif kind == "message_delta":
            self._usage(data.get("usage"))
            reason = (data.get("delta") or {}).get("stop_reason")
            if reason:
                self.finish_reason = FINISH.get(reason, reason)
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            err = data.get("error") or data
            message = err.get("message", err) if isinstance(err, dict) else err
            raise StreamError(f"error in stream: {str(message)[:200]}")

    def _delta(self, delta: dict, index: Any, now: float) -> None:
        kind = delta.get("type")
        if kind == "text_delta":
            text, answer = delta.get("text") or "", True
        elif kind == "thinking_delta":
            text, answer = delta.get("thinking") or "", False
        elif kind == "input_json_delta":
            text, answer = delta.get("partial_json") or "", True
            call = self.tool_calls.get(int(index or 0))
            if call is None:
                raise StreamError(f"input_json_delta for block {index}, which no tool_use block started")
            call["function"]["arguments"] += text
        else:  # signature_delta: no token
            return
        if not text:
            return
        if kind == "text_delta":
            self.content_parts.append(text)
        elif kind == "thinking_delta":
            self.reasoning_parts.append(text)
        if answer and self.answer_at is None:
            self.answer_at = now
        elif not answer and self.answer_at is None:
            self.reasoning_streamed += 1
        if kind != "input_json_delta":
            self.text_parts.append(text)
        self.chunk_times.append(now)
        self.chunk_tokens.append(1)
        self.streamed += 1
        self._check_limit()

    def _usage(self, usage: Any) -> None:
        """Anthropic's usage: the prompt is ``input_tokens`` and the cached tokens (read and created)."""
        if not isinstance(usage, dict):
            return
        cached = usage.get("cache_read_input_tokens")
        created = usage.get("cache_creation_input_tokens") or 0
        if usage.get("input_tokens") is not None:
            self.prompt_tokens = int(usage["input_tokens"]) + int(cached or 0) + int(created)
        if cached is not None:
            self.cached_tokens = int(cached)
        if usage.get("output_tokens") is not None:
            self.completion_tokens = int(usage["output_tokens"])

    def incomplete(self) -> str | None:
        return None if self.done else f"stream ended before message_stop after {self.streamed} tokens"


def messages_request(model: str, messages: list[dict[str, Any]], input_tokens: int, max_tokens: int, *,
                     defaults: BodyDefaults = BodyDefaults(), extra: dict[str, Any] | None = None,
                     group: str | None = None) -> ReadyRequest:
    """``POST /v1/messages``, streamed: chat ``messages`` (a leading system message goes in ``system``, as
    Anthropic's SDK sends it; vLLM puts it back first), counted by the caller as ``input_tokens``. ``max_tokens``
    is Anthropic's required cap: the answer is at most that long (there is no ``ignore_eos`` to force it)."""
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": True,
                            "temperature": defaults.temperature}
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        body["system"], messages = messages[0]["content"], messages[1:]
    body["messages"] = messages
    body.update(defaults.extra)
    if extra:
        body.update(extra)
    body["stream"] = True
    return ReadyRequest("messages", orjson.dumps(body), input_tokens, None, group,
                        max_tokens=int_or_none(body.get("max_tokens")))
