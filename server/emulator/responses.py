"""``POST /v1/responses`` in vLLM 0.32's shapes: named SSE events with ``sequence_number``, a reasoning item
(``response.reasoning_text.delta``) before the message (``response.output_text.delta``) when the emulator
acts as a reasoning model, usage only in ``response.completed``, and no ``[DONE]``. The input is rendered
with the chat template and encoded with the tokenizer's special tokens, as vLLM 0.32 does (one token more
than the same chat request with a BOS-adding tokenizer)."""

from __future__ import annotations

import itertools
import secrets
import time
from typing import TYPE_CHECKING, Any, Iterable

import orjson

from .generate import paced
from .plan import WORDS

if TYPE_CHECKING:
    from .app import Emulator
    from .plan import Output


class ResponsesError(ValueError):
    """A body vLLM would answer 400."""


def messages_of(body: dict) -> list[dict[str, Any]]:
    """The Responses ``input`` (a string, or message items whose content is a string or input_text parts) and
    ``instructions`` as chat messages."""
    value = body.get("input")
    if isinstance(value, str):
        items: list[Any] = [{"role": "user", "content": value}]
    elif isinstance(value, list) and value:
        items = value
    else:
        raise ResponsesError("input must be a non-empty string or a list of input items")
    messages = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
    for item in items:
        if not isinstance(item, dict) or "role" not in item:
            raise ResponsesError("input items must be messages with a role")
        content = item.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        messages.append({"role": item["role"], "content": content or ""})
    return messages


def input_ids(emu: Emulator, messages: list[dict[str, Any]]) -> list[int]:
    tok = emu.tok
    if tok.mistral_common:
        return tok.encode_chat(messages)
    return tok.encode(tok.render_chat(messages), add_special_tokens=True)


def stream(emu: Emulator, model: str, out: Output) -> Iterable[bytes]:
    """The event stream of one response, its tokens on the engine's schedule."""
    rid = f"resp_{secrets.token_hex(8)}"
    seq = itertools.count()
    created = int(time.time())

    def event(kind: str, **data: Any) -> bytes:
        data.update(sequence_number=next(seq), type=kind)
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def response(status: str, output: list, usage: dict | None, incomplete: dict | None = None) -> dict:
        return {"id": rid, "created_at": created, "incomplete_details": incomplete, "model": model,
                "object": "response", "output": output, "status": status, "usage": usage,
                "max_output_tokens": out.max_tokens}

    yield event("response.created", response=response("in_progress", [], None))
    yield event("response.in_progress", response=response("in_progress", [], None))
    words = itertools.cycle(WORDS)
    items: list[dict] = []
    current: dict | None = None
    texts: list[str] = []
    n = 0

    def close(item: dict, text: str) -> Iterable[bytes]:
        kind = item["type"]
        part = {"text": text, "type": "reasoning_text" if kind == "reasoning" else "output_text"}
        done = "response.reasoning_text.done" if kind == "reasoning" else "response.output_text.done"
        yield event(done, content_index=0, item_id=item["id"], output_index=len(items) - 1, text=text)
        yield event("response.content_part.done", content_index=0, item_id=item["id"], output_index=len(items) - 1,
                    part=part)
        item.update(content=[part], status="completed")
        yield event("response.output_item.done", item=item, output_index=len(items) - 1)

    for tokens in paced(emu, out):
        for _ in range(tokens):
            kind = "reasoning" if n < out.reasoning else "message"
            if current is None or current["type"] != kind:
                if current is not None:
                    yield from close(current, "".join(texts))
                current = ({"id": f"rs_{secrets.token_hex(8)}", "summary": [], "type": "reasoning", "content": None,
                            "status": "in_progress"} if kind == "reasoning" else
                           {"id": f"msg_{secrets.token_hex(8)}", "content": [], "role": "assistant",
                            "status": "in_progress", "type": "message"})
                items.append(current)
                texts = []
                yield event("response.output_item.added", item=dict(current), output_index=len(items) - 1)
                yield event("response.content_part.added", content_index=0, item_id=current["id"],
                            output_index=len(items) - 1,
                            part={"text": "", "type": "reasoning_text" if kind == "reasoning" else "output_text"})
            word = next(words)
            texts.append(word)
            n += 1
            yield event("response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta",
                        content_index=0, delta=word, item_id=current["id"], output_index=len(items) - 1)
    if current is not None:
        yield from close(current, "".join(texts))
    usage = {"input_tokens": len(out.ids), "input_tokens_details": {"cached_tokens": out.cached},
             "output_tokens": n, "output_tokens_details": {"reasoning_tokens": min(n, out.reasoning)},
             "total_tokens": len(out.ids) + n}
    cut = out.finish == "length"
    yield event("response.completed", response=response("incomplete" if cut else "completed", items, usage,
                                                        {"reason": "max_output_tokens"} if cut else None))
