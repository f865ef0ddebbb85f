"""The LLM metrics table, for the console at the end of a headless run and for the web UI tab."""

from __future__ import annotations

from vllm_load.histogram import PERCENTILES

ROWS = (
    ("ttft", "TTFT", "ms", 1000.0),
    ("itl", "ITL per token", "ms", 1000.0),
    ("itl_chunk", "ITL per chunk", "ms", 1000.0),
    ("tpot", "TPOT", "ms", 1000.0),
    ("e2e", "E2E latency", "ms", 1000.0),
    ("output_tps", "Output tok/s per request", "tok/s", 1.0),
    ("send_lag", "Send lag (open loop)", "ms", 1000.0),
    ("input_tokens", "Input tokens", "tok", 1.0),
    ("output_tokens", "Output tokens", "tok", 1.0),
)
COLUMNS = [f"p{p:g}" for p in PERCENTILES] + ["max"]


def _fmt(value: float) -> str:
    if value >= 100:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def table_rows(summary: dict) -> list[dict]:
    rows = []
    for key, title, unit, factor in ROWS:
        m = summary["metrics"].get(key)
        if not m or not m["count"]:
            continue
        row = {"metric": f"{title} ({unit})", "count": m["count"], "mean": _fmt(m["mean"] * factor)}
        row.update({c: _fmt(m[c] * factor) for c in COLUMNS})
        rows.append(row)
    return rows


def render_table(summary: dict, title: str = "LLM metrics") -> str:
    rows = table_rows(summary)
    head = ["metric", "count", "mean", *COLUMNS]
    widths = {h: max(len(h), *(len(str(r[h])) for r in rows)) if rows else len(h) for h in head}
    lines = [title]
    lines.append("  ".join(h.ljust(widths[h]) if h == "metric" else h.rjust(widths[h]) for h in head))
    for r in rows:
        lines.append("  ".join(str(r[h]).ljust(widths[h]) if h == "metric" else str(r[h]).rjust(widths[h]) for h in head))
    s = summary
    lines.append(
        f"requests {s['requests']}  succeeded {s['succeeded']}  failed {s['failed']}  "
        f"duration {s['duration_s']:.1f} s  request rate {s['request_rate']:.2f}/s  "
        f"output {s['output_tokens']} tok ({s['output_token_rate']:.1f} tok/s)  input {s['input_tokens']} tok"
    )
    if s.get("target_request_rate"):
        lines.append(f"open loop: target {s['target_request_rate']:.2f} req/s, achieved send rate {s['send_rate']:.2f} req/s")
    if s.get("client", {}).get("saturated"):
        lines.append("WARNING: UNTRUSTWORTHY RUN: the load generator, not the server, was the bottleneck: "
                     + "; ".join(s["client"]["reasons"]) + " (add workers: --processes N or more machines)")
    if s.get("workers_lost"):
        lines.append(f"WARNING: worker(s) lost mid-run, no final report: {', '.join(s['workers_lost'])} "
                     "(their requests after their last report, at most 3 s, are missing here but in their logs)")
    if s["input_drift_requests"]:
        lines.append(
            f"WARNING: {s['input_drift_requests']} requests had a prompt length different from what was asked "
            f"(max |drift| {s['input_drift_max_abs']} tokens): the tokenizer does not match the server's"
        )
    if s["usage_missing"]:
        lines.append(f"note: {s['usage_missing']} successful requests had no usage from the server (tokens counted locally)")
    if s["output_mismatch"]:
        lines.append(f"note: {s['output_mismatch']} requests returned a different number of output tokens than asked")
    for reason, n in list(s["errors"].items())[:10]:
        lines.append(f"failed x{n}: {reason}")
    return "\n".join(lines)
