"""One probe of the capacity search: a normal measured vllm-load run (its own run directory, warm-up excluded)
at one load level, judged by the tune's SLOs; what the tables need is read back from its summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vllm_load.metrics.judge.repeats import spread
from vllm_load.metrics.judge.verdict import Verdict
from vllm_load.rundir.reqlog import read_log
from vllm_load.errors import EXIT_BAD_INPUT, UsageError
from vllm_load.tune.children import spawning, stop_group
from vllm_load.metric_table import E2E, ITL, METRICS, OUTPUT_TOKENS, OUTPUT_TPS, TTFT
from vllm_load.metrics.summary import RunSummary, metric_stats


@dataclass
class Probe:
    level: float
    passed: bool
    code: int
    run_dir: str
    request_rate: float = 0.0
    output_token_rate: float = 0.0
    goodput: float | None = None
    ttft_mean: float | None = None  # seconds
    ttft_p99: float | None = None
    itl_mean: float | None = None
    itl_p99: float | None = None
    e2e_mean: float | None = None
    e2e_p99: float | None = None
    tps_per_user: float | None = None  # median output tokens/s of a request
    kv_max: float | None = None
    preemptions: float | None = None
    waiting_max: float | None = None
    prefix_hit_rate: float | None = None
    missed: tuple[str, ...] = ()  # the SLO checks that failed, with what was measured
    invalid: str = ""  # why the run measured nothing
    untrustworthy: str = ""  # why the run's own verdict disowns its numbers (the client could not keep time …)
    short: str = ""  # the probe was too short for its requests (their E2E p99 against its measured window)
    #: an earlier try of this probe missed while its client could not be trusted, so it was run once more: why
    reprobed: str = ""
    #: --repeat N: each repeat's own probe, and the spread of the main numbers over them (metrics/judge/repeats.spread)
    repeats: list[dict] = field(default_factory=list)
    spread: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


#: the numbers a repeated probe gives as their mean, with their spread over the repeats
SPREAD = ("request_rate", "output_token_rate", "goodput", "ttft_p99", "itl_p99", "e2e_p99")
_MEAN = (*SPREAD, "ttft_mean", "itl_mean", "e2e_mean", "tps_per_user", "prefix_hit_rate", "preemptions")
_MAX = ("kv_max", "waiting_max")


def combine(probes: list[Probe], confidence: float) -> Probe:
    """One level probed several times (tune --repeat): it passes when every repeat passed (a capacity a gate can
    trust run after run); its numbers are the repeats' means (the server's maxima their largest), with each main
    number's spread. The first repeat that misses ends the level: later ones could not make it pass."""
    if len(probes) == 1:
        return probes[0]

    def values(name: str) -> list[float]:
        return [v for p in probes if (v := getattr(p, name)) is not None]

    def joined(name: str) -> str:
        return "; ".join(dict.fromkeys(v for p in probes if (v := getattr(p, name))))

    means = {k: sum(vs) / len(vs) if (vs := values(k)) else None for k in _MEAN}
    maxima = {k: max(vs) if (vs := values(k)) else None for k in _MAX}
    first = probes[0]
    return Probe(level=first.level, passed=all(p.passed for p in probes),
                 code=next((p.code for p in probes if p.code), 0), run_dir=first.run_dir, **means, **maxima,
                 missed=tuple(dict.fromkeys(m for p in probes for m in p.missed)), invalid=joined("invalid"),
                 untrustworthy=joined("untrustworthy"), short=joined("short"), reprobed=joined("reprobed"),
                 repeats=[p.to_json() for p in probes],
                 spread={k: s for k in SPREAD if (s := spread(values(k), confidence)) is not None})


def run_probe(locust_args: list[str], url: str, level: float, mode: str, slos: list[str], sidecar_url: str,
              duration: str, warmup: str, run_dir: Path, rate_users: int, timeout: float) -> Probe:
    load = (["-u", str(int(level)), "-r", str(int(level))] if mode == "concurrency"
            else ["-u", str(rate_users), "-r", str(rate_users), "--request-rate", f"{level:g}"])
    argv = [sys.executable, "-m", "locust", *locust_args, "--headless", "--host", url, *load, "-t", duration,
            "--warmup", warmup, "--run-dir", str(run_dir), "--sidecar-url", sidecar_url,
            "--allow-untrustworthy"]  # judged by the SLOs here; the trust verdict is carried in the Probe
    for s in slos:
        argv += ["--slo", s]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(run_dir.parent / f"{run_dir.name}.log", "w") as log:
        proc = None
        try:
            with spawning():  # its own process group: a tune stopped by a signal stops the probe and all it started
                proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ),
                                        start_new_session=True)
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            code = -1
        except BaseException:
            if proc is not None:
                stop_group(proc)
            raise
    if code == EXIT_BAD_INPUT:
        tail = (run_dir.parent / f"{run_dir.name}.log").read_text(errors="replace")
        line = next((ln for ln in tail.splitlines() if ln.startswith("vllm-load: error:")), "see the probe's log")
        raise UsageError(f"a probe was refused: {line.removeprefix('vllm-load: error: ')}")
    return read_probe(level, code, run_dir)


def read_probe(level: float, code: int, run_dir: Path) -> Probe:
    try:
        data = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return Probe(level, False, code, str(run_dir), invalid=f"the probe wrote no summary (exit code {code})")
    s, server = RunSummary.of(data["summary"]), data.get("server") or {}
    stats = {m.key: metric_stats(s, m.key) for m in METRICS}

    def get(key: str, stat: str) -> float | None:
        return stats[key].at(stat) if stats[key].count else None

    verdict = Verdict.from_json(data)  # the probe run's own, as its summary.json keeps it
    served = served_in_window(run_dir, s)
    if served is not None:  # what the server completed in the window, whenever its requests started
        s = s.replace(request_rate=served["request_rate"], output_token_rate=served["output_token_rate"],
                      goodput=served["goodput"] if s.goodput is not None else None)
    e2e_p99 = get(E2E, "p99")
    window = s.duration_s or 0.0
    short = (f"requests took up to {e2e_p99:.1f} s (E2E p99) in a {window:.1f} s window: raise --probe-duration to "
             f"{SHORT_FACTOR} times that or more" if e2e_p99 and window and e2e_p99 * SHORT_FACTOR > window else "")
    missed = tuple(f"{c.slo} ({c.detail})" for c in verdict.checks if not c.passed)
    invalid = "; ".join(c.detail for c in verdict.validity if not c.passed)
    untrustworthy = verdict.distrust_reasons
    return Probe(level=level, passed=code == 0, code=code, run_dir=str(run_dir), request_rate=s.request_rate,
                 output_token_rate=s.output_token_rate,
                 goodput=s.goodput if s.goodput is not None else s.request_rate,
                 ttft_mean=get(TTFT, "mean"), ttft_p99=get(TTFT, "p99"), itl_mean=get(ITL, "mean"),
                 itl_p99=get(ITL, "p99"), e2e_mean=get(E2E, "mean"), e2e_p99=get(E2E, "p99"),
                 tps_per_user=get(OUTPUT_TPS, "p50"), kv_max=server.get("kv_cache_usage.max"),
                 preemptions=server.get("preemptions"), waiting_max=server.get("waiting.max"),
                 prefix_hit_rate=server.get("prefix_cache_hit_rate"), missed=missed, invalid=invalid,
                 untrustworthy=untrustworthy, short=short)


#: a probe's measured window should last this many times its requests' E2E p99, or its rates are mostly edge
SHORT_FACTOR = 3


def served_in_window(run_dir: Path, summary: Mapping[str, Any]) -> dict | None:
    """The probe's throughput as the server delivered it in the measured window: the requests that ended in it and
    the output tokens that landed in it, whenever their requests started (the LLM metrics count by start: at
    3,500 input / 500 output tokens, a 25 s window counted the few requests that both started and ended in it, and
    tune reported 1.43 -> 0.90 req/s from 8 to 32 users while the server completed a flat 1.60). None without the
    logs. ``goodput``: the good requests (every per-request SLO met) that ended in the window."""
    try:
        stats = json.loads((run_dir / "llm_stats.json").read_text())
    except (OSError, ValueError):
        return None
    logs = [r for f in sorted(run_dir.glob("requests*.jsonl")) for r in read_log(f)]
    end, length = stats.get("end"), RunSummary.of(summary).duration_s
    if not logs or not end or not length:
        return None
    start = end - length
    done = [r for r in logs if r.get("ok") and start <= r["start"] + r[E2E] <= end]
    tokens = 0
    for r in logs:
        if not r.get("ok") or r.get(OUTPUT_TOKENS) is None:
            continue
        counts = r.get("chunk_tokens") or [1] * len(r.get("chunk_offsets") or [])
        landed = [n for off, n in zip(r.get("chunk_offsets") or [], counts) if start <= r["start"] + off <= end]
        if landed and sum(counts):  # the server's count, spread over its chunks as they carried them
            tokens += sum(landed) * r[OUTPUT_TOKENS] / sum(counts)
    return {"request_rate": len(done) / length, "output_token_rate": tokens / length,
            "goodput": sum(1 for r in done if r.get("good")) / length}
