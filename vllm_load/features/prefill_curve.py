"""The prefill curve: TTFT by the prompt's input length, in 8 equal-count bins of a run whose prompts vary
(``--input-tokens 128-8192``), and its least-squares line (what a prompt costs before its first token, per 1k input
tokens, and the fixed part). Made from the request logs at the run's end (``metrics/shape/curves.prefill_from_logs``, this
feature's mechanism: ``at_logs``); said on the console and in the report, and drawn among the distributions.

A line that falls (a negative slope) is no prefill cost: it is said as what it is (TTFT did not rise with the
prompt; queueing or noise decide it here), not printed as a result ("+ -11.00 ms per 1k input tokens")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_load.feature_spec import Feature

#: the bins of the curve (metrics/shape/curves.BINS)
BINS = 8


def describe(c: Mapping[str, Any]) -> str:
    lo, hi = c["tokens_range"]
    over = f"({len(c['points'])} bins of {lo:,}-{hi:,} tokens)"
    if c["ms_per_1k_tokens"] < 0:
        return (f"prefill curve: TTFT p50 did not rise with the input length (its line falls "
                f"{-c['ms_per_1k_tokens']:.2f} ms per 1k input tokens {over}): queueing or noise decide TTFT here, "
                "not the prompt's prefill")
    return f"prefill curve: TTFT p50 {c['intercept_ms']:.1f} ms + {c['ms_per_1k_tokens']:.2f} ms per 1k input tokens {over}"


def _rounded(values: list[float]) -> list[float]:
    return [round(v, 3) for v in values]


class PrefillCurve(Feature):
    name = "prefill_curve"
    tone = "note"
    parts = ("metrics/shape/curves.py",)
    at_logs = "vllm_load.metrics.shape.curves:prefill_from_logs"

    def lines(self, part: Mapping[str, Any], options: Mapping[str, Any]) -> list[str]:
        return [describe(part)]

    def charts(self, part: Mapping[str, Any]) -> list[dict[str, Any]]:
        """TTFT p50 and p90 by input length, and the fitted line, among the report's distributions."""
        xs = [float(p["tokens"]) for p in part["points"]]
        line = [part["intercept_ms"] + part["ms_per_1k_tokens"] * x / 1000 for x in xs]
        return [{"id": "prefill-curve", "title": "Prefill curve: TTFT by input length", "x_label": "input tokens",
                 "y_label": "TTFT (ms)", "x": xs, "y_range": None, "kind": "level", "group": "distributions",
                 "series": [{"label": "TTFT p50", "values": _rounded([p["ttft_p50"] * 1000 for p in part["points"]])},
                            {"label": "TTFT p90", "values": _rounded([p["ttft_p90"] * 1000 for p in part["points"]])},
                            {"label": "fit", "values": _rounded(line), "dash": True}]}]


FEATURE = PrefillCurve()
