"""The run's analyses of its request logs, made once, when the run ends, and kept in its summary before anything
judges or renders it: the emulator's own lateness joined to the client's verdict, what each fault did
(disruption), each feature's part from the logs (``Feature.from_logs``, ``at_logs``: the protected class's penalty,
TTFT by input length, the tool calls' integrity, which replica served what), where each
request's time went (with the server's spans, when it sent them), and a scenario's
stamp held to the run's trust (an untrustworthy run is never VALID for a scenario).

Why here: ``report/html.build`` computed these six after the summary was written and replaced five of its fields
on every rebuild, so the summary the run wrote was not the one it was judged by. Now ``complete`` writes them into
``llm_stats.json``'s summary once (marked ``analysed``, with the SLOs the disruption was measured against) and the
report only reads; a directory from before (or re-judged by other SLOs) is completed the same way first."""

from __future__ import annotations

import json
from pathlib import Path

from vllm_load.features import FEATURES
from vllm_load.metrics.shape.breakdown import BEFORE_SERVER, TAILS, breakdown
from vllm_load.metrics.fleet.disruption import disruption, limits_of
from vllm_load.metrics.fleet.routing import Replicas
from vllm_load.metrics.fleet.server import server_summary
from vllm_load.metrics.judge.slo import parse_slo_option
from vllm_load.metrics.fleet.spans import join
from vllm_load.metrics.summary import RunSummary
from vllm_load.metrics.summary_parts import Timing
from vllm_load.metrics.judge.verdict import UNTRUSTWORTHY, judge_emulator, trust_check
from vllm_load.workload.scenarios import untrusted
from vllm_load.metric_table import (
    CLIENT_OVERHEAD, E2E, KV_TRANSFER, SERVER_DECODE, SERVER_PREFILL, SERVER_QUEUE, TTFT)
from vllm_load.report.exports.vllm_result import run_logs
from vllm_load.rundir.files import Run, RunDir, load_run
from vllm_load.rundir.reqlog import read_log

#: timing.jsonl: each request's server parts as its spans gave them (--otlp-receiver), beside the request log
TIMING_FIELDS = ("trace_id", "response_id", "start", "name", "replica", "prefill_replica", TTFT, E2E, SERVER_QUEUE,
                 SERVER_PREFILL, KV_TRANSFER, SERVER_DECODE, "server_ttft", "server_e2e", "span_ttft",
                 CLIENT_OVERHEAD, BEFORE_SERVER)


def analysed(run: Run, slo_texts: list[str]) -> RunSummary:
    """The run's summary with its analyses (a pure function of the run directory, but for timing.jsonl)."""
    opts = run.config.get("options", {})
    slos = parse_slo_option(slo_texts, str(opts.get("window") or "run"))
    server = server_summary(run.server)
    summary = judge_emulator(run.summary, server)  # the client's verdict with the emulator's own lateness
    if summary.scenario:  # --allow-untrustworthy accepts a run, never a scenario's stamp
        trust = trust_check(summary)
        if not trust.passed:
            summary = summary.replace(scenario=untrusted(dict(summary.scenario),
                                                         trust.detail.removeprefix(UNTRUSTWORTHY)))
    captured = opts.get("capture_header") or []
    logs = run_logs(run)
    spans = read_log(run.path / "spans.jsonl") if (run.path / "spans.jsonl").exists() else None
    joined = join(logs, spans) if spans is not None else None  # the server's spans (--otlp-receiver), per request
    header = str(captured[0]).lower() if captured else None
    done: dict = {}
    replica = Replicas(logs, header)  # one name per replica, failed requests included
    if summary.faults:  # what each fault did to the requests
        done["disruption"] = disruption([{**r, "target": replica(r)} for r in logs],
                                        summary.faults, limits_of(slos))
    parts = breakdown(logs, run.plan.computed_percentiles if run.plan is not None else TAILS, replica)
    if joined is not None:  # the join, request by request (the logs are the workers' own: left as they were)
        RunDir(run.path).write_series(RunDir(run.path).timing, [
            {k: r.get(k) for k in TIMING_FIELDS} for r in logs if r.get("span_ttft") is not None])
        parts = Timing({**(parts or {}), "spans": joined})
    if parts is not None:  # where each request's time went
        done["timing"] = parts
    measured = summary.features or {}
    features = {**measured,  # each feature's part from the logs (vllm_load/features/)
                **{f.name: part for f in FEATURES if (part := f.from_logs(logs, opts, measured.get(f.name), server)) is not None}}
    if features:
        done["features"] = features
    return summary.replace(**done) if done else summary


def complete(run_dir: str | Path, slo_texts: list[str] | None = None) -> Run:
    """The run with its analyses in its summary, made and written into ``llm_stats.json`` once (again only when
    other SLOs are asked than those it was analysed against: the disruption's recovery is judged by their limits)."""
    run = load_run(run_dir)
    texts = list(slo_texts) if slo_texts else list(run.slo_texts)
    rd = RunDir(run.path)
    data = json.loads(rd.stats.read_text())
    if "analysed" in data and data["analysed"].get("slos") == texts:
        return run
    run.summary = analysed(run, texts)
    data["summary"], data["analysed"] = run.summary, {"slos": texts}
    rd.write(rd.stats, data)
    return run
