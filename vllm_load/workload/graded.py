"""Accuracy under load: a graded share of a run's requests (``--accuracy KIND:FILE[:SHARE]``, repeatable), each
answer graded, so a server that answers fast and wrong (a quantization, a speculative-decoding setting, a KV-cache
dtype, a batch-size-dependent kernel) fails a gate as a slow one does.

Sets are read from local files in their public formats (JSON Lines, or a JSON list):

- ``gsm8k``: ``question`` and ``answer`` (GSM8K's worked answer ending ``#### 72``): graded by the number after
  ``####`` in the reply, else its last number, equal to the expected one;
- ``mmlu``: ``question``, ``choices`` (four texts; or ``A``..``D``) and ``answer`` (a letter, or an index): graded by
  the letter the reply gives ("the answer is C", "(C)", a lone "C");
- ``json``: ``prompt`` and ``schema`` (a JSON schema): graded by whether the reply's first JSON object validates.

Each process deals its requests between the run's own workload and each set by smooth weighted round robin (a set's
share exactly, interleaved), the set's items in turn from a seeded start. A graded request is a chat request named
by its kind (its metrics, accuracy and SLOs are that name's: ``accuracy[gsm8k]>=0.8``), its prompt the set's own
text (the same each time, as accuracy benchmarks send it), its length the model's (``--output-tokens`` caps it).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any, Callable

from vllm_load.errors import UsageError
from vllm_load.workload.inputs.input_files import loads, read_text
from vllm_load.workload.structured import check_patterns, json_valid

KINDS = ("gsm8k", "mmlu", "json")
LETTERS = "ABCD"
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_LETTER = re.compile(r"(?:answer(?: is)?[:\s]*\(?|^\(?|\s\(?)([ABCD])\b\)?", re.IGNORECASE)


@dataclass(frozen=True)
class Item:
    kind: str
    prompt: str
    expected: str  # the number, the letter, or the schema (JSON text)
    example: str = ""  # a right answer's text (the emulator answers it, or a wrong one, at its set rate)


def gsm8k_number(text: str) -> str | None:
    """The answer's number: after ``####`` when there is one, else the last number; commas and a trailing ``.0``
    dropped (``1,000`` and ``1000.0`` are 1000)."""
    tail = text.rsplit("####", 1)[1] if "####" in text else text
    found = _NUMBER.findall(tail)
    if not found:
        return None
    value = found[0] if "####" in text else found[-1]
    value = value.replace(",", "")
    return value[:-2] if value.endswith(".0") else value


def mmlu_letter(text: str) -> str | None:
    m = _LETTER.search(text.strip())
    return m.group(1).upper() if m else None


GRADERS: dict[str, Callable[[str, str], bool]] = {
    "gsm8k": lambda reply, expected: gsm8k_number(reply) == expected,
    "mmlu": lambda reply, expected: mmlu_letter(reply) == expected,
    "json": json_valid,
}


def grade(kind: str, reply: str, expected: str) -> bool:
    return GRADERS[kind](reply, expected)


def _item(kind: str, row: Any, where: str) -> Item:
    if not isinstance(row, dict):
        raise UsageError(f"{where}: a {kind} item is a JSON object")
    try:
        if kind == "gsm8k":
            number = gsm8k_number(str(row["answer"]))
            if number is None:
                raise KeyError("answer (no number in it)")
            return Item(kind, f"{row['question']}\nGive the final answer after '####'.", number,
                        f"The answer is #### {number}")
        if kind == "mmlu":
            choices = row.get("choices") or [row[letter] for letter in LETTERS]
            answer = row["answer"]
            letter = LETTERS[int(answer)] if isinstance(answer, int) or str(answer).isdigit() else str(answer).upper()
            if len(choices) != 4 or letter not in LETTERS:
                raise KeyError("choices (four) or answer (A-D)")
            options = "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices))
            return Item(kind, f"{row['question']}\n{options}\nAnswer with the letter of the right choice.", letter,
                        f"The answer is {letter}.")
        schema = row["schema"]
        check_patterns(schema, where)  # its answers are checked on the event loop: no exponential pattern
        return Item(kind, str(row["prompt"]), json.dumps(schema),
                    json.dumps(row["example"]) if "example" in row else "")
    except (KeyError, IndexError, ValueError, TypeError) as exc:
        raise UsageError(f"{where}: a {kind} item lacks {str(exc).strip(chr(39))}") from None


def load_set(kind: str, path: str) -> list[Item]:
    """A set's items from a JSON Lines file or a JSON list; a bad file or item is a one-line UsageError."""
    where = f"--accuracy {kind}:{path}"
    text = read_text(path, f"--accuracy {kind}:", "--accuracy")
    try:
        rows = loads(text, where) if text.lstrip().startswith("[") else [
            loads(line, f"{where} line {n}") for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    except ValueError as exc:
        raise UsageError(f"{where}: not JSON Lines or a JSON list ({exc})") from None
    items = [_item(kind, row, f"{where} item {n}") for n, row in enumerate(rows, 1)]
    if not items:
        raise UsageError(f"{where}: holds no item")
    return items


@dataclass(frozen=True)
class GradedSet:
    kind: str
    path: str
    share: float


def parse_accuracy(values: list[str] | None) -> list[GradedSet]:
    """``KIND:FILE[:SHARE]`` each (SHARE of the run's requests, default 0.1); their shares below 1 together."""
    out = []
    for text in values or ():
        kind, _, rest = str(text).partition(":")
        path, share = rest, 0.1
        head, _, tail = rest.rpartition(":")
        if head and re.fullmatch(r"\d*\.?\d+", tail):
            path, share = head, float(tail)
        if kind not in KINDS or not path:
            raise UsageError(f"--accuracy {text!r}: write KIND:FILE[:SHARE], KIND one of {', '.join(KINDS)}, "
                             "e.g. gsm8k:gsm8k.jsonl:0.2")
        if not 0 < share < 1:
            raise UsageError(f"--accuracy {text!r}: its share of the requests must be above 0 and below 1")
        out.append(GradedSet(kind, path, share))
    if len({s.kind for s in out}) < len(out):
        raise UsageError("--accuracy names a kind twice: give each kind once")
    if sum(s.share for s in out) >= 1:
        raise UsageError("--accuracy: the sets' shares add up to 1 or more: leave the run's own workload a share")
    return out


class GradedMix:
    """This process's next request: the run's own (None) or a set's next item, by smooth weighted round robin."""

    def __init__(self, sets: list[GradedSet], seed: str) -> None:
        self.items = [load_set(s.kind, s.path) for s in sets]
        self.weights = [1.0 - sum(s.share for s in sets), *(s.share for s in sets)]
        self.current = [0.0] * len(self.weights)
        rng = random.Random(seed)
        self.next_item = [rng.randrange(len(items)) for items in self.items]

    def next(self) -> Item | None:
        for i, w in enumerate(self.weights):
            self.current[i] += w
        pick = max(range(len(self.current)), key=lambda i: (self.current[i], -i))
        self.current[pick] -= 1.0
        if pick == 0:
            return None
        items, k = self.items[pick - 1], pick - 1
        item, self.next_item[k] = items[self.next_item[k] % len(items)], self.next_item[k] + 1
        return item

