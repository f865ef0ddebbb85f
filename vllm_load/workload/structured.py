"""Structured output: ``--response-format json_schema:FILE`` (or ``json_object``) asks every chat and completion
request for JSON (vLLM's guided decoding) and checks every answer: its first JSON object parses and, with a schema,
validates. The share of valid answers is a metric with its 95 % interval and an SLO (``valid_output>=99%``), per
name and per model as the other metrics. Asked lengths are not forced (no ``ignore_eos``): a grammar that has
closed its object allows only the end, which ``ignore_eos`` would refuse."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_load.errors import UsageError
from vllm_load.workload.inputs.input_files import loads, read_text


@dataclass(frozen=True)
class ResponseFormat:
    body: dict[str, Any] | None  # what every request's response_format says (None: ``check:``, not asked)
    schema: str  # the schema as JSON text ("": any JSON object)

    def valid(self, text: str) -> bool:
        return json_valid(text, self.schema)


def json_valid(text: str, schema: str) -> bool:
    """``text``'s first JSON object parses and (``schema`` given, JSON text) validates against it."""
    import jsonschema

    start = text.find("{")
    if start < 0:
        return False
    try:
        value, _ = json.JSONDecoder().raw_decode(text[start:])
        if schema:
            jsonschema.validate(value, json.loads(schema))
    except (ValueError, jsonschema.ValidationError):
        return False
    return isinstance(value, dict)


def parse_response_format(text: str) -> ResponseFormat | None:
    """``json_object`` or ``json_schema:FILE`` (a JSON schema), asked of the server; ``check:`` before either: the
    answers are checked and the server is not asked (the baseline without guided decoding). A bad value or file is a
    one-line UsageError."""
    if not text:
        return None
    if text.startswith("check:"):
        asked = parse_response_format(text[len("check:"):])
        return ResponseFormat(None, asked.schema) if asked is not None else None
    if text == "json_object":
        return ResponseFormat({"type": "json_object"}, "")
    kind, _, path = text.partition(":")
    if kind != "json_schema" or not path:
        raise UsageError(f"--response-format {text!r}: write json_object or json_schema:FILE (a JSON schema)")
    raw = read_text(path, "schema", "--response-format json_schema:FILE")
    try:
        schema = loads(raw, f"--response-format {text!r}")
    except ValueError as exc:
        raise UsageError(f"--response-format {text!r}: not JSON ({exc})") from None
    if not isinstance(schema, (dict, bool)):
        raise UsageError(f"--response-format {text!r}: a JSON schema is an object, not {type(schema).__name__}")
    check_patterns(schema, f"--response-format {text!r}")
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(x) for x in exc.path) or "its root"  # the rule it broke, never the file's values
        raise UsageError(f"--response-format {text!r}: not a JSON schema (at {where}: its {exc.validator!r} rule "
                         "fails)") from None
    name = Path(path).stem.replace("-", "_") or "schema"
    return ResponseFormat({"type": "json_schema", "json_schema": {"name": name, "schema": schema}}, json.dumps(schema))


#: a group holding a quantifier, itself quantified (``(\w+\s?)*``, ``(a|aa)+``): a backtracking regex engine can take
#: exponential time to reject an answer with it (34 ``a``s and a ``!`` froze the loop, and ``-t 5s`` never ended)
_NESTED = re.compile(r"\((?:[^()\\]|\\.)*(?:[*+}]|\|)(?:[^()\\]|\\.)*\)\s*(?:[*+]|\{\d*,\d*\})")


def check_patterns(schema: Any, where: str) -> None:
    """Refuse a schema whose ``pattern`` (or ``patternProperties`` key) nests quantifiers: checked against every
    answer on the event loop, such a pattern can hold it for minutes (one line, exit 2)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            patterns = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
            if isinstance(node.get("patternProperties"), dict):
                patterns += list(node["patternProperties"])
            for pattern in patterns:
                if _NESTED.search(pattern):
                    raise UsageError(f"{where}: its pattern {pattern!r} nests quantifiers, which can take exponential "
                                     "time to check an answer: write it without a quantified group of quantifiers")
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
