"""What ``self.llm``'s calls check before anything is sent: a user's messages and max_tokens, each wrong one a
one-line error at the call naming what to give, instead of a traceback deep inside a tokenizer or thousands of
HTTP 400s from the server; and a message list's media split from its text (what the run's tokenizer counts)."""

from __future__ import annotations

from typing import Any


def check_messages(messages: Any, call: str = "chat(messages)") -> None:
    """``self.llm.chat``'s messages, checked at the call (transformers' own error named a character of a string)."""
    if not isinstance(messages, list) or not messages:
        got = type(messages).__name__ if not isinstance(messages, list) else "an empty list"
        raise TypeError(f"self.llm.{call}: messages must be a non-empty list of {{'role': ..., 'content': ...}} "
                        f"dicts, got {got}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not ("content" in m or "tool_calls" in m):
            got = type(m).__name__ if not isinstance(m, dict) else f"keys {sorted(m)}"
            raise TypeError(f"self.llm.{call}: messages[{i}] must be a dict with 'role' and 'content', got {got}")


def split_media(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The messages with each content list made its text (what the run's tokenizer counts exactly), and how
    many images, audio clips and videos they carry."""
    out, media = [], 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            text = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
            media += sum(1 for p in content if isinstance(p, dict) and p.get("type") != "text")
            m = {**m, "content": text}
        out.append(m)
    return out, media


def check_max_tokens(call: str, max_tokens: Any, input_tokens: int, context: int | None) -> None:
    """A positive int within what the served model's context leaves after the prompt, or None: checked at the
    call, instead of thousands of HTTP 400s from the server."""
    if max_tokens is None:
        return
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"self.llm.{call}(max_tokens={max_tokens!r}): give a positive int, or None to let the model "
                         "stop on its own")
    if context is not None and input_tokens + max_tokens > context:
        raise ValueError(f"self.llm.{call}(max_tokens={max_tokens}): with the prompt's {input_tokens} tokens it "
                         f"exceeds the served model's context of {context} tokens; ask for at most "
                         f"{max(0, context - input_tokens)}")
