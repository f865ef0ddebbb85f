"""The report's interactive charts as data: each a title, axis labels with units, an x grid and named series, which
``static/charts.js`` draws with uPlot (values on hover, drag to zoom, double-click to reset, click a legend entry to
hide its series). Client and server share one time axis, seconds since the run started; outages and an
over-saturation finding are marked on every timeline chart."""

from __future__ import annotations

import math
from typing import Any

from vllm_load.metric_table import BY_KEY, E2E, ITL, ITL_TOKEN, TPOT, TTFT
from vllm_load.report.console import ITL_CHUNK_ONLY, ITL_ONE_ROW, table_rows
from vllm_load.rundir.files import Run
from vllm_load.metrics.stats import WINDOW_S
from vllm_load.metrics.summary import metric_stats

#: the distributions' x axis: "nines" (-log10 of the share above), so p50, p90, p99 and p99.9 sit evenly apart
NINES = [round(i * 0.02, 2) for i in range(0, 151)]  # 0 .. 3 nines (p0 .. p99.9); charts.js labels p50 .. p99.9
#: the percentile at each point of that axis
NINES_PERCENTILES = [100.0 * (1 - 10 ** -n) for n in NINES]


def chart(cid: str, title: str, x_label: str, y_label: str, x: list[float], series: list[dict[str, Any]],
           y_range: tuple[float, float] | None = None, kind: str = "time", y2_label: str = "") -> dict[str, Any]:
    """One chart's spec, as static/charts.js draws it; ``y2_label``: the unit of the series marked
    ``"axis": "y2"``, on a right-hand axis of its own."""
    out = {"id": cid, "title": title, "x_label": x_label, "y_label": y_label, "x": x, "series": series,
           "y_range": y_range, "kind": kind}
    if y2_label:
        out["y2_label"] = y2_label
    return out


def pareto(points: list[tuple[float, float, Any]]) -> list[tuple[float, float, Any]]:
    """The points no other beats on both axes (more tokens/s in total and per user), by the first axis."""
    front = [p for p in points if not any(q[0] >= p[0] and q[1] >= p[1] and (q[0], q[1]) != (p[0], p[1])
                                          for q in points)]
    return sorted(front, key=lambda p: p[0])


def pareto_steps(points: list[tuple[float, float, Any]], cid: str, title: str) -> dict[str, Any]:
    """Every point (tokens/s in total, per user) and their Pareto front as a step function, as MLPerf Endpoints
    draws a sweep's: at any throughput up to a front point's, that point's per-user speed is reachable."""
    xs = sorted({round(x, 3) for x, _, _ in points})
    front = {round(x, 3): y for x, y, _ in pareto(points)}
    every: dict[float, float] = {}
    for x, y, _ in points:
        every[round(x, 3)] = max(y, every.get(round(x, 3), y))
    return chart(cid, title, "output tokens/s (total)", "tok/s per user", xs,
                 [{"label": "Pareto front", "values": rounded([front.get(x) for x in xs]), "step": True},
                  {"label": "every point", "values": rounded([every[x] for x in xs]), "dash": True}], kind="level")


def rounded(values: list[float | None], digits: int = 3) -> list[float | None]:
    return [None if v is None or (isinstance(v, float) and math.isnan(v)) else round(v, digits) for v in values]


def prefix_hit_rates(series: list[dict]) -> list[tuple[float, float]]:
    """(time, share of the prompt tokens looked up in the interval that hit the prefix cache)."""
    out = []
    for a, b in zip(series, series[1:]):
        q0, q1 = a.get("prefix_cache_queries_total"), b.get("prefix_cache_queries_total")
        h0, h1 = a.get("prefix_cache_hits_total"), b.get("prefix_cache_hits_total")
        if None not in (q0, q1, h0, h1) and q1 > q0:
            out.append((b["t"], (h1 - h0) / (q1 - q0)))
    return out


def _window_at(w: float, t0: float, end: float | None) -> float:
    """Where a latency window is plotted, on the run's clock: the middle of its part within the run. Windows sit on
    the wall clock's 10 s grid, so the first began before the run (plotted at its middle, -3.3 s) and the last may
    end after it."""
    lo, hi = max(w, t0), w + WINDOW_S
    if end is not None:
        hi = max(lo, min(hi, end))
    return round((lo + hi) / 2 - t0, 3)


def timeline(run: Run) -> list[dict[str, Any]]:
    """Client latency per 10 s window and output tokens/s; beneath, the server's requests, KV cache, token rates and
    prefix-cache hit rate (when the run directory holds its series)."""
    return timeline_of(run.stats, run.start, run.server)


def timeline_of(s: Any, t0: float, server: list[dict]) -> list[dict[str, Any]]:
    """``timeline`` of an ``LLMStats`` and the server's samples: a finished run's, or a running one's (the web UI's
    live charts draw the same charts)."""
    out = []
    wins = sorted(s.windows)
    series = []
    for metric in (TTFT, ITL_TOKEN):
        got = [(w, s.windows[w].get(metric)) for w in wins]
        for p in (50, 99):
            series.append({"label": f"{BY_KEY[metric].title} p{p}", "dash": metric != TTFT,
                           "values": rounded([h.percentile(p) * 1000 if h is not None and h.count else None
                                             for _, h in got])})
    secs = sorted(s.tokens_per_second)
    if wins:
        out.append(chart("latency", "Client latency per 10 s window (by request start)", "seconds since the run started",
                          "ms", [_window_at(w, t0, secs[-1] + 1 if secs else None) for w in wins], series))
    if secs:
        out.append(chart("throughput", "Output tokens per second (client)", "seconds since the run started", "tok/s",
                          [x - t0 for x in secs], [{"label": "output tok/s",
                                                    "values": [s.tokens_per_second[x] for x in secs]}]))
    if server:
        t = [round(x["t"] - t0, 3) for x in server]

        def col(key: str, scale: float = 1.0) -> list[float | None]:
            return rounded([None if x.get(key) is None else x[key] * scale for x in server])
        out.append(chart("server-requests", "Server: requests running and waiting", "seconds since the run started",
                          "requests", t, [{"label": "running", "values": col("running")},
                                          {"label": "waiting", "values": col("waiting")}]))
        out.append(chart("server-kv", "Server: KV-cache usage", "seconds since the run started", "%", t,
                          [{"label": "KV-cache usage %", "values": col("kv_cache_usage", 100.0)}], (0.0, 100.0)))
        if any(x.get("preemptions_rate") for x in server):
            out.append(chart("server-preemptions", "Server: preemptions", "seconds since the run started", "per s", t,
                              [{"label": "preemptions/s", "values": col("preemptions_rate")}]))
        out.append(chart("server-tokens", "Server: token rates", "seconds since the run started", "tok/s", t,
                          [{"label": "prompt tok/s", "values": col("prompt_tokens_rate")},
                           {"label": "generation tok/s", "values": col("generation_tokens_rate")}]))
        hits = prefix_hit_rates(server)
        if hits:
            out.append(chart("server-prefix", "Server: prefix-cache hit rate", "seconds since the run started", "%",
                              [round(x - t0, 3) for x, _ in hits],
                              [{"label": "prefix-cache hit rate %", "values": rounded([100 * r for _, r in hits])}],
                              (0.0, 100.0)))
    return out


def distributions(run: Run) -> list[dict[str, Any]]:
    """Each latency metric's value at every percentile, p0 to p99.9, on a "nines" axis: the tail is as wide as the
    body. ITL per chunk and per token share a chart (one line when every chunk carried one token)."""
    out = []
    grid = NINES_PERCENTILES
    # the table's decision: where ITL per chunk and per token are one row, they are one line
    one_itl = any(r["metric"].startswith((ITL_ONE_ROW, ITL_CHUNK_ONLY)) for r in table_rows(run.summary))
    for key, extra in ((TTFT, None), (ITL, None if one_itl else ITL_TOKEN), (TPOT, None), (E2E, None)):
        h = run.stats.hists[key]
        if not h.count:
            continue
        series = [{"label": BY_KEY[key].title, "values": rounded(curve(h, grid))}]
        other = run.stats.hists[extra] if extra else None
        if other is not None and other.count:
            series.append({"label": BY_KEY[extra].title, "dash": True, "values": rounded(curve(other, grid))})
        out.append(chart(f"dist-{key}", f"{BY_KEY[key].title} by percentile", "percentile", "ms", NINES, series,
                          kind="nines"))
    return out


def curve(h: Any, grid: list[float]) -> list[float]:
    """The histogram's value in ms at each percentile of ``grid``."""
    return [v * 1000 for v in h.percentiles(grid)]


def markers(run: Run) -> dict[str, Any]:
    """What every timeline chart marks: outage and failure-storm spans, the over-saturation onset and its span, the
    fault plan's actions (from their start to their end)."""
    sat = run.summary.saturation
    return {"spans": [{"from": w.start - run.start, "to": w.end - run.start,
                       "kind": "outage" if w.outage else "storm"} for w in (run.summary.outages or [])],
            "saturation": {"from": sat.onset_s, "to": sat.at_s} if sat else None,
            "faults": [{"from": f["start"] - run.start, "to": (f["end"] or f["start"]) - run.start, "label": f["label"]}
                       for f in (run.summary.faults or [])]}


def by_level(runs: list[Any], levels: list[float], level: str) -> list[dict[str, Any]]:
    """A sweep's throughput and latency against its level (users or req/s): one point per run or step."""
    def metric(key: str, stat: str) -> list[float | None]:
        return rounded([metric_stats(r.summary, key).at(stat) * 1000 if metric_stats(r.summary, key).count
                       else None for r in runs])
    return [
        chart("sweep-throughput", f"Throughput against the {level}", level, "output tok/s", levels,
               [{"label": "output tok/s", "values": rounded([r.summary.output_token_rate for r in runs])},
                {"label": "req/s", "values": rounded([r.summary.request_rate for r in runs]), "axis": "y2"}],
               kind="level", y2_label="req/s"),
        chart("sweep-latency", f"Latency against the {level}", level, "ms", levels,
               [{"label": "TTFT mean", "values": metric(TTFT, "mean")},
                {"label": "TTFT p99", "values": metric(TTFT, "p99"), "dash": True},
                {"label": "E2E mean", "values": metric(E2E, "mean")},
                {"label": "E2E p99", "values": metric(E2E, "p99"), "dash": True}], kind="level"),
    ]


def a_against_b(a: Run, b: Run) -> list[dict[str, Any]]:
    """Two runs' distributions overlaid, metric by metric (A solid, B dashed), on the nines axis."""
    grid = NINES_PERCENTILES
    out = []
    for key in (TTFT, ITL, TPOT, E2E):
        ha, hb = a.stats.hists[key], b.stats.hists[key]
        if not ha.count and not hb.count:
            continue
        series = [{"label": f"{label} {BY_KEY[key].title}", "dash": label == "B",
                   "values": rounded(curve(h, grid)) if h.count else [None] * len(grid)}
                  for label, h in (("A", ha), ("B", hb))]
        out.append(chart(f"ab-{key}", f"{BY_KEY[key].title} by percentile: A against B", "percentile", "ms", NINES,
                          series, kind="nines"))
    return out
