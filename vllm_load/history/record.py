"""What a run is made of in the results store, read from its run directory (the same at a run's end and in
``vllm-load history import``): its row (times, target, trust, exit code, the fingerprint of its load), its labels,
every metric's count, mean and percentiles, the rates and server-side figures, the SLO verdicts, the 10 s window
medians, and the exact histograms (``llm_stats.json``'s, so that runs can be merged and re-judged later).

The fingerprint says what shapes the load, so that like is compared with like: the locustfile, the workload,
load-shape, request-body and dataset options, users, spawn rate and duration, the model and whether the target is
the emulator. Not in it: what names or judges a run (ids, SLOs, outputs, labels), and the server's own settings
(its version, the emulator's timings): a history exists to compare those."""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

from vllm_load.errors import UsageError
from vllm_load.metric_table import WINDOWED
from vllm_load.features.history import parse_labels
from vllm_load.history.store import RunRecord
from vllm_load.metrics.summary import RunSummary, metric_stats
from vllm_load.metrics.judge.verdict import Verdict
from vllm_load.metrics.stats import LLMStats
from vllm_load.rundir.files import RunDir

#: the option groups whose values shape the load (``options.OPTIONS``' groups)
LOAD_GROUPS = ("workload", "images and audio", "load shape", "request body", "datasets and traces")
#: within them, what does not: a run's own seed and salt make its prompts unique, not different in kind
NOT_LOAD = frozenset({"seed", "salt", "capture_header"})
#: Locust's own options that shape the load
LOCUST_LOAD = ("num_users", "spawn_rate", "run_time")
#: the run-level figures kept as metrics (stat "")
RATES = ("requests", "succeeded", "failed", "error_rate", "duration_s", "request_rate", "output_token_rate",
         "total_token_rate", "goodput", "good_request_fraction", "input_drift_fraction", "outage_seconds",
         "cached_fraction")


def load_options() -> frozenset[str]:
    from vllm_load.options import OPTIONS

    return frozenset(o.dest for o in OPTIONS if o.group in LOAD_GROUPS and o.dest not in NOT_LOAD)


def load_of(config: dict[str, Any]) -> dict[str, Any]:
    """What shapes the run's load, from its config.json: the fingerprint's inputs (kept, so a page can say them)."""
    opts = config.get("options") or {}
    shaped = load_options()
    out: dict[str, Any] = {k: opts.get(k) for k in sorted(shaped) if k in opts}
    out.update({k: opts.get(k) for k in LOCUST_LOAD if k in opts})
    files = opts.get("locustfile") or ""
    out["locustfile"] = ",".join(sorted(Path(f).name for f in str(files).split(",") if f))
    out["model"] = config.get("model") or opts.get("model") or ""
    out["target"] = "emulator" if config.get("target_is_emulator") else "server"
    return out


def fingerprint(load: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(load, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _finite(value: Any) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _metrics(summary: RunSummary, server: dict[str, Any] | None) -> list[tuple[str, str, float]]:
    out: list[tuple[str, str, float]] = []
    for metric in sorted(summary.metrics or {}):
        stats = metric_stats(summary, metric)
        if not stats.count:
            continue
        out += [(metric, stat, v) for stat, raw in sorted(stats.items()) if (v := _finite(raw)) is not None]
    out += [(k, "", v) for k in RATES if (v := _finite(getattr(summary, k))) is not None]
    out += [(f"server.{k}", "", v) for k, raw in sorted((server or {}).items())
            if not isinstance(raw, bool) and (v := _finite(raw)) is not None]
    return out


def _windows(kept: dict[str, Any]) -> list[tuple[str, float, float, int]]:
    """The 10 s windows' medians, from llm_stats.json as already read (its histograms, wire form)."""
    start = float(kept.get("start") or 0.0)
    out = []
    for at, hists in sorted(LLMStats.from_wire(kept["stats"]).windows.items()):
        for metric in WINDOWED:
            h = hists.get(metric)
            if h is not None and h.count:
                out.append((metric, max(0.0, round(float(at) - start, 3)), float(h.percentile(50)), int(h.count)))
    return out


def of_run_dir(path: str | Path, labels: dict[str, str] | None = None, exit_code: int | None = None) -> RunRecord:
    """The record of one finished run directory (its summary.json written); refused with one line otherwise.
    ``exit_code``: the process's, where it is not the verdict's (user tasks raised: 1)."""
    p = Path(path)
    rd = RunDir(p)
    try:
        config = json.loads(rd.config.read_text())
        data = json.loads(rd.summary_json.read_text())
        stats = rd.stats.read_text()
    except (OSError, ValueError) as exc:
        raise UsageError(f"{p} is not a finished run directory ({exc.__class__.__name__}): it needs config.json, "
                         "summary.json and llm_stats.json") from None
    summary = RunSummary.from_json(data.get("summary") or {})
    verdict = Verdict.from_json(data)
    kept = json.loads(stats)
    load = load_of(config)
    found = {**parse_labels((config.get("options") or {}).get("label")), **(labels or {})}
    if config.get("server_version"):
        found.setdefault("server_version", str(config["server_version"]))
    row = {"run_id": str(config.get("run_id") or kept.get("run_id") or p.name),
           "started": float(kept.get("start") or 0.0), "ended": float(kept.get("end") or 0.0),
           "recorded": time.time(), "fingerprint": fingerprint(load),
           "target_kind": str(config.get("target_kind") or ""), "model": str(config.get("model") or ""),
           "server_version": str(config.get("server_version") or ""), "trusted": int(not verdict.distrusted),
           "valid": int(bool(data.get("valid", True))), "exit_code": int(data.get("exit_code") or 0) if exit_code is None else int(exit_code),
           "verdict": str(data.get("verdict") or ""), "requests": int(summary.requests or 0),
           "report": str((p / "report.html").resolve()), "load": json.dumps(load, sort_keys=True, default=str),
           "config": json.dumps(config, sort_keys=True), "summary": json.dumps(data, sort_keys=True, default=str),
           "stats": stats}
    slos = [(str(c.get("slo")), bool(c.get("passed")), _finite(c.get("value")), str(c.get("detail") or ""))
            for c in data.get("slo") or []]
    return RunRecord(row, found, _metrics(summary, data.get("server")), slos, _windows(kept))
