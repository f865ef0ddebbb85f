"""``--model base:0.6,lora-a:0.3,lora-b:0.1``: which model (a base model, its LoRA adapters) each request asks for.

A fleet serves a base model and its adapters in unequal shares; ``--model a,b,c`` sent them in equal turns. With
weights, each load process deals its requests by smooth weighted round robin (nginx's): every model gets its share
of any count exactly, to within one request a process, and the choice is interleaved (no burst of one adapter), the
same run after run. A name's last ``:`` followed by a number is its weight; any other ``:`` is the name's own
(``llama3:8b``)."""

from __future__ import annotations

import math

from vllm_load.errors import UsageError


def parse_models(text: str) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """The models named and their weights (normalised to 1), or no weights: equal turns."""
    names: list[str] = []
    weights: list[float | None] = []
    for part in (p.strip() for p in str(text or "").split(",")):
        if not part:
            continue
        name, _, tail = part.rpartition(":")
        weight = _number(tail) if name else None
        if weight is None:
            names.append(part)
            weights.append(None)
            continue
        if not math.isfinite(weight) or weight <= 0:
            raise UsageError(f"--model {part!r}: a model's weight must be a number above 0, e.g. {name}:0.3")
        names.append(name)
        weights.append(weight)
    if str(text or "").strip() and not names:
        raise UsageError(f"--model {text!r} names no model: write one id or several, e.g. --model base,lora-a")
    if len(set(names)) < len(names):
        raise UsageError(f"--model {text!r} names a model twice: give each once (with its weight)")
    given = [w for w in weights if w is not None]
    if not given:
        return tuple(names), ()
    if len(given) < len(weights):
        raise UsageError(f"--model {text!r}: give every model a weight or none, e.g. base:0.6,lora-a:0.4")
    total = sum(given)
    return tuple(names), tuple(w / total for w in given)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


class ModelMix:
    """The next request's model: equal turns, or smooth weighted round robin over the weights."""

    def __init__(self, models: tuple[str, ...], weights: tuple[float, ...] = ()) -> None:
        self.models, self.weights = models, weights
        self.current = [0.0] * len(models)
        self.turn = 0

    def next(self) -> str:
        if not self.weights:
            model = self.models[self.turn % len(self.models)]
            self.turn += 1
            return model
        for i, w in enumerate(self.weights):  # every model gains its weight; the one ahead is chosen and pays 1
            self.current[i] += w
        best = max(range(len(self.models)), key=self.current.__getitem__)
        self.current[best] -= 1.0
        return self.models[best]
