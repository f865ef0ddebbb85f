"""A protected class (``--protect interactive``): what the other classes cost it. Its TTFT and inter-token gaps
alone (its requests that ended before any other class's first) against beside the others (those that began after),
from the request logs at the run's end (``metrics/judge/protection.py``, this feature's mechanism: ``at_logs``), said on
the console, in summary.md and the report, and gated: ``--slo 'ttft_penalty<=50%'``, ``itl_penalty``.

Why a module: it was written into seven hubs (options, slo, console, html, its template, the summary's fields, the
report's analyses); here it is one file and one mechanism, the first of the older features moved onto the seam."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_load.feature_spec import Feature
from vllm_load.metric_table import ITL, TTFT
from vllm_load.option_spec import Option, group

#: the SLO metrics: the penalty as a fraction (0.5: p99 half as long again beside the others)
METRICS = ("ttft_penalty", "itl_penalty")


def describe(p: Mapping[str, Any]) -> str:
    """``interactive beside the other classes: TTFT p99 +412% (21.0 ms alone, 107.5 ms beside), ITL p99 +3% (…)``."""
    if p.get("why"):
        return f"{p['name']}: cannot judge: {p['why']}"
    parts = []
    for metric, label in ((TTFT, "TTFT"), (ITL, "ITL")):
        a, b, penalty = p["alone"][f"{metric}_p99"], p["beside"][f"{metric}_p99"], p[f"{metric}_penalty"]
        if penalty is not None:
            parts.append(f"{label} p99 {penalty * 100:+.0f}% ({a * 1000:.1f} ms alone, {b * 1000:.1f} ms beside)")
    return (f"{p['name']} beside the other classes: " + ", ".join(parts or ["no TTFT or gap to compare"])
            + f"; {p['alone']['requests']} requests alone, {p['beside']['requests']} beside")


class Protection(Feature):
    name = "protection"
    tone = "note"
    options = group(
        "SLOs and gates",
        Option("--protect", "", "the requests named NAME are a protected class (mixed.py: interactive): their TTFT "
               "and ITL p99 alone (before any other request began) against beside the others, as ttft_penalty and "
               "itl_penalty (SLOs: 'ttft_penalty<=50%')"),
    )
    parts = ("metrics/judge/protection.py", "locustfiles/mixed.py")
    at_logs = "vllm_load.metrics.judge.protection:from_logs"
    slo_metrics = {m: "%" for m in METRICS}

    def slo_value(self, part: Mapping[str, Any], metric: str, name: str | None) -> tuple[float | None, str]:
        if not part:
            return None, "no class protected (--protect NAME)"
        if part.get(metric) is None:
            return None, part.get("why") or f"{part.get('name')} had no {metric[:-8].upper()} on one side"
        return float(part[metric]), ""

    def lines(self, part: Mapping[str, Any], options: Mapping[str, Any]) -> list[str]:
        return [f"protection: {describe(part)}"]


FEATURE = Protection()
