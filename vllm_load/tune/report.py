"""The tune's outputs: a table per configuration and probe, the recommendation with the reason each other
configuration lost (from the SLO checks and the server's own numbers), ``tune.json``, ``tune.md`` and
``tune.html`` (throughput-latency curves per configuration, the Pareto front of tokens/s per user against
tokens/s in total, drawn as the report's interactive charts)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vllm_load.report.figures import markdown, off_by_environment, write_figures
from vllm_load.metrics.judge.repeats import spread_text

HEAD = ["config", "level", "SLOs", "req/s", "tok/s", "TTFT mean", "TTFT p99", "ITL mean", "ITL p99", "E2E mean",
        "E2E p99", "KV max", "preempt", "waiting max", "prefix hit"]


def label(params: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in params.items()) or "(as served)"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f} ms" if v < 10 else f"{v:.1f} s"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


def _n(v: float | None, fmt: str = "{:g}") -> str:
    return "-" if v is None else fmt.format(v)


def rate_text(spread: dict | None, value: float, digits: int) -> str:
    """A probe's number, as ``mean ± half`` its interval over --repeat's repeats when it has one."""
    return spread_text(spread, digits=digits) if spread else f"{value:.{digits}f}"


def probe_row(cfg: str, p: dict) -> list[str]:
    verdict = (("pass" if p["passed"] else "MISS") + (" UNTRUSTWORTHY" if p.get("untrustworthy") else "")
               + (" TOO SHORT" if p.get("short") else "") + (" (second try)" if p.get("reprobed") else ""))
    spread = p.get("spread") or {}
    return [cfg, f"{p['level']:g}", verdict, rate_text(spread.get("request_rate"), p["request_rate"], 2),
            rate_text(spread.get("output_token_rate"), p["output_token_rate"], 0), _ms(p["ttft_mean"]),
            _ms(p["ttft_p99"]), _ms(p["itl_mean"]), _ms(p["itl_p99"]), _ms(p["e2e_mean"]), _ms(p["e2e_p99"]),
            _pct(p["kv_max"]), _n(p["preemptions"]), _n(p["waiting_max"]), _pct(p["prefix_hit_rate"])]


def why_lost(result: dict) -> str:
    """One line: what stopped this configuration (its first missed probe, with the server's numbers)."""
    if result["status"] == "failed":
        return result["reason"]
    misses = [p for p in result["probes"] if not p["passed"]]
    if not misses:
        return f"capacity {result['capacity']:g} (the search's --max-level)"
    first = min(misses, key=lambda p: p["level"])
    server = [f"{first['preemptions']:g} preemptions" if first["preemptions"] else "",
              f"KV {first['kv_max'] * 100:.0f}%" if (first["kv_max"] or 0) >= 0.01 else "",
              f"waiting max {first['waiting_max']:g}" if first["waiting_max"] else ""]
    what = "; ".join(first["missed"]) or first["invalid"] or f"exit code {first['code']}"
    return f"at {first['level']:g}: " + ", ".join(x for x in [*server, what] if x)


def distrusted(result: dict) -> list[dict]:
    """The configuration's probes whose own verdict disowned their numbers (the client could not keep time)."""
    return [p for p in result["probes"] if p.get("untrustworthy")]


def doubtful(result: dict) -> list[dict]:
    """Those, and the passes too short for their requests: no capacity stands on them (tune.html recommended, in
    green, a configuration whose every probe was TOO SHORT). A short probe that missed only ends the search."""
    return [p for p in result["probes"] if p.get("untrustworthy") or (p.get("short") and p["passed"])]


def trust_note(result: dict) -> str:
    """'' when every probe of the configuration stands, else one sentence saying which do not."""
    bad = doubtful(result)
    if not bad:
        return ""
    first = bad[0].get("untrustworthy") or f"too short: {bad[0]['short']}"
    return (f"UNTRUSTWORTHY: {len(bad)} of its {len(result['probes'])} probes could not be trusted "
            f"(at {', '.join(format(p['level'], 'g') for p in bad)}: {first}); its numbers may "
            "describe the load generator or a probe's start, not the server")


def recommend(results: list[dict]) -> dict | None:
    """The configuration with the most goodput at its capacity (good requests/s meeting every SLO); one whose
    probes were all trustworthy comes before any that was not (whose recommendation then says so)."""
    ok = [r for r in results if r["status"] == "ok" and r["capacity"] is not None]
    return max(ok, key=lambda r: (not distrusted(r), r["goodput"] or 0.0, r["capacity"])) if ok else None


def render_markdown(results: list[dict], best: dict | None, mode: str) -> str:
    unit = "users" if mode == "concurrency" else "req/s"
    lines = ["# vllm-load tune", ""]
    lines.append(headline(best, unit))
    lines += ["", "| " + " | ".join(CONFIG_HEAD) + " |", "|" + "---|" * len(CONFIG_HEAD)]
    lines += ["| " + " | ".join(row) + " |" for row in config_rows(results, unit)]
    lines += ["", "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    lines += ["| " + " | ".join(row) + " |" for row in probe_rows(results)]
    return "\n".join(lines) + "\n"


CONFIG_HEAD = ["config", "capacity", "goodput (good req/s)", "trust", "why not better"]


def headline(best: dict | None, unit: str) -> str:
    if not best:
        return "**No configuration met the SLOs.**"
    note = trust_note(best)
    said = "Best measured, not a recommendation" if note else "Recommended"
    return (f"**{said}: {label(best['params'])}**: capacity {best['capacity']:g} {unit}, goodput "
            f"{best['goodput']:.2f} good req/s." + (f" **{note}.**" if note else ""))


def config_rows(results: list[dict], unit: str) -> list[list[str]]:
    rows = []
    for r in results:
        cap = "-" if r["capacity"] is None else f"{r['capacity']:g} {unit}"
        gp = "-" if r["goodput"] is None else rate_text(r.get("goodput_spread"), r["goodput"], 2)
        bad = distrusted(r)
        rows.append([label(r["params"]), cap, gp, f"UNTRUSTWORTHY ({len(bad)} of {len(r['probes'])} probes)" if bad
                     else "ok", why_lost(r)])
    return rows


def probe_rows(results: list[dict]) -> list[list[str]]:
    return [probe_row(label(r["params"]), p) for r in results for p in sorted(r["probes"], key=lambda p: p["level"])]


def curves(results: list[dict], unit: str = "users") -> list[dict[str, Any]]:
    """The page's charts as data (``report/charts.py``'s shape), each configuration's probes joined in the order
    they were probed, by load level: TTFT p99 and output tokens/s against the level (past saturation a server's
    throughput falls while its latency rises: joined by throughput, the curve ran backwards and latency seemed to
    fall as throughput rose), and tokens/s per user against in total for the Pareto front of the probes that met
    the SLOs. Configurations share the union of the levels; a series is empty where it has no probe."""
    from vllm_load.report.charts import chart, pareto, rounded

    measured = [(r, sorted((p for p in r["probes"] if p["ttft_p99"] is not None), key=lambda p: p["level"]))
                for r in results]
    measured = [(r, probes) for r, probes in measured if probes]
    levels = sorted({p["level"] for _, probes in measured for p in probes})
    if not levels:
        return []
    at = {x: i for i, x in enumerate(levels)}

    def series(probes: list[dict], value: Any) -> list[float | None]:
        out: list[float | None] = [None] * len(levels)
        for p in probes:
            out[at[p["level"]]] = value(p)
        return rounded(out)

    x_label = f"load ({unit})"
    charts = [chart("tune-latency", "TTFT p99 against the load, per configuration", x_label, "ms", levels,
                    [{"label": f"{label(r['params'])} TTFT p99", "values": series(probes, lambda p: p["ttft_p99"] * 1000)}
                     for r, probes in measured], kind="level"),
              chart("tune-throughput", "Output tokens/s against the load, per configuration", x_label, "tok/s", levels,
                    [{"label": f"{label(r['params'])} output tok/s",
                      "values": series(probes, lambda p: p["output_token_rate"])} for r, probes in measured],
                    kind="level")]
    front = pareto([(p["output_token_rate"], p["tps_per_user"], label(r["params"])) for r, probes in measured
                    for p in probes if p["passed"] and p["tps_per_user"] is not None])
    if front:  # the front is ordered by throughput, each point better per user than any faster one
        xs = [round(x, 3) for x, _, _ in front]
        charts.append(chart("tune-pareto", "Pareto front (SLOs met): tokens/s per user against tokens/s in total",
                            "output tokens/s (total)", "tok/s per request", xs,
                            [{"label": "Pareto front (SLOs met)", "values": rounded([y for _, y, _ in front])}],
                            kind="level"))
    return charts


def render_html(results: list[dict], best: dict | None, mode: str) -> str:
    from vllm_load.report.page import render

    unit = "users" if mode == "concurrency" else "req/s"
    overall = "none" if best is None else "untrustworthy" if doubtful(best) else "pass"
    return render("tune.html.j2", configs=len(results), probes=sum(len(r["probes"]) for r in results),
                  overall=overall, headline=headline(best, unit).replace("**", ""), config_head=CONFIG_HEAD,
                  config_rows=config_rows(results, unit), probe_head=HEAD, probe_rows=probe_rows(results),
                  charts={"tune": curves(results, unit)})


def write(out: Path, results: list[dict], mode: str, slos: list[str], figures: bool = True) -> dict | None:
    """tune.md, tune.json, tune.html and (unless ``figures`` is off: the probes' --no-figures) its charts as PNG
    and SVG in ``figures/``, shown in tune.md."""
    best = recommend(results)
    md = render_markdown(results, best, mode)
    if figures and not off_by_environment():
        shown = markdown(write_figures(curves(results, "users" if mode == "concurrency" else "req/s"),
                                       out / "figures"), out)
        md += f"\n{shown}\n" if shown else ""
    (out / "tune.md").write_text(md)
    (out / "tune.json").write_text(json.dumps({"mode": mode, "slos": slos, "recommended": best and best["params"],
                                               "recommended_trustworthy": bool(best) and not doubtful(best),
                                               "untrustworthy_probes": sum(len(distrusted(r)) for r in results),
                                               "configs": results}, indent=1))
    (out / "tune.html").write_text(render_html(results, best, mode))
    return best
