"""``llm_stats.csv``: one row per metric and request name (and the total), for spreadsheets and Locust's
``--csv`` users: times in ms, tokens as counts, the same exact percentiles as everywhere else."""

from __future__ import annotations

import csv
import io

from vllm_load.metric_table import METRICS
from vllm_load.metrics.summary import RunSummary, metric_stats

STATS = ("count", "mean", "std", "min", "p50", "p90", "p95", "p99", "p99.9", "max")
HEAD = ("name", "metric", "unit", *STATS)


def llm_stats_csv(summary: dict) -> str:
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(HEAD)
    summary = RunSummary.of(summary)
    groups = [(n, s) for n, s in (summary.names or {}).items()] + [("total", summary)]
    for name, s in groups:
        for m in METRICS:
            values = metric_stats(s, m.key)
            if not values.count:
                continue
            row = [name, m.key, m.unit]
            for stat in STATS:
                v = values.at(stat) or 0.0
                row.append(int(v) if stat == "count" else round(v * m.scale, 6))
            out.writerow(row)
    return buf.getvalue()
