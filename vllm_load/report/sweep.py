"""The sweep page: throughput and latency against concurrency (or rate) across runs or sweep steps, and the
largest level whose run met every SLO (how inference teams pick max_num_seqs or a batch size)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_load.metrics.shape.knee import knee
from vllm_load.metrics.judge.recipes import parse_recipe
from vllm_load.metrics.judge.slo import parse_slo_option  # noqa: E402
from vllm_load.metrics.judge.verdict import judge, word  # noqa: E402
from vllm_load.metrics.judge.repeats import spread, spread_text
from vllm_load.metrics.fleet.server import server_summary  # noqa: E402
from vllm_load.report import charts  # noqa: E402
from vllm_load.report.exports.mlperf_result import pareto_point  # noqa: E402
from vllm_load.report.figures import markdown, write_figures  # noqa: E402
from vllm_load.metrics.shape.curves import decode_curve, describe_decode  # noqa: E402
from vllm_load.report.page import render  # noqa: E402
from vllm_load.rundir.files import Run, RunDir, load_run  # noqa: E402
from vllm_load.metric_table import E2E, ITL, TTFT
from vllm_load.metrics.summary import metric_stats


def sweep_verdicts(runs: list[Run], slo_texts: list[str] | None = None) -> list[bool | None]:
    """Per run: True/False when it has SLOs, None when it has none: the verdict its summary.json keeps, or, with
    ``slo_texts`` (other SLOs than the runs were judged on), judged anew."""
    out: list[bool | None] = []
    for r in runs:
        verdict = None if slo_texts else r.verdict
        if verdict is None:
            verdict = judge(r.summary, parse_slo_option(slo_texts or r.slo_texts), server_summary(r.server))
        out.append(verdict.slo_passed)
    return out


def step_trusted(run: Run) -> bool:
    """Could the step's numbers be trusted (its own verdict's trust check found no reason, accepted or not)?"""
    verdict = run.verdict
    if verdict is not None:
        return not verdict.distrusted
    client = run.summary.client
    return not (client and client.saturated)


def answer(runs: list[Run], verdicts: list[bool | None], level: str) -> tuple[Run | None, str]:
    """The largest level whose step met every SLO and can be trusted, and what was passed over on the way: a
    sweep crowned an UNTRUSTWORTHY step ("max goodput … concurrency 4" in a run that exited 5)."""
    met = sorted((r for r, v in zip(runs, verdicts) if v), key=lambda r: r.concurrency or 0, reverse=True)
    skipped = []
    for r in met:
        if step_trusted(r):
            note = (f" (the step{'s' if len(skipped) > 1 else ''} at {level} "
                    f"{', '.join(str(x.concurrency) for x in skipped)} met them too but "
                    f"{'are' if len(skipped) > 1 else 'is'} untrustworthy)") if skipped else ""
            return r, note
        skipped.append(r)
    if skipped:
        return None, (f"no answer: the step at {level} {skipped[0].concurrency} ({skipped[0].path.name}) met every SLO "
                      "but is untrustworthy" + (", and so is every lower one that met them" if len(skipped) > 1 else ""))
    return None, ""


def build_sweep(run_dirs: list[str | Path], out_dir: Path, slo_texts: list[str] | None = None,
                exit_code: int | None = None) -> tuple[Path, str, list[list[str]]]:
    """One table and plot of throughput and latency against concurrency, across runs, and the largest
    concurrency whose run met every SLO and can be trusted (how inference teams pick max_num_seqs / batch size).
    Returns the page, that line, and the repeated levels' rows (``repeat_rows``); ``exit_code``: the run's, said on
    the page."""
    runs = sorted((load_run(d) for d in run_dirs), key=lambda r: (r.concurrency or 0, r.start))
    verdicts = sweep_verdicts(runs, slo_texts)
    with_records = any(r.summary.records_per_request for r in runs)
    # a rate sweep's levels are request rates, not user counts: name them so
    level = "request rate" if runs and all(r.config.get("options", {}).get("sweep_level_kind") == "rate"
                                           for r in runs) else "concurrency"
    head = ["run", level, "req/s", *(["records/s"] if with_records else []), "output tok/s", "TTFT mean ms",
            "TTFT p99 ms", "ITL p99 ms", "E2E mean ms", "E2E p99 ms", "KV usage max", "preemptions",
            "prefix-cache hits", "failed", "SLO", "trust"]
    rows = []
    for r, verdict in zip(runs, verdicts):
        srv = server_summary(r.server) or {}
        kv, hit, pre = srv.get("kv_cache_usage.max"), srv.get("prefix_cache_hit_rate"), srv.get("preemptions")

        def ms(k: str, stat: str) -> str:
            m = metric_stats(r.summary, k)
            return f"{m.at(stat) * 1000:.1f}" if m.at(stat) is not None else ""
        rows.append([r.path.name, r.concurrency or "", f"{r.summary.request_rate:.2f}",
                     *([f"{(r.summary.record_rate or 0.0):.2f}"] if with_records else []),
                     f"{r.summary.output_token_rate:.1f}", ms(TTFT, "mean"), ms(TTFT, "p99"), ms(ITL, "p99"),
                     ms(E2E, "mean"), ms(E2E, "p99"), "" if kv is None else f"{kv * 100:.1f}%",
                     "" if pre is None else f"{pre:g}", "" if hit is None else f"{hit * 100:.1f}%", r.summary.failed,
                     "" if verdict is None else word(verdict), "trusted" if step_trusted(r) else "UNTRUSTWORTHY"])
    repeats = repeat_rows(runs, level)
    passing = [r.concurrency for r, v in zip(runs, verdicts) if v]
    chosen, note = answer(runs, verdicts, level)
    best = (f"Largest {level} meeting every SLO: {chosen.concurrency}{note}" if chosen is not None
            else note[:1].upper() + note[1:] if note
            else "No run met every SLO" if any(v is not None for v in verdicts) else "No SLO was given")
    recipe = None if slo_texts else parse_recipe(next((t for r in runs if (t := r.config.get("options", {}).get(
        "recipe"))), ""))
    if recipe is not None and chosen is not None:  # the recipe's answer: its level, and the goodput there
        best = recipe.headline(level, chosen.concurrency, chosen.summary.goodput) + note

    bend = "; ".join(x for x in (knee_line(runs, level), decode_line(runs, level)) if x)
    out_dir.mkdir(parents=True, exist_ok=True)
    overall = ("pass" if chosen is not None else "untrustworthy" if passing else "fail"
               if any(v is not None for v in verdicts) else "none")
    code_line = f"The run's exit code: {exit_code}" if exit_code is not None else ""
    specs = charts.by_level(runs, [r.concurrency or i for i, r in enumerate(runs)], level) + pareto_chart(runs)
    page = render("sweep.html.j2", count=len(runs), emulator=any(r.is_emulator for r in runs), best=best, knee=bend,
                  exit_code=code_line,
                  overall=overall, head=head, rows=rows, repeats_head=REPEAT_HEAD, repeats=repeats,
                  charts={"sweep": specs})
    rd = RunDir(out_dir)
    rd.write(rd.sweep_html, page)
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    if repeats:
        md += ["", "Repeated levels: mean ± half the confidence interval over their steps", "",
               "| " + " | ".join(REPEAT_HEAD) + " |", "|" + "---|" * len(REPEAT_HEAD)]
        md += ["| " + " | ".join(str(c) for c in r) + " |" for r in repeats]
    shown = "" if any((r.config.get("options") or {}).get("no_figures") for r in runs) else markdown(
        write_figures(specs, rd.figures), rd.path)  # the same charts as files
    md += ["", shown] if shown else []
    rd.write(rd.sweep_md, f"**{best}**" + (f" ({code_line[0].lower()}{code_line[1:]})" if code_line else "") + "\n\n"
             + (f"{bend}\n\n" if bend else "") + "\n".join(md) + "\n")
    return rd.sweep_html, best + (f"; {bend}" if bend else ""), repeats


def knee_line(runs: list[Run], level: str) -> str:
    """Where more load stopped buying throughput (metrics/shape/knee.py), '' when the curve has no knee."""
    levels = [float(r.concurrency or 0) for r in runs]
    at = knee(levels, [r.summary.output_token_rate for r in runs])
    if at is None:
        return ""
    rate = next(r.summary.output_token_rate for r, x in zip(runs, levels) if x == at)
    most = max(r.summary.output_token_rate or 0.0 for r in runs)
    return (f"knee of the throughput curve: {level} {at:g} ({rate:.1f} output tok/s, {rate / most * 100:.0f}% of "
            "the most measured)")


def decode_line(runs: list[Run], level: str) -> str:
    """ITL p50 against concurrency and its line (metrics/shape/curves.py), '' for a rate sweep or under 3 levels."""
    if level != "concurrency":
        return ""
    c = decode_curve([float(r.concurrency or 0) for r in runs], [metric_stats(r.summary, ITL).at("p50") for r in runs])
    return describe_decode(c) if c else ""


def pareto_chart(runs: list[Run]) -> list[dict]:
    """The steps' MLPerf Endpoints points (each its TPOT plateau's, else its whole step's) and their Pareto front."""
    points = [(*p, r.path.name) for r in runs if (p := pareto_point(r)) is not None]
    if len(points) < 2:
        return []
    return [charts.pareto_steps(points, "sweep-pareto", "Pareto front: tokens/s per user against tokens/s in total "
                                "(MLPerf Endpoints' points: 1000 / TPOT p90 ms, output tokens/s)")]


REPEAT_HEAD = ["level", "steps", "confidence", "req/s", "output tok/s", "TTFT p50 ms", "TTFT p99 ms", "ITL p99 ms",
               "E2E p99 ms", "req/s CV"]


def repeat_rows(runs: list[Run], level: str = "concurrency") -> list[list[str]]:
    """Each level run more than once (--sweep 16x5): its numbers' mean and confidence interval over those steps
    (--confidence, 95 % by default), and the request rate's coefficient of variation, run to run."""
    confidence = float((runs[0].config.get("options") or {}).get("confidence") or 0.95) if runs else 0.95
    by_level: dict[float, list[Run]] = {}
    for r in runs:
        by_level.setdefault(r.concurrency or 0, []).append(r)
    rows = []
    for value, group in sorted(by_level.items()):
        if len(group) < 2:
            continue

        def over(fn: Any) -> dict | None:
            return spread([fn(r) for r in group], confidence)

        def stat(key: str, st: str) -> Any:
            return lambda r: metric_stats(r.summary, key).at(st)
        rate = over(lambda r: r.summary.request_rate)
        rows.append([f"{value:g}", len(group), f"{confidence:.0%}", spread_text(rate),
                     spread_text(over(lambda r: r.summary.output_token_rate), digits=1),
                     spread_text(over(stat(TTFT, "p50")), 1000, 1), spread_text(over(stat(TTFT, "p99")), 1000, 1),
                     spread_text(over(stat(ITL, "p99")), 1000, 1), spread_text(over(stat(E2E, "p99")), 1000, 1),
                     "-" if rate is None else f"{rate['cv']:.1%}"])
    return rows
