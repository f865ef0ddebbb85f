"""The history page: a chart per metric over one load's runs (uPlot, as the report's charts), each run a point
with its interval from its 10 s windows, untrusted runs apart and left out of the statistics, the level between
change points drawn as a step, and a table linking each run's report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_load.metric_table import BY_KEY, WINDOWED
from vllm_load.history.query import parse_metric, series
from vllm_load.history.store import Store, describe
from vllm_load.report.charts import chart
from vllm_load.report.page import render
from vllm_load.rundir.files import RunDir

#: what the page charts unless asked: (metric, stat, title, unit, scale)
DEFAULT = ("ttft.p99", "itl_token.p99", "e2e.p99", "output_token_rate")


def _chart(store: Store, text: str, found: dict[str, Any], index: int) -> dict[str, Any]:
    metric, stat = found["metric"], found["stat"]
    shown = BY_KEY.get(metric) if stat else None
    unit, scale = (shown.unit, shown.scale) if shown else ("", 1.0)
    points = found["points"]
    judged = [p for p in points if p["trusted"] and p["valid"]]
    # the level of each segment between change points, over the judged runs (a step at each change)
    bounds = [0, *[c["index"] for c in found["changes"]], len(judged)]
    level: dict[str, float] = {}
    for a, b in zip(bounds, bounds[1:]):
        seg = [float(p["value"]) for p in judged[a:b]]
        for p in judged[a:b]:
            level[p["run_id"]] = sum(seg) / len(seg) if seg else 0.0
    windows = store.windows([p["run_id"] for p in points], metric) if metric in WINDOWED else {}
    x = list(range(1, len(points) + 1))

    def col(fn: Any) -> list[float | None]:
        return [None if (v := fn(p)) is None else v * scale for p in points]

    series: list[dict[str, Any]] = [
        {"label": "trusted runs", "values": col(lambda p: float(p["value"]) if p["trusted"] and p["valid"] else None)},
        {"label": "untrusted (left out)", "values": col(lambda p: None if p["trusted"] and p["valid"] else float(p["value"]))},
        {"label": "level (between change points)", "values": col(lambda p: level.get(p["run_id"])), "step": True},
    ]
    if windows:
        series += [{"label": "lowest 10 s window's median", "dash": True,
                    "values": col(lambda p: min(windows[p["run_id"]]) if windows.get(p["run_id"]) else None)},
                   {"label": "highest 10 s window's median", "dash": True,
                    "values": col(lambda p: max(windows[p["run_id"]]) if windows.get(p["run_id"]) else None)}]
    title = f"{text}: {len(found['changes'])} change point{'s' if len(found['changes']) != 1 else ''}"
    return {**chart(f"h{index}", title, "run (oldest first)", unit or text, [float(v) for v in x], series, kind="level"),
            "x_integers": True}


def write_page(store: Store, out: Path, metrics: list[str], fingerprint: str, labels: dict[str, str],
               since: float) -> Path:
    charts, changes_rows, runs = [], [], None
    for i, text in enumerate(metrics or DEFAULT):
        metric, stat = parse_metric(text)
        found = series(store, metric, stat, fingerprint, labels, since)
        fingerprint = fingerprint or found["fingerprint"]
        if runs is None:
            runs = found["points"]
        if found["points"]:
            charts.append(_chart(store, text, found, i))
        changes_rows += [[text, c["run_id"], f"{c['shift'] * 100:+.1f} %", f"{c['p_value']:.2g}"]
                         for c in found["changes"]]
    listed = store.runs(fingerprint, labels, since) if fingerprint else []
    rows = [{"n": n, "run_id": r["run_id"], "labels": " ".join(f"{k}={v}" for k, v in sorted(r["labels"].items())),
             "trusted": bool(r["trusted"] and r["valid"]), "exit_code": r["exit_code"],
             "report": Path(r["report"]).as_uri() if r["report"] and Path(r["report"]).is_absolute() else ""}
            for n, r in enumerate(listed, 1)]
    page = render("history.html.j2", title=f"vllm-load history: load {fingerprint}", store=describe(store.url),
                  fingerprint=fingerprint, rows=rows, changes=changes_rows, charts={"history": charts})
    RunDir(out.parent).write(out, page)
    return out

