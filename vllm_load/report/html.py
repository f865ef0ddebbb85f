"""Rebuild a run's report from its run directory alone: report.html (from ``templates/report.html.j2``, its
interactive charts from ``charts.py``), summary.json/.md, vllm-result.json and llm_stats.csv.

The charts put client and server on one time axis (seconds since the run started): client TTFT/ITL percentiles
per window and output tokens/s, the server's running/waiting requests, KV-cache usage, preemptions and token rates
(from the sidecar's ``server.jsonl``, when present).
"""

from __future__ import annotations

from pathlib import Path
from collections.abc import Mapping
from typing import Any, NamedTuple

import yaml

from vllm_load.version import __version__
from vllm_load.report import charts
from vllm_load.metrics.shape.breakdown import (API_SERVER, BEFORE_SERVER, CLIENT_SIDE, LABELS, OUTSIDE, spans_line)
from vllm_load.metrics.judge.client_health import who_fell_behind
from vllm_load.metrics.fleet.disruption import describe as disruption_lines
from vllm_load.workload.scenarios import describe as scenario_line
from vllm_load.report.exports.llmd_report import llmd_report
from vllm_load.report.exports.mlperf_result import mlperf_result
from vllm_load.metrics.shape.reuse import describe as reuse_line
from vllm_load.metrics.summary import RunSummary
from vllm_load.metrics.summary_parts import ClientVerdict, Timing
from vllm_load.report.console import (ITL_CHUNK_ONLY, ITL_ONE_ROW, NAME_HEAD, columns, energy_line, group_head,
                                      name_rows, server_cells, shown, spec_line, steady_line, table_rows)
from vllm_load.report.page import render
from vllm_load.metrics.judge.verdict import Verdict, word
from vllm_load.report.analyses import complete
from vllm_load.report.results import finish
from vllm_load.metrics.judge.client_health import silent_workers
from vllm_load.metrics.fleet.server import server_summary
from vllm_load.rundir.files import Run, RunDir
from vllm_load.report.exports.csv_export import llm_stats_csv
from vllm_load.report.figures import markdown, write_figures
from vllm_load.report.load import load_line
from vllm_load.report.exports.vllm_result import run_logs, vllm_result
from vllm_load.metrics.judge.slo import parse_slo_option
from vllm_load.metrics.judge.verdict import feature_charts, feature_said, feature_sections
from vllm_load.metric_table import (
    CLIENT_OVERHEAD, KV_TRANSFER, SERVER_DECODE, SERVER_PREFILL, SERVER_QUEUE, TTFT)


def render_html(run: Run, verdict: Verdict) -> str:
    """The run's report page (``templates/report.html.j2``): the verdict first, then client side, server side, the
    interactive charts and the configuration."""
    s = run.summary
    server = server_summary(run.server)
    client = s.client or ClientVerdict()
    latency, itl_note = latency_table(s)
    changed, rest = _options_split(run.config.get("options", {}))
    drawn = feature_charts(s)  # each feature's charts, in the group each names (its own by default)
    overall = ("invalid" if verdict.invalid or verdict.cut else "untrustworthy" if not verdict.trust.passed else
               {True: "pass", False: "fail", None: "none"}[verdict.slo_passed])
    return render(
        "report.html.j2", name=run.path.name, run_id=str(run.config.get("run_id")), emulator=run.is_emulator,
        kind=run.target_kind, host=str(run.config.get("host")), model=str(run.config.get("model")), overall=overall,
        load=load_line(run.config.get("options"), s, run.config.get("plan")).removeprefix("Load: "),
        invalid=verdict.invalid, untrustworthy=verdict.untrustworthy,
        said=[(line.removeprefix("vllm-load: "), tone) for line, tone in feature_said(s, run.config.get("options", {}))],
        checks=[{"slo": c.slo, "word": word(c.passed), "detail": c.detail} for c in verdict.checks],
        slo_word=word(bool(verdict.slo_passed)), exit_code=verdict.exit_code,
        summary_rows=summary_rows(s), latency_head=latency[0], latency_rows=latency[1], itl_note=itl_note,
        steady=steady_line(s.steady, s.requests) if s.steady else "",
        named=name_rows(s), name_head=NAME_HEAD, by_target=name_rows(s, "targets"), target_head=group_head("targets"),
        client_saturated={"cause": client.cause or "client", "reasons": "; ".join(client.reasons),
                          "headline": who_fell_behind(client.cause),
                          "advice": client.advice or "add workers"} if client.saturated else None,
        saturation=s.saturation.text if s.saturation else None, outages=[w.text for w in s.outages or []],
        workers_lost=", ".join(s.workers_lost or []), silent=silent_workers(s),
        errors=list((s.errors or {}).items()),
        server_rows=server_cells(server) if server else [], spec=spec_line(server["spec_decode"])
        if server and server.get("spec_decode") else "",
        energy=energy_line(s) if s.energy or s.energy_missing else "",
        delivered=(s.delivered or {}).get("detail", ""), schedule=(s.delivered or {}).get("segments") or [],
        disruption=disruption_lines(s.disruption) if s.disruption else [],
        scenario=scenario_line(s.scenario) if s.scenario else "", reuse=reuse_line(s.names),
        timing=timing_view(s.timing, s.percentiles), sections=feature_sections(s),
        options_changed=[(k, shown(v)) for k, v in changed], options_default=[(k, shown(v)) for k, v in rest],
        charts={"timeline": charts.timeline(run),
                "distributions": charts.distributions(run) + [c for c in drawn if c.get("group") == "distributions"],
                "features": [c for c in drawn if c.get("group", "features") == "features"],
                "markers": charts.markers(run)})


#: each part's colour in the report's stacked bars
PART_COLOURS = {SERVER_QUEUE: "#d62728", SERVER_PREFILL: "#1f77b4", KV_TRANSFER: "#9467bd", SERVER_DECODE: "#2ca02c",
                API_SERVER: "#8c564b", BEFORE_SERVER: "#7f7f7f", CLIENT_OVERHEAD: "#ff7f0e", "client": "#ff7f0e",
                OUTSIDE: "#ff7f0e", "outside_e2e": "#ff7f0e", CLIENT_SIDE: "#ff7f0e", "client_side_e2e": "#ff7f0e"}


def timing_view(t: Timing | None, shown: list[str] | None = None) -> dict | None:
    """Where each request's time went (``metrics/shape/breakdown.py``): each part's statistics in ms, and each tail's mean
    split as a stacked bar (the segments' widths are shares of the tail's value)."""
    if not t:
        return None
    ms = lambda v: f"{v * 1000:.1f}"  # noqa: E731
    parts = t.parts
    cols = [c for c in (shown or ["p50", "p90", "p99"]) if all(st.at(c) is not None for st in parts.values())]
    rows = [(LABELS.get(p, p), p, st.count, ms(st.mean), *(ms(st.at(c)) for c in cols), ms(st.max))
            for p, st in parts.items()]
    bars = []
    for metric, tails in t.tails.items():
        for q, tail in tails.items():
            total = sum(max(0.0, v) for v in tail.split.values()) or 1.0
            bars.append({"label": f"{metric.upper()} {q}: {tail.value * 1000:.1f} ms ({tail.requests} requests)",
                         "segments": [{"name": LABELS[p], "ms": ms(v), "share": round(100 * max(0.0, v) / total, 2),
                                       "colour": PART_COLOURS[p]} for p, v in tail.split.items()]})
    present = {p for tails in t.tails.values() for tail in tails.values() for p in tail.split}
    legend = list(dict.fromkeys((LABELS[p], c) for p, c in PART_COLOURS.items() if p in present))
    groups = [(group, label, g.requests, ms(g.tail(TTFT).value),
               ", ".join(f"{ms(v)} {LABELS[p]}" for p, v in g.tail(TTFT).split.items()))
              for group in ("replica", "name") for label, g in t.groups(group).items()]
    return {"rows": rows, "head": ["part", "key", "requests", "mean ms", *cols, "max"], "bars": bars, "legend": legend,
            "groups": groups, "spans": spans_line(t.spans) if t.spans else ""}


def summary_rows(s: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The client side's headline numbers."""
    s = RunSummary.of(s)
    return [
        ("requests (ok / failed)", f"{s.requests} ({s.succeeded} / {s.failed})"),
        *([("warm-up (excluded)", f"{s.warmup_excluded} requests (during --warmup, or sent as warm-up by the "
                                  "locustfile)")]
          if s.warmup_excluded else []),
        ("duration", f"{s.duration_s:.1f} s"), ("request rate", f"{s.request_rate:.2f} /s"),
        ("output tokens/s", f"{s.output_token_rate:.1f}"),
        ("goodput (good requests/s, as vllm bench)", "n/a" if s.goodput is None
         else f"{s.goodput:.2f} /s ({s.good_request_fraction * 100:.1f}% of requests)"),
        ("prompt-length drift", f"{s.input_drift_requests} requests (max {s.input_drift_max_abs} tokens)"),
        *([("prompt tokens cached (server usage)", f"{s.cached_fraction * 100:.1f}% ({s.cached_tokens} tokens)")]
          if s.cached_fraction is not None else []),
        *([("records/s", f"{s.records} records, {s.records_per_request} per request: {s.record_rate:.2f}/s")]
          if s.records_per_request else []),
    ]


def latency_table(s: dict) -> tuple[tuple[list[str], list[list[Any]]], str]:
    """(head, rows) of the latency table, and a note when ITL per chunk and per token are one row."""
    cols = columns(s)
    rows = table_rows(s)
    note = ("ITL per chunk and per token are one row: every chunk carried one token, so they are the same numbers."
            if any(r["metric"].startswith(ITL_ONE_ROW) for r in rows) else
            "ITL is per chunk: the server did not say how many tokens a chunk carried (no continuous usage), so a "
            "per-token gap is not known." if any(r["metric"].startswith(ITL_CHUNK_ONLY) for r in rows) else "")
    return (["metric", "count", "mean", *cols], [[r["metric"], r["count"], r["mean"], *(r.get(c, "") for c in cols)]
                                                  for r in rows]), note


#: Locust's options a reader always wants to see
_ALWAYS = ("host", "num_users", "spawn_rate", "run_time", "locustfile", "headless", "processes")


def _options_split(opts: dict) -> tuple[list, list]:
    """(the options this run set, the ones at their defaults): vllm-load's against its registry, Locust's few
    that say what the run was; the rest of Locust's are folded away with the defaults."""
    from vllm_load.options import OPTIONS

    defaults = {o.flag.lstrip("-").replace("-", "_"): o.default for o in OPTIONS}
    changed, rest = [], []
    for k, v in sorted(opts.items()):
        if (k in _ALWAYS and v is not None) or (k in defaults and v != defaults[k] and not (
                v in ("", None, []) and defaults[k] in ("", None, []))):  # (a set "host null" said nothing)
            changed.append((k, v))
        else:
            rest.append((k, v))
    return changed, rest


class Built(NamedTuple):
    """What ``build`` decided: the run's verdict, where the report is, and what it was judged on."""

    verdict: Verdict
    report: Path
    summary: dict
    server: dict | None


def build(run_dir: str | Path, slo_texts: list[str] | None = None, junit: str = "") -> Built:
    """Regenerate summary.json, summary.md, junit.xml and report.html of one run directory, from its summary as
    the run's end completed it (``analyses.complete``: a directory from before is completed first); nothing here
    changes the summary."""
    run = complete(run_dir, slo_texts)
    opts = run.config.get("options", {})
    texts = slo_texts if slo_texts else run.slo_texts
    slos = parse_slo_option(texts, str(opts.get("window") or "run"))  # --window, as the run was judged
    title = f"vllm-load run {run.config.get('run_id')}" + (" (target: built-in EMULATOR)" if run.is_emulator else "")
    server = server_summary(run.server)
    logs = run_logs(run)
    min_requests = int(opts.get("min_requests", 1) if opts.get("min_requests") is not None else 1)
    plan = run.plan
    # a sweep's --num-requests is each step's (judged there); a run's is the whole run's
    asked = plan.num_requests if plan is not None and not plan.sweep_kind else 0
    rd = RunDir(run.path)
    shown = "" if opts.get("no_figures") else _figures(run, rd)
    verdict = finish(run.path, run.summary, slos, server, title, junit, min_requests,
                     bool(opts.get("allow_untrustworthy")), asked, bool(opts.get("strict_load")), opts, shown)
    out = rd.report
    rd.write(out, render_html(run, verdict))
    rd.write(rd.vllm_result, vllm_result(run, detailed=bool(opts.get("save_detailed"))), indent=1)
    rd.write(rd.llmd_report, yaml.safe_dump(llmd_report(run, __version__), sort_keys=False))
    perf = RunDir(rd.mlperf_result.parent)  # MLPerf Endpoints' layout: performance/result_summary.json
    perf.write(rd.mlperf_result, mlperf_result(run, logs), indent=2)
    rd.write(rd.llm_csv, llm_stats_csv(run.summary))
    return Built(verdict, out, run.summary, server)


#: the report's charts also written as figures (report/figures.py)
FIGURES = ("latency", "throughput")


def _figures(run: Run, rd: RunDir) -> str:
    """The headline charts as PNG and SVG in figures/; summary.md's section showing them ('' when none)."""
    return markdown(write_figures([c for c in charts.timeline(run) if c["id"] in FIGURES], rd.figures), rd.path)
