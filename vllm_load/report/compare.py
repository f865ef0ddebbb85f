"""`vllm-load compare RUN_A RUN_B`: what changed from one run to the other, and whether it is more than noise.

Every metric's mean and percentiles, the run's rates and the SLO verdicts, A against B. A change is flagged
when it is larger than both the histograms' error (0.1 % relative, HdrHistogram's 3 significant digits) and
the runs' own noise: for TTFT, ITL per token and E2E, the spread (standard deviation) of the 10 s windows'
same statistic within each run (their medians for p50, their p99s for p99), combined over the two runs (a run
that wanders by 5 ms between its own windows cannot show a 2 ms change). Metrics without windows have no noise estimate: a change of theirs is flagged only
beyond a stated relative threshold (``--threshold``, 5 % by default), and the output says so (two nearly equal runs
showed 17 "changed" lines of +0.2 % before). A percentile is flagged only when, besides, the two runs' sampling
intervals of it are apart (``percentile_interval``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from vllm_load.features import FEATURES
from vllm_load.metrics.judge.repeats import welch
from vllm_load.metrics.judge.verdict import UNTRUSTWORTHY, word
from vllm_load.metric_table import E2E, ITL, ITL_TOKEN, METRICS, TTFO, TTFT
from vllm_load.report import charts
from vllm_load.report.console import fmt_number, shown
from vllm_load.report.figures import markdown, off_by_environment, write_figures
from vllm_load.rundir.files import Run, load_run
from vllm_load.metrics.summary import accuracy_rows, metric_stats

HIST_ERROR = 0.001  # relative, HdrHistogram with 3 significant digits
#: a metric without a noise estimate is flagged only beyond this relative change (--threshold)
DEFAULT_THRESHOLD = 0.05
STATS = ("mean", "p50", "p90", "p99", "p99.9")
RATES = (("request_rate", "request rate", "req/s"), ("output_token_rate", "output tokens/s", "tok/s"),
         ("total_token_rate", "total tokens/s", "tok/s"),
         ("error_rate", "error rate", "%"), ("goodput", "goodput (good req/s)", "req/s"))


def window_noise(run: Run, key: str, stat: str = "p50") -> float | None:
    """Standard deviation (seconds) of the run's per-window ``stat`` of ``key`` (``mean`` or ``pNN``); None without
    2 windows. Each statistic is judged by its own spread: a tail wanders between windows far more than the median,
    and two runs of one load differed by 10-19 % in ITL p99.9 while their medians' spread allowed 2 %."""
    values = [_stat_of(ms[key], stat) for _, ms in sorted(run.stats.windows.items()) if key in ms and ms[key].count]
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    return math.sqrt(sum((m - mean) ** 2 for m in values) / (len(values) - 1))


def _stat_of(h: Any, stat: str) -> float:
    return h.mean if stat == "mean" else h.percentile(float(stat[1:]))


#: options that name a run rather than set it up: a difference in them is no difference in setup
_NAMING = {"run_dir", "salt", "seed", "csv_prefix", "html_file", "json_file", "junit", "logfile", "api_key",
           "sidecar_token", "prometheus_token", "otlp_token", "otlp_endpoint", "web_port", "metrics_port", "master_port", "master_bind_port",
           "config", "locustfile",
           # what a run prints or writes, not what it measures
           "only_summary", "print_stats", "loglevel", "skip_log_setup", "show_task_ratio", "html", "json",
           "otlp_receiver", "save_detailed", "metric_percentiles", "mlflow_uri", "mlflow_experiment", "wandb_project",
           "metrics_host", "web_host", "web_login", "web_password_file", "web_allowed_host", "autostart", "autoquit",
           # said once already, as "users" and "load processes"
           "num_users", "processes"}
#: rows that repeat another where both runs say the same: TTFO is TTFT without reasoning; the per-token ITL is the
#: per-chunk one when every chunk carries one token
_SAME_AS = {TTFO: TTFT, ITL_TOKEN: ITL}


def setup_differences(a: Run, b: Run) -> list[dict[str, Any]]:
    """How the two runs were set up differently, said before any metric: the target and its kind, the load
    (users, rate, workers), every option given differently, and whether each run could be trusted. A -53 %
    request rate between runs of 8 and 4 users is the users' doing, not the server's."""
    ca, cb = a.config, b.config
    pa, pb = a.plan, b.plan  # None for a run directory without a plan (its rows say "-")

    def kind(c: dict) -> str:
        return "the embedded EMULATOR" if c.get("target_is_emulator") else f"{c.get('host')} ({c.get('model')})"

    def trust(run: Run) -> str:  # the run's own verdict (summary.json); a run not yet judged: its client's
        verdict = run.verdict
        if verdict is not None:
            return f"untrustworthy: {verdict.trust.detail.removeprefix(UNTRUSTWORTHY)}" if verdict.distrusted \
                else "trusted"
        client = run.summary.client
        return "untrustworthy: " + "; ".join(client.reasons) if client and client.saturated else "trusted"

    out: list[dict[str, Any]] = []
    for what, va, vb in (("target", kind(ca), kind(cb)), ("tokenizer", ca.get("tokenizer"), cb.get("tokenizer")),
                         ("users", pa.total_users if pa else ca.get("options", {}).get("num_users"),
                          pb.total_users if pb else cb.get("options", {}).get("num_users")),
                         ("load processes", pa and pa.processes, pb and pb.processes),
                         ("targets", len(pa.urls) if pa else None, len(pb.urls) if pb else None),
                         ("workers that reported", len(a.summary.workers or []),
                          len(b.summary.workers or [])),
                         ("server kind", pa and pa.server_kind, pb and pb.server_kind),
                         ("server version", ca.get("server_version") or "unknown",
                          cb.get("server_version") or "unknown"),
                         ("trust", trust(a), trust(b))):
        if va != vb:
            out.append({"what": what, "a": va, "b": vb})
    oa, ob = ca.get("options", {}), cb.get("options", {})
    for key in sorted(set(oa) | set(ob)):
        va, vb = oa.get(key), ob.get(key)
        if va in ("", [], None) and vb in ("", [], None):  # an option one run's version did not have yet
            continue
        if key not in _NAMING and va != vb:
            out.append({"what": f"--{key.replace('_', '-')}", "a": shown(va), "b": shown(vb)})
    return out


def percentile_interval(h: Any, p: float, z: float = 1.96) -> tuple[float, float] | None:
    """A ``Histogram``'s ``p``-th percentile's 95 % interval from its sampling alone: ranks n*q +- z*sqrt(n q (1-q))
    read back as values; a rank past the largest leaves that side open (the p99 of 40 requests lies above their
    largest 2 times in 3: 0.99^40), so such a percentile is never called changed. None: no values."""
    n = h.count
    if n < 1:
        return None
    q = p / 100.0
    spread = z * math.sqrt(n * q * (1.0 - q))  # the interval's half-width, in ranks (100 * spread / n percent)
    lo, hi = h.percentiles([max(0.0, p - 100.0 * spread / n), min(100.0, p + 100.0 * spread / n)])
    return lo, (math.inf if n * q + spread >= n - 0.5 else hi)


def _intervals_apart(a: Run, b: Run, key: str, stat: str) -> bool | None:
    """Whether the two runs' sampling intervals of a percentile are apart (None: not a percentile, or no histogram):
    two runs of one command were flagged "TTFT p99 -13.2 % changed", each p99 within the other's sampling."""
    if not stat.startswith("p"):
        return None
    ia, ib = (percentile_interval(h, float(stat[1:])) if (h := r.stats.hists.get(key)) is not None else None
              for r in (a, b))
    if ia is None or ib is None:
        return None
    return ia[1] < ib[0] or ib[1] < ia[0]


def _same_numbers(a: Run, b: Run, twin: str, ma: Any, mb: Any) -> bool:
    """Whether ``twin``'s statistics equal ``ma``'s in A and ``mb``'s in B."""
    return all(metric_stats(s.summary, twin).at(st) == mm.at(st) for s, mm in ((a, ma), (b, mb)) for st in STATS)


def compare(a: Run, b: Run, threshold: float = DEFAULT_THRESHOLD) -> dict[str, Any]:
    """``threshold``: the relative change a metric without a noise estimate must exceed to be flagged."""
    rows = []
    for m in (m for m in METRICS if m.table):
        ma, mb = metric_stats(a.summary, m.key), metric_stats(b.summary, m.key)
        if not ma.count or not mb.count:
            continue
        twin = _SAME_AS.get(m.key)
        if twin and _same_numbers(a, b, twin, ma, mb):
            continue  # the same numbers as its twin in both runs: said once
        # the per-chunk ITL has no windows of its own; where each chunk is one token it is the per-token ITL, whose
        # windows are its noise (without them its p99 of two runs of one load was flagged beyond a 5 % threshold)
        windowed = ITL_TOKEN if m.key == ITL and _same_numbers(a, b, ITL, metric_stats(a.summary, ITL_TOKEN),
                                                                 metric_stats(b.summary, ITL_TOKEN)) else m.key
        for stat in STATS:
            na, nb = window_noise(a, windowed, stat), window_noise(b, windowed, stat)
            noise = math.sqrt(na ** 2 + nb ** 2) if na is not None and nb is not None else None
            va, vb = ma[stat], mb[stat]
            delta = vb - va
            floor = HIST_ERROR * max(abs(va), abs(vb))
            limit = max(floor, 2 * noise) if noise is not None else max(floor, threshold * max(abs(va), abs(vb)))
            apart = _intervals_apart(a, b, m.key, stat)  # a percentile's own sampling error, from each histogram
            rows.append({"metric": m.key, "title": m.title, "unit": m.unit, "stat": stat, "a": va * m.scale,
                         "b": vb * m.scale, "delta": delta * m.scale,
                         "pct": (delta / va * 100) if va else None,
                         "significant": abs(delta) > limit and apart is not False,
                         "noise": None if noise is None else noise * m.scale})
    rates = []
    for key, title, unit in RATES:
        va, vb = a.summary.get(key), b.summary.get(key)
        if va is None or vb is None:
            continue
        scale = 100.0 if unit == "%" else 1.0
        rates.append({"metric": key, "title": title, "unit": unit, "a": va * scale, "b": vb * scale,
                      "delta": (vb - va) * scale, "pct": ((vb - va) / va * 100) if va else None})
    rates += accuracy_rows(a.summary, b.summary)
    parts_a, parts_b = a.summary.features or {}, b.summary.features or {}
    rates += [row for f in FEATURES for row in f.compare_rows(parts_a.get(f.name), parts_b.get(f.name))]
    slo_a, slo_b = _verdicts(a), _verdicts(b)
    verdicts = [{"slo": text, "a": slo_a.get(text), "b": slo_b.get(text), "changed": slo_a.get(text) != slo_b.get(text)}
                for text in dict.fromkeys([*slo_a, *slo_b])]
    return {"a": str(a.path), "b": str(b.path), "servers": [server_name(a), server_name(b)],
            "differs": setup_differences(a, b), "metrics": rows, "rates": rates, "slos": verdicts,
            "threshold": threshold, "repeats": repeated_comparison(a, b)}


#: what repeated runs are compared on: (title, a step's value, better when higher)
REPEATED = (("request rate", lambda s: s.request_rate, True),
            ("output tokens/s", lambda s: s.output_token_rate, True),
            ("TTFT p99", lambda s: metric_stats(s, TTFT).at("p99"), False),
            ("E2E p99", lambda s: metric_stats(s, E2E).at("p99"), False))


def _repeats(run: Run) -> list[dict] | None:
    """A run's steps when they are repeats of one level (--sweep 16x5): their summaries; None otherwise."""
    steps = sorted((run.path / "steps").glob("*")) if (run.path / "steps").is_dir() else []
    loaded = [load_run(d) for d in steps if (d / "llm_stats.json").exists()]
    if len(loaded) < 2 or len({r.concurrency for r in loaded}) != 1:
        return None
    return [r.summary for r in loaded]


def repeated_comparison(a: Run, b: Run) -> list[dict] | None:
    """Both runs repeated one load (--sweep LEVELxN): B against A on each number, decided from the runs' spread
    (Welch's interval at A's --confidence) rather than from one run's noise."""
    ra, rb = _repeats(a), _repeats(b)
    if ra is None or rb is None:
        return None
    confidence = float((a.config.get("options") or {}).get("confidence") or 0.95)
    out = []
    for title, value, higher_better in REPEATED:
        w = welch([value(s) for s in ra if value(s) is not None], [value(s) for s in rb if value(s) is not None],
                  confidence)
        if w is None:
            continue
        better = w["verdict"] == "no difference" or (w["verdict"] == "higher") == higher_better
        judged = "no difference" if w["verdict"] == "no difference" else ("better" if better else "worse")
        out.append({"title": title, **w, "word": judged})
    return out or None


def repeated_lines(c: dict) -> list[str]:
    return [f"repeated: {r['title']} B/A {r['pct']:+.1f}% ± {r['half_pct']:.1f}% ({r['confidence']:.0%}, "
            f"{r['runs_a']} and {r['runs_b']} runs): {r['word']}" for r in c.get("repeats") or []]


def server_name(run: Run) -> str:
    """What served the run, as its start said it (vLLM 0.32.0, an OpenAI-compatible server, the EMULATOR) and
    where."""
    return f"{run.target_kind or 'a server'} at {run.config.get('host')}"


def conclusion(c: dict) -> str:
    """One line: B against A, in throughput and in the flagged latencies, and whether the setup differs."""
    rates = {r["metric"]: r for r in c["rates"]}
    out = []
    rate = rates.get("output_token_rate") or rates.get("request_rate")
    if rate and rate["a"] and rate["b"] is not None:
        ratio = rate["b"] / rate["a"]
        out.append("B served about the same throughput as A" if abs(ratio - 1) < 0.02 else
                   f"B served {ratio:.2f}x A's {rate['title']}")
    worse = [r for r in c["metrics"] if r["significant"] and r["stat"] == "p99" and r["metric"] in (TTFT, E2E, ITL)]
    if worse:
        out.append("its p99 " + ", ".join(f"{r['title']} {r['pct']:+.1f}%" for r in worse if r["pct"] is not None))
    else:
        out.append("no p99 latency changed beyond noise")
    decided = [r for r in c.get("repeats") or [] if r["word"] != "no difference"]
    if c.get("repeats"):
        out.append("over the repeated runs: " + (", ".join(f"{r['title']} {r['word']} ({r['pct']:+.1f}% ± "
                                                          f"{r['half_pct']:.1f}%)" for r in decided)
                                                 or "no difference beyond their spread"))
    slo = [v for v in c["slos"] if v["changed"]]
    if slo:
        out.append(f"{len(slo)} SLO verdict(s) changed")
    line = "conclusion: " + "; ".join(out)
    if c.get("differs"):
        line += " (the runs were set up differently: the change may be the setup's, not the server's)"
    return line


def throughput_line(c: dict) -> str | None:
    """B against A in throughput, the A/B number people want first: each rate and B/A as a ratio."""
    parts = [f"{r['title']} {_fmt(r['a'])} -> {_fmt(r['b'])} {r['unit']} (B/A {r['b'] / r['a']:.2f}x)"
             for r in c["rates"] if r["unit"] != "%" and r["a"] and r["b"] is not None
             and r["metric"] in ("request_rate", "output_token_rate")]
    return "throughput: " + "; ".join(parts) if parts else None


def _verdicts(run: Run) -> dict[str, bool]:
    verdict = run.verdict
    return {} if verdict is None else {c.slo: c.passed for c in verdict.checks}


def _fmt(v: float | None) -> str:
    return "-" if v is None else fmt_number(v)


def _verdict(v: bool | None) -> str:
    return "-" if v is None else word(v)


def render_markdown(c: dict) -> str:
    lines = ["# vllm-load compare", "", f"A: `{c['a']}`  ", f"B: `{c['b']}`", ""]
    if c.get("servers"):
        lines += [f"A served by {c['servers'][0]}  ", f"B served by {c['servers'][1]}", ""]
    lines += [f"**{conclusion(c)}**", ""]
    lines += [f"- {x}" for x in repeated_lines(c)] + ([""] if c.get("repeats") else [])
    line = throughput_line(c)
    if line:
        lines += [f"**{line}**", ""]
    if c.get("differs"):
        lines += ["## The runs differ in", "", "| | A | B |", "|---|---|---|"]
        lines += [f"| {d['what']} | {d['a']} | {d['b']} |" for d in c["differs"]]
        lines += ["", "Changes below may be these differences' doing, not the server's.", ""]
    lines += [
             "A change is **flagged** when it exceeds the histograms' error (0.1 %) and twice the runs' own "
             "window-to-window noise (TTFT, ITL per token, E2E); the others have no noise estimate and are flagged "
             f"beyond {c.get('threshold', DEFAULT_THRESHOLD):.0%} (--threshold).", "",
             "| metric | stat | A | B | change | % | noise | |", "|---|---|---|---|---|---|---|---|"]
    for r in c["metrics"]:
        pct = "-" if r["pct"] is None else f"{r['pct']:+.1f}%"
        lines.append(f"| {r['title']} ({r['unit']}) | {r['stat']} | {_fmt(r['a'])} | {_fmt(r['b'])} | "
                     f"{_fmt(r['delta'])} | {pct} | {_fmt(r['noise'])} | {'**changed**' if r['significant'] else ''} |")
    lines += ["", "| rate | A | B | change | % |", "|---|---|---|---|---|"]
    for r in c["rates"]:
        pct = "-" if r["pct"] is None else f"{r['pct']:+.1f}%"
        lines.append(f"| {r['title']} ({r['unit']}) | {_fmt(r['a'])} | {_fmt(r['b'])} | {_fmt(r['delta'])} | {pct} |")
    if c["slos"]:
        lines += ["", "| SLO | A | B | |", "|---|---|---|---|"]
        for v in c["slos"]:
            lines.append(f"| `{v['slo']}` | {_verdict(v['a'])} | {_verdict(v['b'])} | {'**changed**' if v['changed'] else ''} |")
    return "\n".join(lines) + "\n"


def render_console(c: dict) -> str:
    flagged = [r for r in c["metrics"] if r["significant"]]
    out = [f"vllm-load compare: A {c['a']}  B {c['b']}"]
    if c.get("servers"):
        out.append(f"  A: {c['servers'][0]}")
        out.append(f"  B: {c['servers'][1]}")
    out.append(f"  {conclusion(c)}")
    line = throughput_line(c)
    if line:
        out.append(f"  {line}")
    out += [f"  {x}" for x in repeated_lines(c)]
    differs = c.get("differs") or []
    for d in differs:
        out.append(f"  the runs differ in {d['what']}: A {d['a']}  B {d['b']}")
    if differs:
        out.append("  (changes below may be these differences' doing, not the server's)")
    for r in flagged:
        pct = "" if r["pct"] is None else f" ({r['pct']:+.1f}%)"
        out.append(f"  changed: {r['title']} {r['stat']} {_fmt(r['a'])} -> {_fmt(r['b'])} {r['unit']}{pct}")
    for v in c["slos"]:
        if v["changed"]:
            out.append(f"  SLO {v['slo']}: {_verdict(v['a'])} -> {_verdict(v['b'])}")
    if not flagged and not any(v["changed"] for v in c["slos"]):
        out.append("  no change beyond the histograms' error and the runs' own noise (metrics without a noise "
                   f"estimate: beyond {c.get('threshold', DEFAULT_THRESHOLD):.0%}, --threshold)")
    return "\n".join(out)


def render_html(c: dict, a: Run, b: Run) -> str:
    """compare.html (``templates/compare.html.j2``): the setup's differences, every metric, the SLOs, the
    distributions overlaid (interactive)."""
    from vllm_load.report.page import render

    metrics = [{"flagged": r["significant"],
                "cells": [f"{r['title']} ({r['unit']})", r["stat"], _fmt(r["a"]), _fmt(r["b"]), _fmt(r["delta"]),
                          "-" if r["pct"] is None else f"{r['pct']:+.1f}%", _fmt(r["noise"]),
                          "changed" if r["significant"] else ""]} for r in c["metrics"]]
    return render("compare.html.j2", a=c["a"], b=c["b"], conclusion=conclusion(c), throughput=throughput_line(c),
                  differs=[(d["what"], d["a"], d["b"]) for d in c["differs"]],
                  threshold=f"{c.get('threshold', DEFAULT_THRESHOLD):.0%}", metrics=metrics,
                  slos=[(v["slo"], _verdict(v["a"]), _verdict(v["b"]), "changed" if v["changed"] else "")
                        for v in c["slos"]], charts={"distributions": charts.a_against_b(a, b)})


def run_compare(dir_a: str, dir_b: str, out: str = "", threshold: float = DEFAULT_THRESHOLD) -> tuple[dict, Path]:
    a, b = load_run(dir_a), load_run(dir_b)
    c = compare(a, b, threshold)
    target = Path(out) if out else Path(dir_b) / "compare"
    target.mkdir(parents=True, exist_ok=True)
    md = render_markdown(c)
    if not off_by_environment() and not any((r.config.get("options") or {}).get("no_figures") for r in (a, b)):
        shown = markdown(write_figures(charts.a_against_b(a, b), target / "figures"), target)
        md += f"\n{shown}\n" if shown else ""
    (target / "compare.md").write_text(md)
    (target / "compare.json").write_text(json.dumps(c, indent=1))
    (target / "compare.html").write_text(render_html(c, a, b))
    return c, target
