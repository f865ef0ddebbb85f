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
KINDS = (UNKNOWN_TOOL, NOT_JSON, OFF_SCHEMA, EMPTY_DELTA, NO_NAME)


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


def check(tools: Sequence[Any], calls: Sequence[dict[str, Any]], empty_deltas: int) -> list[str]:
    """The violations in an answer's assembled ``calls`` against the request's ``tools`` (empty: whole)."""
    found: list[str] = [EMPTY_DELTA] * min(empty_deltas, 1)
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
