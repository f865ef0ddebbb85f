"""Answers intact under load, the greedy reference check (``--reference N``): N prompts asked at temperature 0, first
alone (one at a time, before any user starts) and then again and again beside the load; each answer beside the load
compared token by token with the same prompt's answer alone. The run says the share identical (its Wilson interval),
where the diverged ones first parted (the token's position), the requests in flight from which they diverged and up
to which they stayed identical, per sweep step; ``--slo 'reference_identical>=100%'`` gates on it.

Why: a server's greedy answers can move with what it batches beside them (lm-evaluation-harness #4019; vLLM's
batch-invariant mode exists for it), and no load tool looks. The sender is ``plugin/load/reference.py``; the answers'
tokens are in the request log (``reference``), and this part is made from the logs when the run ends. The tokens are
the answer's text re-tokenized by the run's tokenizer (the output says so): identical text is identical tokens, and a
first divergence is at the token the two texts first part in.

Runs in one process (the alone pass must come before every process's load; a swarm's is left for later), and ends by
-t (its answers beside the load would count among --num-requests' N)."""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Mapping
from typing import Any

from vllm_load.errors import UsageError
from vllm_load.feature_spec import Feature
from vllm_load.features.integrity import share_rows, wilson
from vllm_load.metric_table import E2E, OUTPUT_TOKENS
from vllm_load.option_spec import Option, group

#: the SLO's metric, as a percentage
METRIC = "reference_identical"
#: what "by" says of the tokens compared
BY = {"text": "text re-tokenized by the run's tokenizer", "ids": "the server's token ids"}


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first position where two answers' tokens part (None: identical; a shorter one parts where it ends)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def in_flight_at(logs: list[dict[str, Any]]) -> Any:
    """A function: the requests of the logs in flight at a wall-clock time (started at or before it, not ended)."""
    starts = sorted(float(r["start"]) for r in logs)
    ends = sorted(float(r["start"]) + float(r.get(E2E) or 0.0) for r in logs)

    def count(t: float) -> int:
        return bisect.bisect_right(starts, t) - bisect.bisect_right(ends, t)

    return count


def _share(rows: list[dict[str, Any]]) -> dict[str, Any]:
    same = sum(1 for r in rows if r["at"] is None)
    lo, hi = wilson(same, len(rows))
    return {"compared": len(rows), "identical": same, "share": same / len(rows) if rows else None,
            "interval": [round(lo, 6), round(hi, 6)]}


def compare(logs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The part: every answer beside the load against its prompt's alone answer, from the request logs."""
    marked = [r for r in logs if r.get("reference")]
    if not marked:
        return None
    alone = {int(r["reference"]["i"]): r["reference"]["ids"] for r in marked if r["reference"]["alone"]}
    flight = in_flight_at(logs)
    rows = []
    for r in sorted((r for r in marked if not r["reference"]["alone"]), key=lambda r: r["start"]):
        ref = alone.get(int(r["reference"]["i"]))
        if ref is not None:
            rows.append({"at": first_divergence(ref, r["reference"]["ids"]), "flight": flight(float(r["start"])),
                         "step": r.get("step"), "start": r["start"]})
    part = _share(rows)
    part.update(prompts=len({int(r["reference"]["i"]) for r in marked}), alone=len(alone),
                by=marked[0]["reference"].get("by", "text"),
                tokens=max((int(r.get(OUTPUT_TOKENS) or 0) for r in marked if r["reference"]["alone"]), default=0))
    diverged = [r for r in rows if r["at"] is not None]
    if diverged:
        at = sorted(r["at"] for r in diverged)
        part["first_divergence"] = {"min": at[0], "median": at[len(at) // 2], "max": at[-1],
                                    "counts": {str(k): v for k, v in sorted(Counter(at).items())}}
        part["diverged_from"] = min(r["flight"] for r in diverged)  # requests in flight, itself included
        part["first_diverged_s"] = round(float(diverged[0]["start"]) - float(rows[0]["start"]), 3)
    same = [r["flight"] for r in rows if r["at"] is None]
    if same:
        part["identical_up_to"] = max(same)
    part["by_flight"] = {str(c): _share([r for r in rows if r["flight"] == c])
                         for c in sorted({r["flight"] for r in rows})}
    steps = sorted({int(r["step"]) for r in rows if r["step"] is not None})
    if len(steps) > 1:
        part["steps"] = {str(s): _share([r for r in rows if r["step"] == s]) for s in steps}
    return part


class Reference(Feature):
    name = "reference"
    tone = "note"
    options = group(
        "answers checked",
        Option("--reference", 0, "the greedy reference check: this many prompts asked at temperature 0, first alone "
               "(before the load) and then again beside it, each answer compared token by token with its answer "
               "alone: the share identical, where they part, from which concurrency; 'reference_identical>=100%' "
               "gates on it; 0: off", type=int),
        Option("--reference-tokens", 32, "--reference: the tokens of each reference answer (forced, as the load's)",
               type=int),
    )
    parts = ("plugin/load/reference.py",)
    before_load = "vllm_load.plugin.load.reference:before_load"
    slo_metrics = {METRIC: "%"}

    def validate(self, options: Any) -> None:
        count, tokens = int(getattr(options, "reference", 0) or 0), int(getattr(options, "reference_tokens", 32))
        if count < 0 or count > 1000:
            raise UsageError(f"--reference {count}: ask 1 to 1000 prompts (0: off), e.g. --reference 8")
        if count and tokens < 2:
            raise UsageError(f"--reference-tokens {tokens}: an answer to compare has at least 2 tokens")
        if count and (getattr(options, "master", False) or getattr(options, "worker", False)
                      or int(getattr(options, "processes", 0) or 0)):
            raise UsageError("--reference runs in one process: its prompts are asked alone before every process's "
                             "load (drop --master/--worker/--processes)")
        if count and int(getattr(options, "num_requests", 0) or 0):
            raise UsageError("--reference with --num-requests: its answers beside the load would count among the N; "
                             "end the run by -t")

    def from_logs(self, logs: list[dict[str, Any]], options: Mapping[str, Any],
                  measured: Mapping[str, Any] | None = None,
                  server: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        return compare(logs)

    def slo_value(self, part: Mapping[str, Any], metric: str, name: str | None) -> tuple[float | None, str]:
        if not part or not part.get("compared"):
            return None, "no reference answer beside the load had its answer alone to compare with"
        return float(part["identical"]) / float(part["compared"]), ""

    def lines(self, part: Mapping[str, Any], options: Mapping[str, Any]) -> list[str]:
        said = (f"{part['alone']} of {part['prompts']} prompts answered alone at temperature 0, "
                f"{part['tokens']} tokens, compared as {BY.get(part['by'], part['by'])}")
        if not part["compared"]:
            return [f"reference: no answer beside the load to compare ({said})"]
        lo, hi = part["interval"]
        head = (f"reference: {part['identical']} of {part['compared']} answers beside the load identical to the same "
                f"prompt alone ({part['share'] * 100:.1f} %, 95 % interval {lo * 100:.1f}-{hi * 100:.1f} %; {said})")
        out = [head]
        first = part.get("first_divergence")
        if first:
            upto = (f", identical up to {part['identical_up_to']}" if part.get("identical_up_to") is not None else "")
            out.append(f"reference: {part['compared'] - part['identical']} diverged, first at token {first['min']} "
                       f"(median {first['median']}, last {first['max']}), from {part['diverged_from']} requests in "
                       f"flight{upto}")
        for step, s in (part.get("steps") or {}).items():
            out.append(f"reference: step {step}: {s['identical']} of {s['compared']} identical "
                       f"({s['share'] * 100:.1f} %)")
        return out

    def compare_rows(self, a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> list[dict[str, Any]]:
        return share_rows(METRIC, "greedy answers identical", a, b)

    def json_keys(self, part: Mapping[str, Any] | None) -> dict[str, Any]:
        return {METRIC: part["share"]} if part and part.get("compared") else {}


FEATURE = Reference()
