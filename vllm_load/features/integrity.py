"""Answers intact under load, first part: every answer to a request that offered tools has its tool calls checked
(``client/tool_integrity.py``: a name the request offered, arguments that parse and fit the tool's schema, no empty
call delta) and its text (no call markup left in it, its tags balanced, no special token of the tokenizer), and the
run says the share whole, per name and per sweep step, with its Wilson interval, the violations by kind, and gates on
it: ``--slo 'integrity>=99.9%'``.

Why: a busy server's parser can break calls it makes whole alone (vLLM #48089, #54701), and a load test that times
answers without reading them passes it. Each request's check is in its record (``integrity`` in the request log);
the share is counted from the logs when the run ends, so a swarm's is exact. No option: a request with tools is
checked."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from vllm_load.feature_spec import Feature

#: the SLO's metric, as a percentage
METRIC = "integrity"
#: how many violating requests the summary names (their start and name), for a look in the log
EXAMPLES = 5
#: the interval's confidence
CONFIDENCE = 0.95


def wilson(whole: int, checked: int) -> tuple[float, float]:
    """The share's Wilson score interval (scipy's), the one a share of a few hundred answers needs."""
    if not checked:
        return 0.0, 1.0
    from scipy.stats import binomtest

    ci = binomtest(whole, checked).proportion_ci(confidence_level=CONFIDENCE, method="wilson")
    return float(ci.low), float(ci.high)


def share_rows(metric: str, title: str, a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """A share's row in ``vllm-load compare``: A's and B's, apart when their Wilson intervals do not overlap."""
    if not a or not b or a.get("share") is None or b.get("share") is None:
        return []
    (alo, ahi), (blo, bhi) = a["interval"], b["interval"]
    return [{"metric": metric, "title": title, "unit": "%", "a": a["share"] * 100, "b": b["share"] * 100,
             "delta": (b["share"] - a["share"]) * 100,
             "pct": (b["share"] - a["share"]) / a["share"] * 100 if a["share"] else None,
             "significant": ahi < blo or bhi < alo}]


def _share(rows: list[dict[str, Any]]) -> dict[str, Any]:
    whole = sum(1 for r in rows if not r["integrity"])
    lo, hi = wilson(whole, len(rows))
    kinds = Counter(k for r in rows for k in set(r["integrity"]))
    return {"checked": len(rows), "whole": whole, "share": whole / len(rows) if rows else None,
            "interval": [round(lo, 6), round(hi, 6)], "kinds": dict(sorted(kinds.items()))}


class Integrity(Feature):
    name = "integrity"
    tone = "note"
    slo_metrics = {METRIC: "%"}

    def from_logs(self, logs: list[dict[str, Any]], options: Mapping[str, Any],
                  measured: Mapping[str, Any] | None = None,
                  server: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        rows = [r for r in logs if r.get("integrity") is not None and not r.get("warmup")]
        if not rows:
            return None
        part = _share(rows)
        names = sorted({str(r.get("name")) for r in rows if r.get("name")})
        if names:
            part["names"] = {n: _share([r for r in rows if r.get("name") == n]) for n in names}
        steps = sorted({int(r["step"]) for r in rows if r.get("step") is not None})
        if len(steps) > 1:
            part["steps"] = {str(s): _share([r for r in rows if r.get("step") == s]) for s in steps}
        part["examples"] = [{"start": r.get("start"), "name": r.get("name"), "kinds": r["integrity"]}
                            for r in rows if r["integrity"]][:EXAMPLES]
        return part

    def slo_value(self, part: Mapping[str, Any], metric: str, name: str | None) -> tuple[float | None, str]:
        found = part if name is None else (part.get("names") or {}).get(name)
        if not found or not found.get("checked"):
            return None, f"no answer of {name!r} offered tools" if name else "no request offered tools"
        return float(found["whole"]) / float(found["checked"]), ""

    def lines(self, part: Mapping[str, Any], options: Mapping[str, Any]) -> list[str]:
        lo, hi = part["interval"]
        said = f"95 % interval {lo * 100:.1f}-{hi * 100:.1f} %"
        if part["whole"] == part["checked"]:
            return [f"integrity: every answer to a request with tools whole, its calls and its text "
                    f"({part['checked']} of {part['checked']} checked; {said})"]
        kinds = ", ".join(f"{n} {k}" for k, n in part["kinds"].items())
        out = [f"integrity: {part['whole']} of {part['checked']} answers to requests with tools whole (calls and text) "
               f"({part['share'] * 100:.1f} %, {said}): {kinds}"]
        for step, s in (part.get("steps") or {}).items():
            out.append(f"integrity: step {step}: {s['whole']} of {s['checked']} whole ({s['share'] * 100:.1f} %)")
        return out

    def compare_rows(self, a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> list[dict[str, Any]]:
        return share_rows(METRIC, "answers with tools whole", a, b)

    def json_keys(self, part: Mapping[str, Any] | None) -> dict[str, Any]:
        return {"integrity": part["share"]} if part else {}


FEATURE = Integrity()
