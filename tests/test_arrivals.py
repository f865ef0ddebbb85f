"""Open-loop arrivals are the process asked for, at any user and process count: the run's one sequence (vLLM's
gamma semantics) dealt to users and processes, read back from the request logs' intended starts."""

from __future__ import annotations

import statistics

import pytest

from tests.helpers import ROOT, run_in_process
from vllm_load.rundir.reqlog import read_log

CHAT = str(ROOT / "locustfiles" / "chat.py")


def _intended(run_dir, whole: bool = True):
    """Every measured request's intended start (an open loop's start is its arrival's due time), sorted. Not
    ``whole``: those due before the last send less the run's largest send lag. A run ended by time leaves the
    arrivals its lagging users still held unsent (a busy host: users 1.1 s behind at the stop, the last 0.4 s of
    the sequence with holes, CV 3.7 for 0.35), so the sequence is read where every user had reached it."""
    records = [r for f in run_dir.glob("requests*.jsonl") for r in read_log(f) if not r.get("warmup")]
    if whole:
        return sorted(r["start"] for r in records)
    lags = [r.get("send_lag") or 0.0 for r in records]
    reached = max(r["start"] + lag for r, lag in zip(records, lags)) - max(lags)
    return sorted(r["start"] for r in records if r["start"] < reached)


def _run(tmp_path, name, *args, whole: bool = True):
    run_dir = tmp_path / name
    res = run_in_process(["-f", CHAT, "--headless", "-r", "100", "--output-tokens", "1", "--emulator-ttft", "0.002",
                          "--emulator-itl", "0.001", "--allow-untrustworthy", "--run-dir", str(run_dir), *args],
                         cwd=tmp_path, timeout=180)
    # --allow-untrustworthy: what is checked is the schedule each request was due at, not how late a busy host
    # sent it (send_lag), which the trust verdict is about
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return _intended(run_dir, whole)


@pytest.mark.parametrize("processes", [[], ["--processes", "2"]], ids=["one process", "two processes"])
def test_constant_rate_arrivals_are_evenly_spaced_across_users_and_processes(tmp_path, processes):
    # ended by its count (the schedule is the subject, not the run's length): 3 s instead of 8
    starts = _run(tmp_path, "run", "-u", "4", "-t", "60s", "--num-requests", "24", "--request-rate", "8",
                  "--burstiness", "inf", *processes)
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert len(starts) >= 20
    # 4 users (over 2 processes) at 8 req/s: one request every 0.125 s, not 4 at once every 0.5 s
    assert all(abs(g - 0.125) <= 0.002 for g in gaps), [round(g, 4) for g in gaps]


@pytest.mark.quiet_cores  # the actual sends' spread is the subject (beside a busy suite it failed, 1 in 2)
@pytest.mark.parametrize("burstiness,cv", [("8", 1 / 8 ** 0.5), ("1", 1.0)])
def test_the_aggregate_has_the_burstiness_asked_for_whatever_the_users(tmp_path, burstiness, cv):
    # gamma(k) gaps: CV 1/sqrt(k); 8 users each at an eighth of the rate added up to CV 0.99 for k = 8
    # by time, not --num-requests 440: a count ends when enough were sent, and a lagging user's arrivals were not
    starts = _run(tmp_path, "run", "-u", "8", "-t", "4s", "--request-rate", "100", "--burstiness", burstiness,
                  "--seed", "11", whole=False)
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert len(gaps) >= 300
    measured = statistics.pstdev(gaps) / statistics.mean(gaps)
    assert measured == pytest.approx(cv, abs=0.05 if burstiness == "8" else 0.08), measured
    assert statistics.mean(gaps) == pytest.approx(1 / 100, rel=0.1)
