"""The emulator as a model of known accuracy and of guided decoding. Known accuracy (``--graded KIND:FILE``, ``--graded-correct RATE``): a chat request whose
prompt is a graded set's item (``vllm_load/workload/graded.py``, the client's own reading of the set) is answered
right at exactly RATE of such requests (interleaved: the right ones are spread, not first) and wrong otherwise, so a
test checks the grader and the accuracy's interval exactly. The answer streams as a few short pieces and stops. Guided
decoding (``structured``): a request's ``response_format`` is answered with valid JSON, as vLLM's would be."""

from __future__ import annotations

import json
from typing import Any

from vllm_load.workload.graded import LETTERS, Item, load_set


class GradedAnswers:
    def __init__(self, sets: list[str], correct: float) -> None:
        self.items: dict[str, Item] = {}
        for text in sets:
            kind, _, path = text.partition(":")
            for item in load_set(kind, path):
                self.items[item.prompt] = item
        self.correct = correct
        self.asked = 0

    def answer(self, body: dict) -> list[str] | None:
        """The answer's pieces to a known item (None: not a graded prompt)."""
        messages = body.get("messages") or []
        last = messages[-1].get("content") if messages and isinstance(messages[-1], dict) else None
        item = self.items.get(last) if isinstance(last, str) else None
        if item is None:
            return None
        right = int((self.asked + 1) * self.correct) > int(self.asked * self.correct)
        self.asked += 1
        words = (item.example if right else _wrong(item)).split(" ")  # a json item without an example: never right
        return [w + " " for w in words[:-1]] + [words[-1] or "{"]


def _wrong(item: Item) -> str:
    if item.kind == "gsm8k":
        return f"The answer is #### {int(float(item.expected)) + 1}"
    if item.kind == "mmlu":
        return f"The answer is {LETTERS[(LETTERS.index(item.expected) + 1) % 4]}."
    return "{"  # no JSON object: fails any schema


def of(args: Any) -> GradedAnswers | None:
    return GradedAnswers(args.graded, args.graded_correct) if args.graded else None


def structured(body: dict) -> list[str] | None:
    """A request's ``response_format`` answered as vLLM's guided decoding would: a JSON object (a schema's smallest
    instance: its required properties, each of its type), in pieces; None: no JSON asked."""
    fmt = body.get("response_format")
    if not isinstance(fmt, dict) or fmt.get("type") not in ("json_object", "json_schema"):
        return None
    schema = (fmt.get("json_schema") or {}).get("schema") if fmt["type"] == "json_schema" else None
    value = _instance(schema) if isinstance(schema, dict) else {"text": "the model answers"}
    text = json.dumps(value)
    return [text[i:i + 4] for i in range(0, len(text), 4)]


def _instance(schema: dict) -> Any:
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        return {k: _instance(props.get(k) or {}) for k in schema.get("required") or list(props)[:1]}
    return {"string": "x", "integer": 0, "number": 0, "boolean": True, "array": [], "null": None}.get(kind, "x")
