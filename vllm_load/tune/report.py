"""The tune's outputs: a table per configuration and probe, the recommendation with the reason each other
configuration lost (from the SLO checks and the server's own numbers), ``tune.json``, ``tune.md`` and
``tune.html`` (throughput-latency curves per configuration, the Pareto front of tokens/s per user against
tokens/s in total)."""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any

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


def probe_row(cfg: str, p: dict) -> list[str]:
    verdict = ("pass" if p["passed"] else "MISS") + (" UNTRUSTWORTHY" if p.get("untrustworthy") else "")
    return [cfg, f"{p['level']:g}", verdict, f"{p['request_rate']:.2f}",
            f"{p['output_token_rate']:.0f}", _ms(p["ttft_mean"]), _ms(p["ttft_p99"]), _ms(p["itl_mean"]),
            _ms(p["itl_p99"]), _ms(p["e2e_mean"]), _ms(p["e2e_p99"]), _pct(p["kv_max"]), _n(p["preemptions"]),
            _n(p["waiting_max"]), _pct(p["prefix_hit_rate"])]


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


def trust_note(result: dict) -> str:
    """'' when every probe of the configuration was trustworthy, else one sentence saying which were not."""
    bad = distrusted(result)
    if not bad:
        return ""
    return (f"UNTRUSTWORTHY: {len(bad)} of its {len(result['probes'])} probes could not be trusted "
            f"(at {', '.join(format(p['level'], 'g') for p in bad)}: {bad[0]['untrustworthy']}); its numbers may "
            "describe the load generator, not the server")


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
    return (f"**Recommended: {label(best['params'])}**: capacity {best['capacity']:g} {unit}, goodput "
            f"{best['goodput']:.2f} good req/s." + (f" **{note}.**" if note else ""))


def config_rows(results: list[dict], unit: str) -> list[list[str]]:
    rows = []
    for r in results:
        cap = "-" if r["capacity"] is None else f"{r['capacity']:g} {unit}"
        gp = "-" if r["goodput"] is None else f"{r['goodput']:.2f}"
        bad = distrusted(r)
        rows.append([label(r["params"]), cap, gp, f"UNTRUSTWORTHY ({len(bad)} of {len(r['probes'])} probes)" if bad
                     else "ok", why_lost(r)])
    return rows


def probe_rows(results: list[dict]) -> list[list[str]]:
    return [probe_row(label(r["params"]), p) for r in results for p in sorted(r["probes"], key=lambda p: p["level"])]


def pareto(points: list[tuple[float, float, Any]]) -> list[tuple[float, float, Any]]:
    """The points no other beats on both axes (more tokens/s in total and per user)."""
    front = [p for p in points if not any(q[0] >= p[0] and q[1] >= p[1] and (q[0], q[1]) != (p[0], p[1])
                                          for q in points)]
    return sorted(front, key=lambda p: p[0])


#: the tune page's style (its curves are matplotlib images: each configuration's has an x of its own)
_CSS = ("body{font-family:sans-serif;margin:24px;max-width:1200px}table{border-collapse:collapse;margin:8px 0}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child,th:first-child{text-align:left}"
        ".pass{color:#080;font-weight:bold}.fail{color:#c00;font-weight:bold}"
        ".banner{background:#ffe9a8;border:1px solid #d9a400;padding:8px;margin:8px 0}img{max-width:100%}")


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _table(head: list[str], rows: list[list[Any]]) -> str:
    th = "".join(f"<th>{html.escape(str(h))}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def render_html(results: list[dict], best: dict | None, mode: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4))
    points = []
    for r in results:
        probes = sorted((p for p in r["probes"] if p["ttft_p99"] is not None), key=lambda p: p["level"])
        if not probes:
            continue
        ax1.plot([p["output_token_rate"] for p in probes], [p["ttft_p99"] * 1000 for p in probes], marker="o",
                 label=label(r["params"]))
        for p in probes:
            if p["passed"] and p["tps_per_user"] is not None:
                points.append((p["output_token_rate"], p["tps_per_user"], label(r["params"])))
        ax2.scatter([p["output_token_rate"] for p in probes], [p["tps_per_user"] or 0 for p in probes], s=12,
                    label=label(r["params"]))
    front = pareto(points)
    if front:
        ax2.plot([p[0] for p in front], [p[1] for p in front], "k--", label="Pareto front (SLOs met)")
    ax1.set_xlabel("output tokens/s (total)")
    ax1.set_ylabel("TTFT p99 (ms)")
    ax1.set_yscale("log")
    ax1.set_title("throughput against latency, per configuration")
    ax2.set_xlabel("output tokens/s (total)")
    ax2.set_ylabel("output tokens/s per request (median)")
    ax2.set_title("tokens/s per user against in total")
    for ax in (ax1, ax2):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    img = _png(fig)
    unit = "users" if mode == "concurrency" else "req/s"

    def esc(rows: list[list[str]]) -> list[list[str]]:
        return [[html.escape(c) for c in row] for row in rows]

    head = html.escape(headline(best, unit).replace("**", ""))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>vllm-load tune</title><style>{_CSS}</style>"
            f"</head><body><h1>vllm-load tune</h1><p id='recommended'>{head}</p>"
            f"<img alt='curves' src='data:image/png;base64,{img}'><h2>Configurations</h2>"
            f"<div id='configs'>{_table(CONFIG_HEAD, esc(config_rows(results, unit)))}</div><h2>Probes</h2>"
            f"<div id='probes'>{_table(HEAD, esc(probe_rows(results)))}</div></body></html>")


def write(out: Path, results: list[dict], mode: str, slos: list[str]) -> dict | None:
    best = recommend(results)
    md = render_markdown(results, best, mode)
    (out / "tune.md").write_text(md)
    (out / "tune.json").write_text(json.dumps({"mode": mode, "slos": slos, "recommended": best and best["params"],
                                               "recommended_trustworthy": bool(best) and not distrusted(best),
                                               "untrustworthy_probes": sum(len(distrusted(r)) for r in results),
                                               "configs": results}, indent=1))
    (out / "tune.html").write_text(render_html(results, best, mode))
    return best
