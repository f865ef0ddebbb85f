"""The LLM metrics table, for the console at the end of a headless run and for the web UI tab."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_load.metrics.shape.breakdown import tail_lines
from vllm_load.metrics.shape.delivered import segment_lines
from vllm_load.metrics.fleet.disruption import describe as disruption_lines
from vllm_load.metrics.judge.repeats import interval_text
from vllm_load.metrics.shape.reuse import describe as reuse_line
from vllm_load.metrics.histogram import PERCENTILES, percentile_key
from vllm_load.metrics.judge.client_health import silent_workers, who_fell_behind
from vllm_load.metric_table import BY_KEY, E2E, INPUT_TOKENS, ITL, METRICS, OUTPUT_TOKENS, REASONING_ONLY, SEND_LAG, TTFT
from vllm_load.metrics.summary import RunSummary, metric_stats
from vllm_load.metrics.summary_parts import ClientVerdict
from vllm_load.workload.scenarios import describe as scenario_line

COLUMNS = [percentile_key(p) for p in PERCENTILES] + ["max"]


def columns(summary: Mapping[str, Any]) -> list[str]:
    """The table's statistic columns: the run's percentiles (--metric-percentiles, else the standard five), max."""
    return [*(RunSummary.of(summary).percentiles or COLUMNS[:-1]), "max"]


def fmt_number(value: float) -> str:
    return f"{value:.1f}" if abs(value) >= 100 else f"{value:.2f}" if abs(value) >= 1 else f"{value:.3f}"


def shown(value: Any) -> str:
    """An option's value as a person reads it, not as Python prints it (``--host: A None``, ``--headless: A True``,
    the report's Configuration once quoting strings and printing ``null``)."""
    if value is None or value == "" or value == []:
        return "not set"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)):
        return ", ".join(shown(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={shown(v)}" for k, v in value.items())
    return str(value)


def table_rows(summary: Mapping[str, Any]) -> list[dict]:
    summary, rows = RunSummary.of(summary), []
    reasoned = bool(summary.reasoning_requests)
    for metric in METRICS:
        key, title, unit, factor = metric.key, metric.title, metric.unit, metric.scale
        m = metric_stats(summary, key)
        if not metric.table or not m.count or (key in REASONING_ONLY and not reasoned):
            continue
        row = {"metric": f"{title} ({unit})", "count": m.count, "mean": fmt_number(m.mean * factor)}
        row.update({c: fmt_number(m.at(c) * factor) for c in columns(summary) if m.at(c) is not None})
        rows.append(row)
    return _one_itl_row(rows, columns(summary), bool(summary.one_token_chunks))


#: the ITL row's title when the gaps per chunk and per token are the same numbers (every chunk carried one token)
ITL_ONE_ROW = "ITL (per chunk = per token)"
#: its title when the server did not say what a chunk carried (no continuous usage): per chunk is all there is
ITL_CHUNK_ONLY = "ITL (per chunk; tokens per chunk unknown)"


def _one_itl_row(rows: list[dict], cols: list[str], unknown: bool = False) -> list[dict]:
    """ITL per chunk and per token as one row when every chunk carried one token (they were two identical rows);
    when a chunk's tokens were not known (``unknown``), the per-token row repeats the per-chunk one: one row,
    named for what it is."""
    chunk = next((r for r in rows if r["metric"].startswith("ITL (per chunk)")), None)
    token = next((r for r in rows if r["metric"].startswith("ITL per token")), None)
    if chunk is None or token is None or any(chunk.get(k) != token.get(k) for k in ("count", "mean", *cols)):
        return rows
    if unknown:
        chunk["metric"] = chunk["metric"].replace("ITL (per chunk)", ITL_CHUNK_ONLY)
        return [r for r in rows if r is not token]
    chunk["metric"] = chunk["metric"].replace("ITL (per chunk)", ITL_ONE_ROW)
    return [r for r in rows if r is not token]


#: the by-name table's columns: (metric key, statistic, title); times in ms, tokens as means
NAME_COLUMNS = ((TTFT, "p50", "TTFT p50 ms"), (TTFT, "p99", "TTFT p99 ms"), (ITL, "p50", "ITL p50 ms"),
                (ITL, "p99", "ITL p99 ms"), (E2E, "p50", "E2E p50 ms"), (E2E, "p99", "E2E p99 ms"),
                (INPUT_TOKENS, "mean", "input tok"), (OUTPUT_TOKENS, "mean", "output tok"))
NAME_HEAD = ["name", "requests", "failed", *(t for _, _, t in NAME_COLUMNS), "cached"]


#: the groups a summary splits its requests into, each with its rows' title and first column's head
GROUPS = {"names": ("by name (name=)", "name"), "targets": ("by target (--host)", "target")}


def name_rows(summary: dict, group: str = "names") -> list[list[str]]:
    """One row per request name (name=), or per target (--host a,b), and the total, for every medium; empty when
    the run has no such group."""
    names = summary.get(group) or {}
    if not names:
        return []

    def row(label: str, s: Mapping[str, Any]) -> list[str]:
        s = RunSummary.of(s)
        cells = [label, str(s.requests), str(s.failed)]
        for key, stat, _ in NAME_COLUMNS:
            m = metric_stats(s, key)
            factor = BY_KEY[key].scale if key in BY_KEY else 1.0
            cells.append(fmt_number(m.at(stat) * factor) if m.count else "-")
        frac = s.cached_fraction
        cells.append("-" if frac is None else f"{frac * 100:.1f}%")
        return cells

    return [row(n, s) for n, s in names.items()] + [row("total", summary)]


def group_head(group: str) -> list[str]:
    return [GROUPS[group][1], *NAME_HEAD[1:]]


def render_names(summary: dict, group: str = "names") -> str:
    rows = name_rows(summary, group)
    if not rows:
        return ""
    head = group_head(group)
    widths = [max(len(head[i]), *(len(r[i]) for r in rows)) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([GROUPS[group][0], line(head), *(line(r) for r in rows)])


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
        text = "n/a" if value is None else f"{value * 100:.1f}%" if kind == "%" else f"{value:g}"
        out.append((title, text))
    return out if server else []


SERVER_MISSING = ("server side: missing (no sidecar data for this run: start python -m server.sidecar beside "
                  "vLLM and pass --sidecar-url)")


def render_server(server: dict | None) -> str:
    if not server:
        return SERVER_MISSING
    line = "server side (sidecar): " + "  ".join(f"{t} {v}" for t, v in server_cells(server))
    line += "\n" + spec_line(server["spec_decode"]) if server.get("spec_decode") else ""
    q, h = server.get("mm_cache_queries"), server.get("mm_cache_hits")  # items: images, clips, videos
    line += f"\nserver multimodal cache: {h:g} of {q:g} items hit ({100 * h / q:.1f}%)" if q else ""
    return line + ("\n" + kv_connector_line(server["kv_connector"]) if server.get("kv_connector") else "")


def kv_connector_line(kv: dict) -> str:
    """The server's KV connector over the run: P/D's NIXL transfers, a connector's cache hits, KV offload."""
    parts = []
    if kv.get("nixl_transfers"):
        n = kv["nixl_transfers"]
        parts.append(f"NIXL {n:g} KV transfers, mean {kv['nixl_seconds'] / n * 1000:.2f} ms"
                     + (f", {kv['nixl_bytes'] / 1e6:.1f} MB" if kv.get("nixl_bytes") is not None else "")
                     + f", {kv.get('nixl_failed_transfers', 0):g} failed")
    if kv.get("external_prefix_cache_queries"):
        parts.append(f"connector cache hits {kv.get('external_prefix_cache_hits', 0):g} of "
                     f"{kv['external_prefix_cache_queries']:g} tokens")
    if kv.get("kv_offload_load_bytes") or kv.get("kv_offload_store_bytes"):
        parts.append(f"KV offload {kv.get('kv_offload_load_bytes', 0) / 1e6:.1f} MB loaded, "
                     f"{kv.get('kv_offload_store_bytes', 0) / 1e6:.1f} MB stored")
    return "server KV connector: " + ("; ".join(parts) if parts else "no transfers in the run")


def untrustworthy_line(c: ClientVerdict) -> str:
    """The console's warning of a run whose numbers describe what fell behind (the client, or the embedded
    emulator), not the server."""
    return (f"WARNING: UNTRUSTWORTHY RUN: {who_fell_behind(c.cause)}, so these numbers describe "
            f"{'the emulator' if c.cause == 'emulator' else 'the client'}, not the server: "
            f"{'; '.join(c.reasons)}. Cause: {c.cause or 'client'}: "
            f"{c.advice or 'add workers: --processes N or more machines'}")


def energy_line(s: Mapping[str, Any]) -> str:
    """GPU energy in one line (--dcgm-url), or why it is missing."""
    s = RunSummary.of(s)
    e = s.energy
    if not e:
        return f"energy: missing ({s.energy_missing})"

    def num(value: float | None, fmt: str) -> str:
        return format(value, fmt) if value is not None else "n/a"

    return (f"energy (DCGM, {e.gpus} GPU{'s' if e.gpus != 1 else ''}, from the {e.source}): "
            f"{e.energy_j:.0f} J, average power {e.average_power_w:.0f} W, "
            f"{num(e.energy_per_output_token_j, '.4f')} J per output token, "
            f"{num(e.output_tokens_per_joule, '.2f')} tokens/J, {num(e.energy_per_request_j, '.2f')} J per request")


def spec_line(spec: dict) -> str:
    """Speculative decoding in one line, with vLLM's definitions (``vllm bench serve`` prints the same numbers)."""
    per = ", ".join(f"{r:.2f}" for r in spec["per_position_acceptance_rates"])
    return (f"speculative decoding (server): acceptance rate {spec['acceptance_rate']:.1f}%  acceptance length "
            f"{spec['acceptance_length']:.2f}  drafts {spec['num_drafts']}  draft tokens {spec['draft_tokens']}  "
            f"accepted {spec['accepted_tokens']}" + (f"  per position {per}" if per else ""))


def steady_line(steady: RunSummary, requests: int) -> str:
    """The steady window beside the whole run: its span, its share of the requests, its rates and tails."""
    a, b = steady.window_s
    tails = [f"{label} p99 {metric_stats(steady, key).at('p99') * 1000:.1f} ms" for key, label in ((TTFT, "TTFT"),
             (E2E, "E2E")) if metric_stats(steady, key).count]
    return (f"steady window (every user sending; the ramp and the drain left out): {a:.1f}-{b:.1f} s, "
            f"{steady.requests} of {requests} requests, {steady.request_rate:.2f} req/s, "
            f"{steady.output_token_rate:.1f} tok/s" + (f"; {', '.join(tails)}" if tails else ""))


def accuracy_line(name: str, s: RunSummary) -> str:
    right = round(s.accuracy * s.graded)
    return (f"accuracy [{name}]: {s.accuracy * 100:.1f}% ({right} of {s.graded} graded answers right; "
            f"{interval_text(s.accuracy_ci)})")


def render_table(summary: Mapping[str, Any], title: str = "LLM metrics", server: dict | None | bool = False) -> str:
    """The client's table and totals; with ``server`` (a server summary, or None for "missing") the
    server's line too."""
    rows = table_rows(summary)
    head = ["metric", "count", "mean", *columns(summary)]
    widths = {h: max(len(h), *(len(str(r[h])) for r in rows)) if rows else len(h) for h in head}
    lines = [title]
    if rows:  # no request completed: no header over an empty table
        lines.append("  ".join(h.ljust(widths[h]) if h == "metric" else h.rjust(widths[h]) for h in head))
    else:
        lines.append("no request completed: no metric to show")
    for r in rows:
        lines.append("  ".join(str(r[h]).ljust(widths[h]) if h == "metric" else str(r[h]).rjust(widths[h]) for h in head))
    s = RunSummary.of(summary)
    for group in GROUPS:
        if s.get(group):
            lines.append(render_names(s, group))
    lines.append(
        f"requests {s.requests}  succeeded {s.succeeded}  failed {s.failed}  "
        f"duration {s.duration_s:.1f} s  request rate {s.request_rate:.2f}/s  "
        f"output {s.output_tokens} tok ({s.output_token_rate:.1f} tok/s)  input {s.input_tokens} tok"
        + (f"  total token throughput {s.total_token_rate:.1f} tok/s" if s.total_token_rate is not None
           else "")
    )
    if s.steady:
        lines.append(steady_line(s.steady, s.requests))
    if s.media_items:
        lines.append(f"media: {s.media_items} images/clips, {s.media_tokens} prompt tokens (the server's count "
                     f"minus the exact text count), text {s.text_input_tokens} tokens")
    if s.inputs:
        lines.append(f"pooling: {s.inputs} inputs ({s.input_rate:.1f}/s, "
                     f"{s.inputs / max(1, s.succeeded):.1f} per request), "
                     f"{s.input_token_rate:.1f} input tok/s")
    if s.reasoning_requests:
        share = s.reasoning_tokens / s.output_tokens * 100 if s.output_tokens else 0.0
        counted = (f"; {s.reasoning_by_tokenizer} counted with the run's tokenizer (the stream carried no count)"
                   if s.reasoning_by_tokenizer else "")
        lines.append(f"reasoning: {s.reasoning_tokens} of the output tokens ({share:.1f}%) over "
                     f"{s.reasoning_requests} requests; TTFT is the first reasoning token, TTFO the first answer "
                     f"token{counted}")
    lines += tail_lines(s.timing)
    if s.removed_excluded:
        lines.append(f"load shape: {s.removed_excluded} requests were cut when their users were removed mid-run (a "
                     "ramp down, a new user count): logged, neither successes nor failures")
    if s.abandoned_excluded:
        lines.append(f"cancelled by the client (--cancel): {s.abandoned_excluded} requests given up on mid-answer: "
                     "logged with their partial timings, neither successes nor failures")
    if s.warmup_excluded:
        # a locustfile's own warm-up requests too (sessions.py's turn before AgentX's t*: with no --warmup given,
        # "started during --warmup" was not so)
        lines.append(f"warm-up: {s.warmup_excluded} requests sent as warm-up (started during --warmup, or sent as "
                     "warm-up by the locustfile) were logged, and left out of every number here")
    if s.backoffs:
        lines.append(f"backoff: users waited {s.backoffs} times ({s.backoff_s:.1f} s in all) before their next "
                     "request after a connection failure, a 5xx or a broken stream (--retry-backoff-max)")
    if s.records_per_request:
        lines.append(f"records {s.records} ({s.records_per_request} per request)  "
                     f"record rate {s.record_rate:.2f}/s")
    if server is not False:
        lines.append(render_server(server))  # type: ignore[arg-type]
    if s.cached_fraction is not None:
        lines.append(f"prefix cache (the server's usage per request): {s.cached_tokens} of the prompt tokens "
                     f"cached ({s.cached_fraction * 100:.1f}%)")
    if s.trace:
        t = s.trace
        lag = metric_stats(s, SEND_LAG)
        lines.append(f"trace: {t.sent} of {t.rows} rows sent, over {t.sent_span_s:.1f} s of the intended "
                     f"{t.intended_s:.1f} s" + (f"; send lag p99 {lag.at('p99') * 1000:.1f} ms, max "
                                                   f"{lag.max * 1000:.1f} ms" if lag.count else ""))
    if s.target_request_rate:
        lines.append(f"open loop: target {s.target_request_rate:.2f} req/s, achieved send rate {s.send_rate:.2f} req/s")
    if s.delivered:
        lines += [f"delivered load: {s.delivered['detail']}", *segment_lines(s.delivered)]
    lines += [f"fault: {line}" for line in disruption_lines(s.disruption)] if s.disruption else []
    lines += [f"scenario: {scenario_line(s.scenario)}"] if s.scenario else []  # --scenario
    lines += [f"reuse curve: {reuse}"] if (reuse := reuse_line(s.names)) else []  # locustfiles/reuse.py
    if s.valid_output is not None:  # --response-format
        lines.append(f"structured output: {s.valid_output * 100:.1f}% of {s.validated} answers valid JSON "
                     f"({interval_text(s.valid_output_ci)})")
    if s.accuracy is not None:  # --accuracy: each graded set's (its name's), with its interval
        lines += [accuracy_line(name, RunSummary.of(part)) for name, part in (s.names or {}).items()
                  if RunSummary.of(part).accuracy is not None]
    client = s.client or ClientVerdict()
    readers = list(client.readers)
    if readers == ["native"] and s.succeeded:  # nothing read: no "at most 0.0 ms after"
        lines.append(f"chunks timed by the native reader: each read as it landed, at most "
                     f"{client.read_lag_max * 1000:.1f} ms after (kernel stamps)")
    elif "clock" in readers:
        lines.append("chunks timed by the clock as the client's loop read each line (https:// or a session of the "
                     "user's own: TLS hides the kernel's stamps): exact while the loop keeps up with every stream"
                     + (f"; other answers by the {' and '.join(r for r in readers if r != 'clock')} reader"
                        if len(readers) > 1 else ""))
    elif "python" in readers:
        lines.append("chunks timed by the Python reader (the native one is off or not built: see `vllm-load "
                     "native`): exact while the client's loop keeps up with every stream")
    if client.saturated:
        lines.append(untrustworthy_line(client))
    for note in client.notes:
        lines.append(f"note: {note}")
    for w in (s.outages or []):
        lines.append(("OUTAGE: " if w.outage else "FAILURE STORM: ") + w.text)
    if s.workers_lost:
        at = s.workers_lost_at or {}
        lost = ", ".join(w if w not in at else f"{w} (never reported)" if at[w] is None
                         else f"{w} (last report {at[w]:.1f} s in)" for w in s.workers_lost)
        lines.append(f"WARNING: worker(s) lost mid-run, no final report: {lost} "
                     "(their requests after their last report, at most 3 s, are missing here but in their logs)")
    silent = silent_workers(s)
    if silent:
        lines.append(f"WARNING: {silent}")
    if s.saturation:
        lines.append(f"OVER-SATURATED: {s.saturation.text}")
    if s.energy or s.energy_missing:
        lines.append(energy_line(s))
    for w in s.profiled or []:  # --profile-at: where the server's profile sits in the run
        lines.append(f"profiled: {w.what}, {w.from_s:.1f}-{w.to_s:.1f} s into the measured window, on "
                     f"{w.targets} target(s) (the trace is where the server's --profiler-config writes it)")
    if s.input_drift_requests:
        lines.append(
            f"WARNING: {s.input_drift_requests} requests had a prompt length different from what was asked "
            f"(max |drift| {s.input_drift_max_abs} tokens): the tokenizer does not match the server's"
        )
    if s.usage_missing:
        lines.append(f"note: {s.usage_missing} successful requests had no usage from the server (or one no server could mean: "
                     "negative, fractional, over 2^31 tokens): their output tokens "
                     "were counted from the stream's deltas (one a delta, at most max_tokens; max_tokens where it "
                     "stopped for length: a lower bound where a server merges tokens), their input tokens are the "
                     "client's own exact count")
    if s.output_mismatch:
        lines.append(f"note: {s.output_mismatch} requests returned a different number of output tokens than asked")
    for reason, n in list(s.errors.items())[:10]:
        lines.append(f"failed x{n}: {reason}")
    return "\n".join(lines)
