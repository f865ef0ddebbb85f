"""The baseline a run is judged against: comparable runs from the store (the same load fingerprint, trusted and
valid, before this one), and what each relative SLO's limit and each headline metric's change rest on.

The noise rule is ``compare``'s: a change is beyond the baseline when it is more than twice the baseline runs'
spread (their standard deviation) and more than the histograms' 0.1 % error; a baseline of one run has no spread,
so only the error counts (say so: one run is a weak baseline)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_load.errors import EXIT_INTERRUPTED, EXIT_INVALID, EXIT_OUTPUT, EXIT_UNTRUSTWORTHY
from vllm_load.features.history import parse_baseline, said
from vllm_load.history.store import Store, describe
from vllm_load.metrics.judge.slo import SLO, parse_slo, value_of

#: a run with one of these exit codes measured nothing a baseline can stand on
NOT_COMPARABLE = frozenset({EXIT_INVALID, EXIT_UNTRUSTWORTHY, EXIT_OUTPUT, EXIT_INTERRUPTED})
#: the headline metrics said against the history on the console and in the report
HEADLINE = (("TTFT p99", "ttft.p99<=baseline"), ("ITL p99", "itl_token.p99<=baseline"),
            ("E2E p99", "e2e.p99<=baseline"), ("output tok/s", "output_token_rate>=baseline"))
HIST_ERROR = 0.001


@dataclass
class Baseline:
    spec: dict[str, Any]
    asked: int
    runs: list[str] = field(default_factory=list)  # run ids, newest first
    summaries: list[dict[str, Any]] = field(default_factory=list)  # their summary.json, in that order
    why: str = ""  # why it cannot judge (fewer runs than asked, an unknown run id)

    def to_json(self, text: str) -> dict[str, Any]:
        return {"spec": text, "asked": self.asked, "runs": self.runs, "why": self.why,
                "said": said(self.spec, len(self.runs))}


def select(store: Store, text: str, fingerprint: str, before: float, exclude: str) -> Baseline:
    """The runs ``--baseline`` names that are comparable with a run of ``fingerprint`` started at ``before``."""
    spec = parse_baseline(text)
    if spec["run_id"]:
        rows = store.runs(run_id=spec["run_id"]) if spec["run_id"] != exclude else []
        base = Baseline(spec, 1)
        if not rows:
            base.why = f"no run {spec['run_id']} in the results store {describe(store.url)}"
        elif rows[0]["fingerprint"] != fingerprint:
            base.why = (f"run {spec['run_id']} ran another load (fingerprint {rows[0]['fingerprint']}, this run's "
                        f"{fingerprint}): compare like with like")
        elif not _comparable(rows[0]):
            base.why = f"run {spec['run_id']} is not trusted or not valid (exit code {rows[0]['exit_code']})"
        else:
            base.runs = [spec["run_id"]]
    else:
        asked = int(spec["last"])
        base = Baseline(spec, asked)
        rows = [r for r in store.runs(fingerprint, spec["labels"], until=before, newest_first=True,
                                      trusted_only=True) if r["run_id"] != exclude and _comparable(r)][:asked]
        base.runs = [r["run_id"] for r in rows]
        if len(rows) < asked:
            where = "".join(f", labelled {k}={v}" for k, v in sorted(spec["labels"].items()))
            base.why = (f"{len(rows)} comparable run{'s' if len(rows) != 1 else ''} in {describe(store.url)} "
                        f"(the same load, fingerprint {fingerprint}{where}, trusted), {asked} asked")
    for rid in base.runs:
        found = store.summary(rid)
        base.summaries.append(found[0] if found else {})
    return base


def _comparable(row: Mapping[str, Any]) -> bool:
    return bool(row["trusted"]) and bool(row["valid"]) and int(row["exit_code"]) not in NOT_COMPARABLE


def reference(slo: SLO, base: Baseline) -> dict[str, Any]:
    """A relative SLO's reference: the baseline runs' median value of its metric, their spread, what it rests on."""
    if base.why:
        return {"baseline": None, "why": base.why}
    values = [v for data in base.summaries
              if (v := value_of(slo, data.get("summary") or {}, data.get("server"))) is not None]
    if len(values) < len(base.runs):
        return {"baseline": None, "why": f"{len(base.runs) - len(values)} of the baseline's {len(base.runs)} runs "
                                         f"did not measure {slo.metric}"}
    median = float(statistics.median(values))
    spread = float(statistics.stdev(values)) if len(values) > 1 else 0.0
    ids = ", ".join(base.runs[:3]) + (f" and {len(base.runs) - 3} more" if len(base.runs) > 3 else "")
    rel = f"±{spread / median * 100:.1f} %" if median else "±0"
    return {"baseline": median, "spread": spread, "values": values, "runs": base.runs,
            "said": f"median of {len(values)} run{'s' if len(values) != 1 else ''}: {ids}; spread {rel}"
                    + ("; one run has no spread" if len(values) == 1 else "")}


def beyond(value: float, ref: Mapping[str, Any]) -> bool:
    base, spread = float(ref["baseline"]), float(ref.get("spread") or 0.0)
    return abs(value - base) > max(2 * spread, HIST_ERROR * abs(base))


def headline(summary: Mapping[str, Any], server: dict[str, Any] | None, base: Baseline) -> list[dict[str, Any]]:
    """The headline metrics against the baseline (each the run's value, the baseline's, the change, the spread)."""
    if base.why or not base.runs:
        return []
    out = []
    for label, text in HEADLINE:
        slo = parse_slo(text)
        value = value_of(slo, summary, server)
        ref = reference(slo, base)
        if value is None or ref.get("baseline") is None or not ref["baseline"]:
            continue
        b = float(ref["baseline"])
        shown = f"{value * 1000:.1f} ms" if slo.stat else f"{value:.1f}"
        out.append({"label": label, "metric": slo.metric, "stat": slo.stat, "value": value, "baseline": b,
                    "runs": base.runs[::-1], "values": [float(v) for v in ref["values"]][::-1],  # oldest first
                    "shown": shown, "change": (value - b) / b * 100, "spread_pct": float(ref["spread"]) / b * 100,
                    "beyond": beyond(value, ref)})
    return out
