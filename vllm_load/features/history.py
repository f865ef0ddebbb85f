"""The performance history: every run recorded in a results store, and a run gated against its comparable past
(``--baseline 'last 5'``, ``--slo 'ttft.p99<=baseline*1.10'``) instead of a fixed number.

Why: a fixed threshold is too loose to catch a 10 % regression or too tight for a noisy machine; the noise of past
runs of the same configuration decides whether a change is real. This module is the feature's face (its options,
their checks, what it says, the references its relative SLOs are judged by); its mechanism, which opens the store
and reads run directories, is ``vllm_load/history/`` (``gate.at_end`` and ``gate.after_run``).

Its part of the summary: ``{"store": where, "baseline": {"spec", "asked", "runs": [ids], "why"}, "references":
{slo text: {...}}, "headline": [{metric, stat, value, baseline, spread, change, beyond}]}``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from vllm_load.errors import UsageError
from vllm_load.feature_spec import Feature
from vllm_load.option_spec import Option, group

#: ``--baseline``'s forms: "last N", "label:KEY=VALUE" (its latest N, N from "last N" beside it), or a run id
_LAST = re.compile(r"^last\s+(\d{1,4})$")
_LABEL = re.compile(r"^label:([A-Za-z0-9_.-]{1,64})=(.{0,256})$")
_RUN_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
#: "last" alone, and a label's runs: this many
DEFAULT_LAST = 5


def parse_baseline(text: str) -> dict[str, Any]:
    """``--baseline`` as {"last": N, "labels": {...}, "run_id": ...}; a malformed one refused with one line."""
    out: dict[str, Any] = {"last": 0, "labels": {}, "run_id": ""}
    for term in [t.strip() for t in str(text).split(",") if t.strip()]:
        if term == "last":
            out["last"] = DEFAULT_LAST
        elif m := _LAST.match(term):
            out["last"] = int(m.group(1))
            if out["last"] < 1:
                raise UsageError(f"--baseline {text!r}: 'last N' needs N >= 1, e.g. --baseline 'last 5'")
        elif m := _LABEL.match(term):
            out["labels"][m.group(1)] = m.group(2)
        elif _RUN_ID.match(term) and not term.startswith("label"):
            out["run_id"] = term
        else:
            raise UsageError(f"--baseline {text!r}: write 'last N', 'label:KEY=VALUE' (with ',last N' to take N of "
                             "them) or a run id, e.g. --baseline 'last 5'")
    if out["run_id"] and (out["last"] or out["labels"]):
        raise UsageError(f"--baseline {text!r}: a run id is the baseline alone; drop the other terms")
    if not out["run_id"] and not out["last"]:
        out["last"] = DEFAULT_LAST
    return out


#: a label's key and value, bounded (they are said on the console and the page)
LABEL_KEY_MAX, LABEL_VALUE_MAX = 64, 256
_LABEL_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,%d}$" % LABEL_KEY_MAX)


def parse_labels(values: list[str] | None) -> dict[str, str]:
    """``--label KEY=VALUE`` (repeatable) as a dict; a malformed one refused with one line."""
    out: dict[str, str] = {}
    for text in values or []:
        key, sep, value = str(text).partition("=")
        key = key.strip()
        if not sep or not _LABEL_KEY.match(key) or len(value) > LABEL_VALUE_MAX or not value.isprintable():
            raise UsageError(f"--label {text!r}: write KEY=VALUE (a key of letters, digits, '.', '-', '_' up to "
                             f"{LABEL_KEY_MAX}, a value up to {LABEL_VALUE_MAX} characters), e.g. --label commit=abc123")
        out[key] = value
    return out


def is_postgres(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def check_url(url: str) -> None:
    """``--results-db``: a file, sqlite:///PATH or postgresql://… without a password in it (one line otherwise)."""
    if is_postgres(url):
        if re.match(r"^postgres(?:ql)?://[^/@]*:[^/@]*@", url):
            raise UsageError("--results-db: a password in the URL would be logged and shown: give it in PGPASSWORD "
                             "or a ~/.pgpass file (PostgreSQL's own), and the URL without it")
    elif "://" in url and not url.startswith("sqlite:///"):
        raise UsageError(f"--results-db {url.split('://')[0]}://…: give a file (SQLite), sqlite:///PATH or "
                         "postgresql://USER@HOST/DB")


def said(spec: Mapping[str, Any], runs: int) -> str:
    """What the baseline is, as a line says it: "the last 5 comparable runs", "run 2026…", "3 runs of commit=a"."""
    if spec.get("run_id"):
        return f"run {spec['run_id']}"
    where = " ".join(f"{k}={v}" for k, v in sorted((spec.get("labels") or {}).items()))
    return f"the last {runs} comparable runs" + (f" labelled {where}" if where else "")


class History(Feature):
    name = "history"
    options = group(
        "history",
        Option("--results-db", "", "the results store every run is recorded in: a file (SQLite) or "
               "postgresql://USER@HOST/DB (its password from PGPASSWORD or ~/.pgpass, never in the URL)",
               shown_default="history.sqlite beside the run directory", web=False),
        Option("--no-history", False, "do not record this run in the results store", action="store_true"),
        Option("--label", [], "a label of the run in the store, KEY=VALUE (repeatable): --label commit=abc123 "
               "--label vllm=0.33.0; the server's version is one already", action="append", web=False),
        Option("--baseline", "", "the runs a relative SLO (ttft.p99<=baseline*1.10, output_throughput>=baseline-5%) "
               "is judged against: 'last N' comparable runs (same load fingerprint, trusted), 'label:KEY=VALUE' "
               "(with ',last N'), or a run id; fewer than asked: the SLO cannot be judged (exit code 3)"),
    )
    parts = ("history/gate.py", "history/record.py", "history/store.py", "history/baseline.py", "history/cli.py")
    tone = "note"
    at_end = "vllm_load.history.gate:at_end"
    after_run = "vllm_load.history.gate:after_run"

    def validate(self, options: Any) -> None:
        parse_labels(getattr(options, "label", None))
        check_url(str(getattr(options, "results_db", "") or ""))
        if getattr(options, "baseline", ""):
            parse_baseline(options.baseline)

    def references(self, part: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
        return dict(part.get("references") or {})

    def lines(self, part: Mapping[str, Any], options: Mapping[str, Any]) -> list[str]:
        out = []
        if part.get("building") is not None:
            out.append(f"history: {part['building']} comparable runs in {part.get('store')} so far; {DEFAULT_LAST} "
                       "make a baseline the report compares this load with")
        base = part.get("baseline") or {}
        if base and base.get("why"):
            out.append(f"history: no baseline: {base['why']}")
        for h in part.get("headline") or []:
            out.append(f"history: {h['label']} {h['shown']}: {h['change']:+.1f} % against {base.get('said')} "
                       f"(spread ±{h['spread_pct']:.1f} %): {'CHANGED' if h['beyond'] else 'no change'}")
        return out

    def charts(self, part: Mapping[str, Any]) -> list[dict[str, Any]]:
        """A small trend per headline metric: the baseline's runs, oldest first, and this run last."""
        out = []
        for h in part.get("headline") or []:
            scale, unit = (1000.0, "ms") if h.get("stat") else (1.0, "tok/s")
            values = [float(v) * scale for v in h.get("values") or []]
            if not values:
                continue
            n = len(values)
            out.append({"id": f"history-{h['metric']}-{h.get('stat') or 'run'}",
                        "title": f"{h['label']} against {n} comparable run{'s' if n != 1 else ''}",
                        "x_label": "run (oldest first; this run last)", "y_label": unit,
                        "x": [float(i) for i in range(1, n + 2)], "y_range": None, "kind": "level",
                        "x_integers": True, "height": 140,
                        "series": [{"label": "comparable runs", "values": [*values, None]},
                                   {"label": "this run", "values": [*([None] * n), float(h["value"]) * scale]}]})
        return out

    def json_keys(self, part: Mapping[str, Any] | None) -> dict[str, Any]:
        base = (part or {}).get("baseline") or {}
        return {"baseline_runs": list(base.get("runs") or [])} if base else {}


FEATURE = History()
