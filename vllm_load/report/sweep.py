"""The sweep page: throughput and latency against concurrency (or rate) across runs or sweep steps, and the
largest level whose run met every SLO (how inference teams pick max_num_seqs or a batch size)."""

from __future__ import annotations

import html
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from vllm_load.metrics.slo import parse_slo_option  # noqa: E402
from vllm_load.metrics.verdict import Verdict, judge, word  # noqa: E402
from vllm_load.metrics.server import server_summary  # noqa: E402
from vllm_load.report.html import _CSS, _png, _table  # noqa: E402
from vllm_load.rundir.files import Run, RunDir, load_run  # noqa: E402


def sweep_verdicts(runs: list[Run], slo_texts: list[str] | None = None) -> list[bool | None]:
    """Per run: True/False when it has SLOs, None when it has none: the verdict its summary.json keeps, or, with
    ``slo_texts`` (other SLOs than the runs were judged on), judged anew."""
    out: list[bool | None] = []
    for r in runs:
        verdict = None if slo_texts else Verdict.load(r.path)
        if verdict is None:
            verdict = judge(r.summary, parse_slo_option(slo_texts or r.slo_texts), server_summary(r.server))
        out.append(verdict.slo_passed)
    return out


def build_sweep(run_dirs: list[str | Path], out_dir: Path, slo_texts: list[str] | None = None) -> tuple[Path, str]:
    """One table and plot of throughput and latency against concurrency, across runs, and the largest
    concurrency whose run met every SLO (how inference teams pick max_num_seqs / batch size)."""
    runs = sorted((load_run(d) for d in run_dirs), key=lambda r: (r.concurrency or 0, r.start))
    verdicts = sweep_verdicts(runs, slo_texts)
    with_records = any(r.summary.get("records_per_request") for r in runs)
    # a rate sweep's levels are request rates, not user counts: name them so
    level = "request rate" if runs and all(r.config.get("options", {}).get("sweep_level_kind") == "rate"
                                           for r in runs) else "concurrency"
    head = ["run", level, "req/s", *(["records/s"] if with_records else []), "output tok/s", "TTFT mean ms",
            "TTFT p99 ms", "ITL p99 ms", "E2E mean ms", "E2E p99 ms", "KV usage max", "preemptions",
            "prefix-cache hits", "failed", "SLO"]
    rows = []
    for r, verdict in zip(runs, verdicts):
        m = r.summary["metrics"]
        srv = server_summary(r.server) or {}
        kv, hit, pre = srv.get("kv_cache_usage.max"), srv.get("prefix_cache_hit_rate"), srv.get("preemptions")

        def ms(k: str, stat: str) -> str:
            return f"{m[k][stat] * 1000:.1f}" if k in m else ""
        rows.append([html.escape(r.path.name), r.concurrency or "", f"{r.summary['request_rate']:.2f}",
                     *([f"{r.summary.get('record_rate', 0.0):.2f}"] if with_records else []),
                     f"{r.summary['output_token_rate']:.1f}", ms("ttft", "mean"), ms("ttft", "p99"), ms("itl", "p99"),
                     ms("e2e", "mean"), ms("e2e", "p99"), "" if kv is None else f"{kv * 100:.1f}%",
                     "" if pre is None else f"{pre:g}", "" if hit is None else f"{hit * 100:.1f}%", r.summary["failed"],
                     "" if verdict is None else word(verdict)])
    passing = [r.concurrency for r, v in zip(runs, verdicts) if v]
    best = (f"Largest {level} meeting every SLO: {max(passing)}" if passing
            else "No run met every SLO" if any(v is not None for v in verdicts) else "No SLO was given")
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 3.5))
    xs = [r.concurrency or i for i, r in enumerate(runs)]
    a1.plot(xs, [r.summary["output_token_rate"] for r in runs], "o-")
    a1.set_xlabel(level)
    a1.set_ylabel("output tok/s")
    for key in ("ttft", "e2e"):
        a2.plot(xs, [r.summary["metrics"].get(key, {}).get("mean", 0) * 1000 for r in runs], "o-", label=f"{key} mean")
        a2.plot(xs, [r.summary["metrics"].get(key, {}).get("p99", 0) * 1000 for r in runs], "o--", label=f"{key} p99")
    a2.set_xlabel(level)
    a2.set_ylabel("ms")
    a2.legend(fontsize=7)
    out_dir.mkdir(parents=True, exist_ok=True)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>vllm-load sweep</title><style>{_CSS}</style>"
            f"</head><body><h1>vllm-load sweep ({len(runs)} runs)</h1>"
            + ("<div class='banner'>Some runs targeted the built-in EMULATOR.</div>" if any(r.is_emulator for r in runs) else "")
            + f"<h2 id='best'>{html.escape(best)}</h2>"
            + _table(head, rows) + f"<img alt='sweep' src='data:image/png;base64,{_png(fig)}'></body></html>")
    rd = RunDir(out_dir)
    rd.write(rd.sweep_html, page)
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    rd.write(rd.sweep_md, f"**{best}**\n\n" + "\n".join(md) + "\n")
    return rd.sweep_html, best
