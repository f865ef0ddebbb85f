"""Rebuild a run's report from its run directory alone: HTML (plots embedded), summary.json/.md.

The HTML puts client and server on one time axis (seconds since the run started): client TTFT/ITL
percentiles per window and output tokens/s above, the server's running/waiting requests, KV-cache
usage, preemptions and token rates beneath (from the sidecar's ``server.jsonl``, when present).
Several run directories also give a sweep table: throughput and latency against concurrency.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any, NamedTuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from vllm_load.report.console import NAME_HEAD, columns, energy_line, name_rows, server_cells, spec_line, table_rows  # noqa: E402
from vllm_load.metrics.histogram import Histogram  # noqa: E402
from vllm_load.metrics.verdict import Verdict, word  # noqa: E402
from vllm_load.report.results import finish  # noqa: E402
from vllm_load.metrics.client_health import silent_workers  # noqa: E402
from vllm_load.metrics.server import server_summary  # noqa: E402
from vllm_load.metrics.table import BY_KEY  # noqa: E402
from vllm_load.rundir.files import Run, RunDir, load_run  # noqa: E402
from vllm_load.report.csv_export import llm_stats_csv  # noqa: E402
from vllm_load.report.vllm_result import vllm_result  # noqa: E402
from vllm_load.metrics.slo import parse_slo_option  # noqa: E402


# -- plots -----------------------------------------------------------------------------------------
def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def timeline_png(run: Run) -> str:
    s = run.stats
    has_server = bool(run.server)
    n = 6 if has_server else 2
    fig, axes = plt.subplots(n, 1, figsize=(10, 2.2 * n), sharex=True)
    ax = axes[0]
    wins = sorted(s.windows)
    for metric, style in (("ttft", "-"), ("itl_token", "--")):
        xs, p50, p99 = [], [], []
        for w in wins:
            h = s.windows[w].get(metric)
            if h and h.count:
                xs.append(w + 5 - run.start)
                p50.append(h.percentile(50) * 1000)
                p99.append(h.percentile(99) * 1000)
        label = BY_KEY[metric].title
        ax.plot(xs, p50, style, marker="o", label=f"{label} p50")
        ax.plot(xs, p99, style, marker="o", label=f"{label} p99")
    ax.set_ylabel("ms")
    ax.set_yscale("log")
    ax.legend(fontsize=7, ncol=4)
    ax.set_title("client latency per 10 s window")
    ax = axes[1]
    secs = sorted(s.tokens_per_second)
    ax.plot([t - run.start for t in secs], [s.tokens_per_second[t] for t in secs], label="output tok/s")
    ax.set_ylabel("tok/s")
    ax.legend(fontsize=7)
    if has_server:
        t = [x["t"] - run.start for x in run.server]
        axes[2].plot(t, [x.get("running") for x in run.server], label="running")
        axes[2].plot(t, [x.get("waiting") for x in run.server], label="waiting")
        axes[2].set_ylabel("requests")
        axes[3].plot(t, [100 * (x.get("kv_cache_usage") or 0) for x in run.server], label="KV-cache usage %")
        axes[3].plot(t, [x.get("preemptions_rate") for x in run.server], label="preemptions/s")
        axes[4].plot(t, [x.get("prompt_tokens_rate") for x in run.server], label="prompt tok/s (server)")
        axes[4].plot(t, [x.get("generation_tokens_rate") for x in run.server], label="generation tok/s (server)")
        axes[4].set_ylabel("tok/s")
        hits = _prefix_hit_rates(run.server)
        axes[5].plot([x - run.start for x, _ in hits], [100 * r for _, r in hits], label="prefix-cache hit rate %")
        axes[5].set_ylabel("%")
        for a in axes[2:]:
            a.legend(fontsize=7)
    for w in run.summary.get("outages", []):  # the sidecar's missing samples show beside them
        for a in axes:
            a.axvspan(w["start"] - run.start, w["end"] - run.start, color="#d62728" if w["outage"] else "#ff7f0e",
                      alpha=0.15, label=None)
    sat = run.summary.get("saturation")
    if sat:  # where the server stopped keeping up: the onset, and the evidence's end
        for a in axes:
            a.axvline(sat["onset_s"], color="#9467bd", linestyle="--", linewidth=1)
            a.axvspan(sat["onset_s"], sat["at_s"], color="#9467bd", alpha=0.08)
        axes[0].annotate("over-saturated", (sat["onset_s"], 1), xycoords=("data", "axes fraction"), fontsize=7,
                         color="#9467bd", va="top")
    axes[-1].set_xlabel("seconds since the run started")
    return _png(fig)


def _prefix_hit_rates(series: list[dict]) -> list[tuple[float, float]]:
    """(time, share of the prompt tokens looked up in the interval that hit the prefix cache)."""
    out = []
    for a, b in zip(series, series[1:]):
        q0, q1 = a.get("prefix_cache_queries_total"), b.get("prefix_cache_queries_total")
        h0, h1 = a.get("prefix_cache_hits_total"), b.get("prefix_cache_hits_total")
        if None not in (q0, q1, h0, h1) and q1 > q0:
            out.append((b["t"], (h1 - h0) / (q1 - q0)))
    return out


def _cdf(h: Histogram) -> tuple[list[float], list[float]]:
    xs, ys, seen = [], [], 0
    hdr = h.counters()
    for item in hdr.get_recorded_iterator():
        seen += item.count_added_in_this_iter_step
        xs.append(item.value_iterated_to / h.scale * 1000)
        ys.append(seen / hdr.get_total_count())
    return xs, ys


def cdf_png(run: Run) -> str:
    fig, axes = plt.subplots(1, 4, figsize=(14, 3))
    panels = tuple((key, BY_KEY[key].title) for key in ("ttft", "itl", "tpot", "e2e"))
    for ax, (key, title) in zip(axes, panels):
        h = run.stats.hists[key]
        if h.count:
            ax.plot(*_cdf(h), label="per chunk" if key == "itl" else title)
            if key == "itl" and run.stats.hists["itl_token"].count:
                ax.plot(*_cdf(run.stats.hists["itl_token"]), "--", label="per token")
                ax.legend(fontsize=7)
        ax.set_title(f"CDF of {title}")
        ax.set_xlabel("ms")
        ax.grid(alpha=0.3)
    return _png(fig)


# -- HTML ------------------------------------------------------------------------------------------
_CSS = ("body{font-family:sans-serif;margin:24px;max-width:1200px}table{border-collapse:collapse;margin:8px 0}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child,th:first-child{text-align:left}"
        ".pass{color:#080;font-weight:bold}.fail{color:#c00;font-weight:bold}"
        ".banner{background:#ffe9a8;border:1px solid #d9a400;padding:8px;margin:8px 0}img{max-width:100%}")


def _table(head: list[str], rows: list[list[Any]]) -> str:
    th = "".join(f"<th>{html.escape(str(h))}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def render_html(run: Run, verdict: Verdict) -> str:
    s = run.summary
    server = server_summary(run.server)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>vllm-load {html.escape(run.path.name)}</title>"
             f"<style>{_CSS}</style></head><body><h1>vllm-load run {html.escape(str(run.config.get('run_id')))}</h1>"]
    if run.is_emulator:
        parts.append("<div class='banner' id='emulator-banner'><b>Target: the built-in vLLM EMULATOR</b>, "
                     "not a real vLLM server. These numbers describe the emulator's configured schedule.</div>")
    if verdict.invalid:
        parts.append("<div class='banner' id='run-invalid'><b>Run invalid:</b> "
                     + "<br>".join(html.escape(c.detail) for c in verdict.invalid) + "</div>")
    if not verdict.trust.passed:  # the reasons stand in the client-health box below; here the verdict a gate reads
        parts.append("<div class='banner' id='run-untrustworthy'><b>Untrustworthy run (exit code 5):</b> the load "
                     "generator could not keep time or lost a worker; --allow-untrustworthy accepts it</div>")
    if verdict.checks:
        ok = bool(verdict.slo_passed)
        parts.append(f"<h2>SLO verdict: <span class='{word(ok).lower()}' id='verdict'>{word(ok)}</span></h2>")
        parts.append(_table(["SLO", "result", "detail"], [[html.escape(c.slo),
                     f"<span class='{word(c.passed).lower()}'>{word(c.passed)}</span>",
                     html.escape(c.detail)] for c in verdict.checks]))
    parts.append("<h2>Summary</h2>")
    parts.append(_table(["", ""], [
        ["target", html.escape(str(run.config.get("host")))], ["model", html.escape(str(run.config.get("model")))],
        ["requests (ok / failed)", f"{s['requests']} ({s['succeeded']} / {s['failed']})"],
        *([["warm-up (excluded)", f"{s['warmup_excluded']} requests started during --warmup"]]
          if s.get("warmup_excluded") else []),
        ["duration", f"{s['duration_s']:.1f} s"], ["request rate", f"{s['request_rate']:.2f} /s"],
        ["output tokens/s", f"{s['output_token_rate']:.1f}"],
        ["goodput (good requests/s, as vllm bench)", "n/a" if s.get("goodput") is None
         else f"{s['goodput']:.2f} /s ({s['good_request_fraction'] * 100:.1f}% of requests)"],
        ["prompt-length drift", f"{s['input_drift_requests']} requests (max {s['input_drift_max_abs']} tokens)"],
        *([["prompt tokens cached (server usage)", f"{s['cached_fraction'] * 100:.1f}% ({s['cached_tokens']} tokens)"]]
          if s.get("cached_fraction") is not None else []),
        *([["records/s", f"{s['record_rate']:.2f} ({s['records']} records, {s['records_per_request']} per request)"]]
          if s.get("records_per_request") else []),
    ]))
    parts.append("<h2>Server side</h2>")
    if server:
        parts.append("<div id='server-side'>" + _table(["server (sidecar)", "value"], [[t, v] for t, v in server_cells(server)])
                     + "</div>")
        if server.get("spec_decode"):
            parts.append(f"<p id='spec-decode'>{html.escape(spec_line(server['spec_decode']))}</p>")
    else:
        parts.append("<p id='server-missing'><b>Server side missing:</b> no sidecar series in this run directory "
                     "(start <code>python -m server.sidecar</code> beside vLLM and pass --sidecar-url).</p>")
    parts.append("<h2>Client side</h2>")
    rows = table_rows(s)
    cols = columns(s)
    parts.append(_table(["metric", "count", "mean", *cols], [[r["metric"], r["count"], r["mean"], *(r.get(c, "") for c in cols)]
                                                          for r in rows]))
    named = name_rows(s)
    if named:
        parts.append("<h2>By name</h2><div id='by-name'>"
                     + _table(NAME_HEAD, [[html.escape(c) for c in r] for r in named]) + "</div>")
    if s.get("client", {}).get("saturated"):
        parts.append("<div class='banner' id='client-saturated'><b>Untrustworthy run: the load generator could not "
                     f"keep time (cause: {html.escape(str(s['client'].get('cause') or 'client'))}).</b> {html.escape('; '.join(s['client']['reasons']))}. "
                     f"{html.escape(s['client'].get('advice') or 'add workers')}.</div>")
    if s.get("energy") or s.get("energy_missing"):
        parts.append(f"<p id='energy'>{html.escape(energy_line(s))}</p>")
    if s.get("saturation"):
        parts.append(f"<div class='banner' id='saturation'><b>Over-saturated:</b> {html.escape(s['saturation']['text'])} "
                     "(dashed on the timeline).</div>")
    if s.get("outages"):
        parts.append("<div class='banner' id='outages'><b>Outages and failure storms</b> (shaded on the timeline):<br>"
                     + "<br>".join(html.escape(w["text"]) for w in s["outages"]) + "</div>")
    if s.get("workers_lost"):
        parts.append("<div class='banner' id='workers-lost'><b>Worker(s) lost mid-run:</b> "
                     f"{html.escape(', '.join(s['workers_lost']))}. Their requests after their last report (at most "
                     "3 s) are missing from these numbers; their per-request logs have them.</div>")
    silent = silent_workers(s)
    if silent:
        parts.append(f"<div class='banner' id='workers-missing'><b>Silent workers:</b> {html.escape(silent)}"
                     ".</div>")
    if s["errors"]:
        parts.append("<h2>Failures</h2>" + _table(["reason", "count"], [[html.escape(k), v] for k, v in s["errors"].items()]))
    parts.append("<h2>Client and server over time</h2>")
    parts.append(f"<img alt='timeline' src='data:image/png;base64,{timeline_png(run)}'>")
    parts.append("<h2>Distributions</h2>")
    parts.append(f"<img alt='cdf' src='data:image/png;base64,{cdf_png(run)}'>")
    opts = run.config.get("options", {})
    changed, rest = _options_split(opts)
    parts.append("<h2>Configuration</h2><div id='options-changed'>")
    parts.append(_table(["option (set for this run)", "value"],
                        [[html.escape(k), html.escape(json.dumps(v))] for k, v in changed]) + "</div>")
    parts.append(f"<details id='options-default'><summary>{len(rest)} options at their defaults</summary>"
                 + _table(["option", "value"], [[html.escape(k), html.escape(json.dumps(v))] for k, v in rest])
                 + "</details>")
    parts.append("</body></html>")
    return "".join(parts)


#: Locust's options a reader always wants to see
_ALWAYS = ("host", "num_users", "spawn_rate", "run_time", "locustfile", "headless", "processes")


def _options_split(opts: dict) -> tuple[list, list]:
    """(the options this run set, the ones at their defaults): vllm-load's against its registry, Locust's few
    that say what the run was; the rest of Locust's are folded away with the defaults."""
    from vllm_load.plugin.options import OPTIONS

    defaults = {o.flag.lstrip("-").replace("-", "_"): o.default for o in OPTIONS}
    changed, rest = [], []
    for k, v in sorted(opts.items()):
        if k in _ALWAYS or (k in defaults and v != defaults[k] and not (v in ("", None, []) and defaults[k] in ("", None, []))):
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
    """Regenerate summary.json, summary.md, junit.xml and report.html of one run directory."""
    run = load_run(run_dir)
    opts = run.config.get("options", {})
    texts = slo_texts if slo_texts else run.slo_texts
    slos = parse_slo_option(texts)
    title = f"vllm-load run {run.config.get('run_id')}" + (" (target: built-in EMULATOR)" if run.is_emulator else "")
    server = server_summary(run.server)
    min_requests = int(opts.get("min_requests", 1) if opts.get("min_requests") is not None else 1)
    verdict = finish(run.path, run.summary, slos, server, title, junit, min_requests,
                     bool(opts.get("allow_untrustworthy")))
    rd = RunDir(run.path)
    out = rd.report
    rd.write(out, render_html(run, verdict))
    rd.write(rd.vllm_result, vllm_result(run, detailed=bool(opts.get("save_detailed"))), indent=1)
    rd.write(rd.llm_csv, llm_stats_csv(run.summary))
    return Built(verdict, out, run.summary, server)
