"""Whether an answer's tool calls are whole: each call names a tool the request offered, its arguments parse as JSON
and validate against that tool's ``parameters`` schema, and no call delta came empty.

Why: a busy server's tool parser breaks calls it makes whole alone (vLLM #48089: 0 % corrupt at concurrency 1, a
share at 16; #54701: empty ``tool_calls`` deltas in ordinary multi-client traffic), and a load test that only times
answers passes a server that answers fast and wrong. The check is each request's (``integrity`` in its record,
the request log); the run's share per name comes from the logs at its end (``features/integrity.py``)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import orjson

#: the violations, each named once
UNKNOWN_TOOL, NOT_JSON, OFF_SCHEMA, EMPTY_DELTA, NO_NAME = (
    "unknown_tool", "arguments_not_json", "arguments_off_schema", "empty_delta", "no_name")
#: the answer's text: a tool call's markup left in the content (the parser did not take it), reasoning or tool markup
#: opened and not closed (or closed unopened), a special token of the tokenizer in the content
MARKUP_IN_CONTENT, UNBALANCED, SPECIAL_TOKEN = "tool_markup_in_content", "markup_unbalanced", "special_token_in_content"
#: a request whose tool_choice required a call ("required", or a function named) got an answer without one
NO_CALL = "no_call"
KINDS = (UNKNOWN_TOOL, NOT_JSON, OFF_SCHEMA, EMPTY_DELTA, NO_NAME, MARKUP_IN_CONTENT, UNBALANCED, SPECIAL_TOKEN, NO_CALL)
#: the tool-call markup of the models vLLM's tool parsers read (hermes, qwen3, llama3_json, mistral, granite, ...):
#: in the content of an answer to a request with tools, the parser let a call through as text
TOOL_MARKERS = ("<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "<|tool_call|>", "<function=",
                "<|tool_calls_section_begin|>")
#: the open and close tags that come in pairs (reasoning parsers' and hermes-style tool calls')
PAIRS = (("<think>", "</think>"), ("<tool_call>", "</tool_call>"))


@functools.lru_cache(maxsize=256)
def _validator(schema_json: bytes) -> Any:
    """A tool's parameters schema compiled once (a run sends the same tools over and over)."""
    import jsonschema

    schema = orjson.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError:
        return None  # a schema the request itself got wrong: its calls are judged by name and JSON only
    return cls(schema)


def offered(tools: Sequence[Any]) -> dict[str, bytes | None]:
    """The request's tools by function name, each with its parameters schema (as JSON bytes, the cache's key)."""
    out: dict[str, bytes | None] = {}
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            out[fn["name"]] = orjson.dumps(params, option=orjson.OPT_SORT_KEYS) if isinstance(params, dict) else None
    return out


def check(tools: Sequence[Any], calls: Sequence[dict[str, Any]], empty_deltas: int, required: bool = False) -> list[str]:
    """The violations in an answer's assembled ``calls`` against the request's ``tools`` (empty: whole); ``required``:
    its tool_choice asked for a call."""
    found: list[str] = [EMPTY_DELTA] * min(empty_deltas, 1) + [NO_CALL] * (required and not calls)
    names = offered(tools)
    for call in calls:
        fn = call.get("function") or {}
        name = fn.get("name") or ""
        if not name:
            found.append(NO_NAME)
            continue
        if name not in names:
            found.append(UNKNOWN_TOOL)
            continue
        try:
            args = orjson.loads(fn.get("arguments") or "{}")
        except orjson.JSONDecodeError:
            found.append(NOT_JSON)
            continue
        schema = names[name]
        validator = _validator(schema) if schema is not None else None
        if validator is not None and not validator.is_valid(args):
            found.append(OFF_SCHEMA)
    return found


def with_text(found: list[str], content: str, reasoning: str, special: Sequence[str]) -> list[str]:
    """The calls' violations and the text's, as one answer's: a call left in the content as markup is that fault,
    not also a call missing."""
    text = check_text(content, reasoning, special)
    return [k for k in found if not (k == NO_CALL and MARKUP_IN_CONTENT in text)] + text


def check_text(content: str, reasoning: str, special: Sequence[str]) -> list[str]:
    """The violations in an answer's text to a request that offered tools: tool markup in its content, a pair of
    tags unbalanced in its content or reasoning, a special token of the tokenizer (``special``) in its content."""
    found = []
    if any(m in content for m in TOOL_MARKERS):
        found.append(MARKUP_IN_CONTENT)
    if any(text.count(a) != text.count(b) for text in (content, reasoning) for a, b in PAIRS):
        found.append(UNBALANCED)
    if any(tok and tok in content for tok in special):
        found.append(SPECIAL_TOKEN)
    return found
