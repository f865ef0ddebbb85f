"""The Responses API (``POST /v1/responses``, how gpt-oss is best served): its request, and its event
stream read into the same ``StreamState`` a chat stream fills, so it is timed and recorded like chat.

vLLM 0.32 streams named events (``event:`` lines, then ``data:`` with ``type`` and ``sequence_number``) and no
``[DONE]``: ``response.created``, ``response.output_text.delta`` (the answer) or
``response.reasoning_text.delta`` (a reasoning parser's thinking), …, ``response.completed``, whose response
carries the only usage (``input_tokens``, ``output_tokens``, ``output_tokens_details.reasoning_tokens``). There is
no running usage: each delta counts as one token and the final usage corrects the total, as a chat stream
without ``continuous_usage_stats``. The native thread hands the lines over with their stamps; its SSE parser
(``_sse.c``) knows only chat and completions chunks.
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson

from vllm_load.client.sse import NamedEvents, StreamError, usage_count, usage_details
from vllm_load.client.stream import BodyDefaults, ReadyRequest, int_or_none, merge_body

#: the answer's and the thinking's delta events
TEXT_DELTA = "response.output_text.delta"
REASONING_DELTAS = ("response.reasoning_text.delta", "response.reasoning_summary_text.delta")
#: events that end a response: completed (also when max_output_tokens cut it: status "incomplete")
ENDS = ("response.completed", "response.incomplete")


class ResponsesState(NamedEvents):
    """A Responses API event stream, read as ``StreamState`` reads a chat stream."""

    LAST: ClassVar[str] = "response.completed"

    def event(self, data: dict, now: float) -> None:
        kind = data.get("type")
        if kind == TEXT_DELTA or kind in REASONING_DELTAS:
            delta = data.get("delta") or ""
            if not delta:
                return
            if kind == TEXT_DELTA:
                self.content_parts.append(delta)
                if self.answer_at is None:
                    self.answer_at = now
            else:
                self.reasoning_parts.append(delta)
                if self.answer_at is None:
                    self.reasoning_streamed += 1
            self.text_parts.append(delta)
            self.chunk_times.append(now)
            self.chunk_tokens.append(1)
            self.streamed += 1
            self._check_limit()
        elif kind == "response.created":
            response = data.get("response") or {}
            self.response_id = response.get("id") if isinstance(response, dict) else None
        elif kind in ENDS:
            self._end(data.get("response") or {})
        elif kind in ("error", "response.failed"):
            err = data.get("error") or (data.get("response") or {}).get("error") or data.get("message") or data
            message = err.get("message", err) if isinstance(err, dict) else err
            raise StreamError(f"error in stream: {str(message)[:200]}")

    def _end(self, response: dict) -> None:
        usage = response.get("usage")
        if isinstance(usage, dict):
            # through the same guard as chat's usage (a count of 10^30 or -5 is no count: int() took it here)
            names = ("input_tokens", "output_tokens")  # the Responses API's usage names
            self.prompt_tokens, self.completion_tokens = (usage_count(usage.get(n)) for n in names)
            cached, reasoning = usage_details(usage, *names)
            self.cached_tokens = self.cached_tokens if cached is None else cached
            self.reasoning_reported = self.reasoning_reported if reasoning is None else reasoning
        status = response.get("status")
        reason = (response.get("incomplete_details") or {}).get("reason") if status == "incomplete" else None
        self.finish_reason = "length" if reason == "max_output_tokens" else (reason or "stop")
        self.done = True

    def incomplete(self) -> str | None:
        return None if self.done else f"stream ended before response.completed after {self.streamed} tokens"


def responses_request(model: str, text: Any, input_tokens: int, max_output_tokens: int | None, *,
                      defaults: BodyDefaults = BodyDefaults(), extra: dict[str, Any] | None = None,
                      group: str | None = None) -> ReadyRequest:
    """``POST /v1/responses``, streamed: ``text`` is the ``input`` (a string, or a list of input items), counted
    by the caller as ``input_tokens``. With ``max_output_tokens`` and ``ignore_eos`` (vLLM's extra field; the
    Responses API has no ``min_tokens``) the answer has exactly that many tokens."""
    body: dict[str, Any] = {"model": model, "input": text, "stream": True, "temperature": defaults.temperature}
    if max_output_tokens is not None:
        body["max_output_tokens"] = max_output_tokens
    forced = merge_body(body, defaults, extra, max_output_tokens)
    if forced:
        body["ignore_eos"] = True
    body["stream"] = True
    return ReadyRequest("responses", orjson.dumps(body), input_tokens, max_output_tokens if forced else None, group,
                        max_tokens=int_or_none(body.get("max_output_tokens")))
