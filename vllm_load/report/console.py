"""The LLM metrics table, for the console at the end of a headless run and for the web UI tab."""

from __future__ import annotations

from vllm_load.metrics.histogram import PERCENTILES
from vllm_load.metrics.table import METRICS

COLUMNS = [f"p{p:g}" for p in PERCENTILES] + ["max"]


def _fmt(value: float) -> str:
    if value >= 100:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def table_rows(summary: dict) -> list[dict]:
    rows = []
    for metric in METRICS:
        key, title, unit, factor = metric.key, metric.title, metric.unit, metric.scale
        m = summary["metrics"].get(key)
        if not m or not m["count"]:
            continue
        row = {"metric": f"{title} ({unit})", "count": m["count"], "mean": _fmt(m["mean"] * factor)}
        row.update({c: _fmt(m[c] * factor) for c in COLUMNS})
        rows.append(row)
    return rows


#: the server's numbers shown beside the client's: (key of server_summary, title, kind)
SERVER_ROWS = (
    ("kv_cache_usage.max", "KV-cache usage max", "%"),
    ("running.max", "running max", "n"),
    ("waiting.max", "waiting max", "n"),
    ("preemptions", "preemptions", "n"),
    ("prefix_cache_hit_rate", "prefix-cache hit rate", "%"),
)


def server_cells(server: dict | None) -> list[tuple[str, str]]:
    """(title, formatted value) of the server side, for every medium; empty when there is none."""
    out = []
    for key, title, kind in SERVER_ROWS:
        value = (server or {}).get(key)
        if value is None:
            text = "n/a"
        elif kind == "%":
            text = f"{value * 100:.1f}%"
        else:
            text = f"{value:g}"
        out.append((title, text))
    return out if server else []


SERVER_MISSING = ("server side: missing (no sidecar data for this run: start python -m server.sidecar beside "
                  "vLLM and pass --sidecar-url)")


def render_server(server: dict | None) -> str:
    if not server:
        return SERVER_MISSING
    return "server side (sidecar): " + "  ".join(f"{t} {v}" for t, v in server_cells(server))


def render_table(summary: dict, title: str = "LLM metrics", server: dict | None | bool = False) -> str:
    """The client's table and totals; with ``server`` (a server summary, or None for "missing") the
    server's line too."""
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
    if s.get("records_per_request"):
        lines.append(f"records {s['records']} ({s['records_per_request']} per request)  "
                     f"record rate {s['record_rate']:.2f}/s")
    if server is not False:
        lines.append(render_server(server))  # type: ignore[arg-type]
    if s.get("target_request_rate"):
        lines.append(f"open loop: target {s['target_request_rate']:.2f} req/s, achieved send rate {s['send_rate']:.2f} req/s")
    if s.get("client", {}).get("saturated"):
        c = s["client"]
        lines.append("WARNING: UNTRUSTWORTHY RUN: the load generator could not keep time, so these numbers describe "
                     f"the client, not the server: {'; '.join(c['reasons'])}. Cause: {c.get('cause') or 'client'}: "
                     f"{c.get('advice') or 'add workers: --processes N or more machines'}")
    for w in s.get("outages", []):
        lines.append(("OUTAGE: " if w["outage"] else "FAILURE STORM: ") + w["text"])
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
