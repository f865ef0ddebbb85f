"""The emulator as a model of known accuracy (``--graded KIND:FILE``, ``--graded-correct RATE``): a chat request whose
prompt is a graded set's item (``vllm_load/workload/graded.py``, the client's own reading of the set) is answered
right at exactly RATE of such requests (interleaved: the right ones are spread, not first) and wrong otherwise, so a
test checks the grader and the accuracy's interval exactly. The answer streams as a few short pieces and stops."""

from __future__ import annotations

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
