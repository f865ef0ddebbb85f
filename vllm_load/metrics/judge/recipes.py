"""Named search recipes: a goal said once (``--recipe max-goodput:90%``) and turned into the SLOs every run, sweep
step and tune probe is judged by, so that "the largest level that passed" is the recipe's answer.

``max-goodput[:F]`` (F 90 % unless given): the highest load at which at least F of the requests met every
per-request limit at once (vLLM's bench and AIPerf's goodput: each ``ttft``/``tpot``/``e2e`` upper bound is also a
per-request limit, multi-tier ones per class). It is ``good_request_fraction>=F`` beside the limits; the sweep and
``tune`` report the level and its goodput (good requests per second)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from vllm_load.errors import UsageError
from vllm_load.metrics.judge.slo import PER_REQUEST, SLO, parse_slo_option

NAMES = ("max-goodput",)
DEFAULT_ATTAINMENT = 0.90


@dataclass(frozen=True)
class Recipe:
    name: str
    attainment: float  # the share of requests that must meet every per-request limit

    @property
    def slo(self) -> str:
        return f"good_request_fraction>={self.attainment * 100:g}%"

    def headline(self, level_word: str, level: object, goodput: float | None) -> str:
        """The recipe's answer, as the sweep and tune say it."""
        rate = "" if goodput is None else f", {goodput:.2f} good req/s"
        return (f"max goodput at {self.attainment * 100:g}% attainment: {level_word} {level}{rate}")


def parse_recipe(text: str) -> Recipe | None:
    """``--recipe``'s value: '' (none), 'max-goodput' or 'max-goodput:95%' (or 0.95); a one-line error else."""
    text = (text or "").strip()
    if not text:
        return None
    name, _, share = text.partition(":")
    if name not in NAMES:
        raise UsageError(f"--recipe {text!r}: the recipes are {', '.join(NAMES)} (e.g. max-goodput:90%)")
    if not share:
        return Recipe(name, DEFAULT_ATTAINMENT)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(%?)\s*", share)
    value = (float(m[1]) / (100 if m[2] else 1)) if m else -1.0
    if not 0 < value <= 1:
        raise UsageError(f"--recipe {text!r}: the attainment is a share in (0, 100 %], e.g. max-goodput:90%")
    return Recipe(name, value)


def with_recipe(recipe: Recipe | None, slo_texts: list[str]) -> list[str]:
    """The SLOs a recipe judges by: the user's, and its attainment floor. Refused in one line: a recipe without a
    per-request limit (nothing would make a request bad) or beside an attainment floor of the user's own."""
    if recipe is None:
        return list(slo_texts)
    slos = parse_slo_option(slo_texts)
    if not any(s.metric in PER_REQUEST and s.op in ("<=", "<") for s in slos):
        raise UsageError(f"--recipe {recipe.name} needs a per-request limit to count good requests: add "
                         "--slo 'ttft.p90<=2s' (or tpot, e2e)")
    if any(s.metric == "good_request_fraction" and s.name is None for s in slos):
        raise UsageError(f"--recipe {recipe.name} sets good_request_fraction itself ({recipe.slo}): drop that --slo, "
                         "or the recipe")
    return [*slo_texts, recipe.slo]


def judged_slos(recipe_text: str, slo_texts: list[str], window: str = "run") -> list[SLO]:
    """A run's SLOs as its master parses them once: ``--slo`` and ``--recipe`` together, judged over ``window``."""
    return parse_slo_option(with_recipe(parse_recipe(recipe_text), slo_texts), window)
