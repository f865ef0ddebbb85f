"""What a user's task gets back from ``self.llm.chat`` / ``complete``: the answer and how it was timed.

The ``RequestRecord`` is what the metrics keep (timings, token counts); the ``Reply`` adds what a task needs
to go on (the text, the assistant message to append to the history, the tool calls assembled from the
streamed deltas) and never raises: a failed request is a ``Reply`` with ``ok`` False and its ``error``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_load.client.record import RequestRecord
from vllm_load.client.sse import StreamState


@dataclass
class Reply:
    ok: bool
    error: str | None
    text: str  # the answer's content (reasoning apart)
    reasoning: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI's shape: id, type, function{name, arguments}
    finish_reason: str | None = None
    ttft: float | None = None  # seconds, from the (intended) send
    ttfo: float | None = None  # the answer's first token (after a reasoning model's thinking); None: no answer
    reasoning_tokens: int | None = None  # output tokens spent reasoning (None: the stream carried no reasoning)
    e2e: float = 0.0
    input_tokens: int | None = None  # the server's usage when it sent one, else the count made before sending
    output_tokens: int | None = None
    name: str | None = None
    record: RequestRecord | None = field(default=None, repr=False)
    data: dict[str, Any] | None = field(default=None, repr=False)  # a pooling request's JSON answer

    @property
    def message(self) -> dict[str, Any]:
        """The assistant message to append to the history (``tool_calls`` when the model called tools; the
        content then is "" rather than null, which chat templates concatenate without failing)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.text}
        if self.tool_calls:
            msg["tool_calls"] = [dict(c, function=dict(c["function"])) for c in self.tool_calls]
        return msg

    @property
    def end(self) -> float | None:
        """When the answer ended (wall clock): its start plus its E2E (None for a reply without a record)."""
        return None if self.record is None else self.record.start + self.record.e2e

    def __bool__(self) -> bool:
        return self.ok

    @classmethod
    def of(cls, rec: RequestRecord, state: StreamState) -> Reply:
        return cls(ok=rec.ok, error=rec.error, text=state.content, reasoning="".join(state.reasoning_parts),
                   tool_calls=state.calls, finish_reason=rec.finish_reason, ttft=rec.ttft, ttfo=rec.ttfo,
                   reasoning_tokens=rec.reasoning_tokens, e2e=rec.e2e,
                   input_tokens=rec.input_tokens, output_tokens=rec.output_tokens, name=rec.name, record=rec)

    @classmethod
    def of_json(cls, rec: RequestRecord, data: dict[str, Any] | None) -> Reply:
        """A pooling request's reply: no text, its JSON answer in ``data``."""
        return cls(ok=rec.ok, error=rec.error, text="", reasoning="", e2e=rec.e2e, input_tokens=rec.input_tokens,
                   output_tokens=None, name=rec.name, record=rec, data=data)

    @classmethod
    def not_sent(cls, error: str, name: str | None = None) -> Reply:
        """A request that could not be built (e.g. a history longer than the model's context)."""
        return cls(ok=False, error=error, text="", reasoning="", name=name)
