"""``POST /v1/messages`` and ``/v1/messages/count_tokens`` (Anthropic's Messages API) in vLLM 0.32's shapes
(``vllm/entrypoints/anthropic/serving.py``): the request read as the chat request vLLM converts it to (``system``
first as a system message), counted by the chat template; streamed as named events (``message_start`` with the
first usage, a ``thinking`` block closed by its ``signature_delta`` when the emulator acts as a reasoning model, a
``text`` block, ``message_delta`` with the stop reason and the final usage, ``message_stop``), and answered whole
when not streamed. Usage is Anthropic's: ``input_tokens`` excludes ``cache_read_input_tokens``."""

from __future__ import annotations

import itertools
import secrets
from typing import TYPE_CHECKING, Any, Iterable

import orjson

from .generate import paced
from .plan import WORDS

if TYPE_CHECKING:
    from .app import Emulator
    from .plan import Output

#: vLLM's finish reasons as Anthropic's stop reasons
STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


class MessagesError(ValueError):
    """A body vLLM would answer 400."""


def chat_messages(body: dict) -> list[dict[str, Any]]:
    """The chat messages vLLM converts a Messages body to: ``system`` (a string or text blocks) first, then each
    message, its text blocks joined."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise MessagesError("messages must be a non-empty list")
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        out.append({"role": "system", "content": _text(system)})
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            raise MessagesError("each message needs a role of user, assistant or system")
        out.append({"role": m["role"], "content": _text(m.get("content"))})
    return out


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    raise MessagesError("content must be a string or a list of content blocks")


def usage(prompt: int, cached: int, output: int) -> dict[str, int]:
    return {"input_tokens": max(0, prompt - cached), "output_tokens": output, "cache_read_input_tokens": cached}


def stream(emu: Emulator, model: str, out: Output) -> Iterable[bytes]:
    """The event stream of one message, its tokens on the engine's schedule; a client that goes away is counted
    as vLLM counts it (``finished_reason="abort"``)."""
    try:
        yield from _stream(emu, model, out)
    except GeneratorExit:
        emu.metrics.success.labels(finished_reason="abort", **emu.metrics.labels).inc()
        raise


def _stream(emu: Emulator, model: str, out: Output) -> Iterable[bytes]:
    def event(kind: str, **data: Any) -> bytes:
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"

    prompt = len(out.ids)
    yield event("message_start", message={
        "id": f"chatcmpl-{secrets.token_hex(8)}", "type": "message", "role": "assistant", "content": [],
        "model": model, "stop_reason": None, "stop_sequence": None, "usage": usage(prompt, out.cached, 0)})
    words = itertools.cycle(WORDS)
    block, index, n = None, -1, 0
    for tokens in paced(emu, out):
        for _ in range(tokens):
            kind = "thinking" if n < out.reasoning else "text"
            if kind != block:
                if block is not None:
                    yield from _close(event, block, index)
                block, index = kind, index + 1
                yield event("content_block_start", index=index, content_block={"type": kind, kind: ""})
            n += 1
            yield event("content_block_delta", index=index, delta={"type": f"{kind}_delta", kind: next(words)})
    if block is not None:
        yield from _close(event, block, index)
    yield event("message_delta", delta={"stop_reason": STOP.get(out.finish, "end_turn"), "stop_sequence": None},
                usage=usage(prompt, out.cached, n))
    yield event("message_stop")


def _close(event: Any, block: str, index: int) -> Iterable[bytes]:
    if block == "thinking":
        yield event("content_block_delta", index=index, delta={"type": "signature_delta",
                                                               "signature": secrets.token_hex(16)})
    yield event("content_block_stop", index=index)


def whole(emu: Emulator, model: str, out: Output) -> bytes:
    """A message answered whole (``stream`` false): its tokens on the engine's schedule, then one body."""
    n = sum(paced(emu, out))
    words = itertools.cycle(WORDS)
    thinking = min(n, out.reasoning)
    content = []
    if thinking:
        content.append({"type": "thinking", "thinking": "".join(next(words) for _ in range(thinking)),
                        "signature": secrets.token_hex(16)})
    content.append({"type": "text", "text": "".join(next(words) for _ in range(n - thinking))})
    return orjson.dumps({"id": f"chatcmpl-{secrets.token_hex(8)}", "type": "message", "role": "assistant",
                         "content": content, "model": model, "stop_reason": STOP.get(out.finish, "end_turn"),
                         "stop_sequence": None, "usage": usage(len(out.ids), out.cached, n)})
