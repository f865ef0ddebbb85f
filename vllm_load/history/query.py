"""What the history is asked: a metric named as the store keeps it, and one load's series of it with its change
points (``vllm-load history show``, the history page, the benchmark)."""

from __future__ import annotations

import re
from typing import Any

from vllm_load.history import changes
from vllm_load.history.store import Store

_STAT = re.compile(r"^(.+)\.(p\d{1,2}(?:\.\d+)?|mean|max|min|std|count)$")


def parse_metric(text: str) -> tuple[str, str]:
    """``ttft.p99`` as ("ttft", "p99"); a run-level figure (``output_token_rate``) has no statistic."""
    m = _STAT.match(text.strip())
    return (m.group(1), m.group(2)) if m else (text.strip(), "")


def series(store: Store, metric: str, stat: str, fingerprint: str, labels: dict[str, str],
           since: float) -> dict[str, Any]:
    """One metric's series of one load, its change points over the trusted runs (untrusted ones kept, marked)."""
    if not fingerprint:  # the newest run's load: a series mixes no loads
        newest = store.runs(labels=labels, since=since, limit=1, newest_first=True)
        fingerprint = str(newest[0]["fingerprint"]) if newest else ""
    points = store.series(metric, stat, fingerprint, labels, since)
    judged = [p for p in points if p["trusted"] and p["valid"]]
    found = changes.find([float(p["value"]) for p in judged])
    return {"metric": metric, "stat": stat, "fingerprint": fingerprint, "points": points,
            "changes": [{**c.to_json(), "run_id": judged[c.index]["run_id"]} for c in found],
            "noise": changes.noise([float(p["value"]) for p in judged])}
