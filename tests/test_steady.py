"""The steady window: the requests that ran while every user was sending (the ramp's and the drain's left out),
reported beside the whole run, merged across workers, and judged by the SLOs with --window steady."""

from __future__ import annotations

import json

import pytest

from tests.helpers import ROOT, run_in_process
from vllm_load.client.record import RequestRecord
from vllm_load.metrics.judge.slo import evaluate, parse_slo_option
from vllm_load.metrics.stats import LLMStats
from vllm_load.plugin.load.steady import SteadyWindow
from vllm_load.rundir.reqlog import read_log

CHAT = str(ROOT / "locustfiles/chat.py")
USERS = 6


def _full_at(logs: list[dict], users: int) -> float:
    """When the requests in flight first numbered ``users``: the last user's first request, from the log alone. Each
    request's end is taken 2 ms early: a user's next start (wall clock) can precede its last end (start plus a
    perf_counter E2E) by microseconds, and five users then seemed six for an instant."""
    events = sorted([(r["start"], 1) for r in logs] + [(r["start"] + r["e2e"] - 0.002, -1) for r in logs])
    n = 0
    for t, d in events:
        n += d
        if n >= users:
            return t
    raise AssertionError(f"never {users} requests in flight")


def _check_window(logs: list[dict], summary: dict, users: int, ramped: bool = True, workers: int = 1) -> None:
    steady = [r for r in logs if r["steady"]]
    full = _full_at(logs, users)
    # the ramp is left out: requests that started with fewer users sending are not in it (Locust's spawning_complete
    # comes as the last user's greenlet starts: its first request may follow by a loop turn). A swarm's workers each
    # open their window as their own users start: on a busy host one worker's users started up to 0.22 s after the
    # other's (the master's epoch reached one process late), so each worker's window is checked against its users
    for worker in {r["worker"] for r in logs}:
        mine = [r for r in logs if r["worker"] == worker]
        own_full = _full_at(mine, users // workers) if workers > 1 else full
        assert all(r["start"] >= own_full - 0.05 for r in mine if r["steady"]), worker
    assert any(r["start"] < full - 0.05 for r in logs if not r["steady"]) or not ramped
    # no hole: every request that started after the full load and ended before the window's last end is in it (a
    # swarm's each worker's window: each closes at its own drain, one worker's up to a loop turn before another's).
    # A swarm's worker opens its window when the master passes its spawning_complete on, which the master fires only
    # once every worker reported its users: on a busy host that came after the full load, so a worker's
    # window is checked from its own first steady request (it opened no sooner than the full load, above)
    last = max(r["start"] + r["e2e"] for r in steady)
    for worker in {r["worker"] for r in logs}:
        mine = [r for r in logs if r["worker"] == worker]
        own_last = max((r["start"] + r["e2e"] for r in mine if r["steady"]), default=0.0)
        opened = full + 0.05 if workers == 1 else min((r["start"] for r in mine if r["steady"]), default=full)
        assert all(r["steady"] for r in mine if r["start"] >= opened and r["start"] + r["e2e"] <= own_last)
    # what the stop cut short (at most one request per user in flight at the stop) is left out
    assert 0 < sum(1 for r in logs if r["start"] + r["e2e"] > last) <= users
    s = summary["steady"]
    assert s["requests"] == len(steady) and s["metrics"]["ttft"]["count"] == len(steady)
    first = min(r["start"] for r in logs)
    assert s["window_s"][0] == pytest.approx(min(r["start"] for r in steady) - first, abs=1e-6)
    assert s["window_s"][1] == pytest.approx(last - first, abs=1e-6)


@pytest.mark.parametrize("length", [["-t", "9s"], ["-t", "60s", "--num-requests", "90"]], ids=["time", "count"])
def test_a_closed_loop_run_reports_its_steady_window_and_judges_the_slos_on_it(tmp_path, length):
    """Ended by -t (the stop closes the window) or by --num-requests (the share's last ticket closes it: the users
    stop one by one after it)."""
    run_dir = tmp_path / "run"
    # 6 users at 2/s: 2.5 s of ramp; the SLO judged on the steady window's TTFT
    res = run_in_process(["-f", CHAT, "--headless", "-u", str(USERS), "-r", "2", *length, "--output-tokens", "24",
                          "--run-dir", str(run_dir), "--slo", "ttft.p99<=5s", "--window", "steady"], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = json.loads((run_dir / "summary.json").read_text())
    logs = list(read_log(run_dir / "requests.jsonl"))
    _check_window(logs, out["summary"], USERS)
    if "--num-requests" in length:  # the window closes as the last ticket's request starts, not a request earlier:
        # whatever ended before that start, after the full load, is in it (benchmarks/mutations.py, mutation 2)
        full, last_start = _full_at(logs, USERS), max(r["start"] for r in logs)
        assert all(r["steady"] for r in logs if r["start"] >= full + 0.05 and r["start"] + r["e2e"] < last_start)
    (check,) = out["slo"]
    assert check["value"] == pytest.approx(out["summary"]["steady"]["metrics"]["ttft"]["p99"])
    assert check["detail"].endswith("in the steady window")
    line = next(x for x in res.stdout.splitlines() if x.startswith("steady window"))
    assert f"{out['summary']['steady']['requests']} of {out['summary']['requests']} requests" in line
    assert "steady window (every user sending" in (run_dir / "report.html").read_text()


@pytest.mark.slow  # a master and two workers over 9 s (12 s): the full suite's; the window's own tests stay fast
def test_a_swarms_steady_window_is_its_workers_merged(tmp_path):
    """Locust's master passes its spawning_complete on to its workers: each opens its window then, and the master's
    steady numbers are its workers' flagged requests merged."""
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", CHAT, "--headless", "-u", str(USERS), "-r", "3", "-t", "9s", "--processes", "2",
                          "--output-tokens", "24", "--run-dir", str(run_dir)], cwd=tmp_path, timeout=180)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = json.loads((run_dir / "summary.json").read_text())
    logs = [r for f in sorted(run_dir.glob("requests*.jsonl")) for r in read_log(f)]
    assert len({r["worker"] for r in logs}) == 2
    # a swarm's users may all wait for the run's epoch (the master's clock) and start as one: no ramp to leave out
    _check_window(logs, out["summary"], USERS, ramped=False, workers=2)


@pytest.mark.parametrize("extra, why", [
    (["--request-rate", "4", "--ramp-up", "2"], "a ramp changes the load all along"),
    (["--repeat", "2"], "--repeat's) steps each run at their own level"),
])
def test_window_steady_is_refused_where_a_run_has_no_one_level(tmp_path, extra, why):
    res = run_in_process(["-f", CHAT, "--headless", "-u", "2", "-t", "3s", "--window", "steady", "--slo", "ttft.p99<=1s",
                          "--run-dir", str(tmp_path / "run"), *extra], cwd=tmp_path, timeout=90)
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    errors = [x for x in res.stderr.splitlines() if x.startswith("vllm-load: error:")]
    assert len(errors) == 1 and "--window steady" in errors[0] and why in errors[0], res.stderr[-2000:]


def _rec(start: float, e2e: float, ttft: float) -> RequestRecord:
    return RequestRecord(api="chat", start=start, e2e=e2e, ok=True, ttft=ttft, chunk_offsets=[ttft, e2e],
                         chunk_tokens=[1, 1], input_tokens=8, output_tokens=2)


def test_the_window_holds_what_started_after_its_opening_and_ended_before_its_close():
    w = SteadyWindow(True)
    assert not w.holds(_rec(10.0, 1.0, 0.1))  # not yet open
    w.open(10.0)
    w.open(50.0)  # opened once: a later spawning_complete does not move it
    assert w.holds(_rec(10.0, 1.0, 0.1)) and not w.holds(_rec(9.9, 1.0, 0.1))
    w.close(20.0)
    w.close(30.0)
    assert w.holds(_rec(18.0, 2.0, 0.1)) and not w.holds(_rec(18.0, 2.1, 0.1))
    off = SteadyWindow(False)
    off.open(0.0)
    assert not off.holds(_rec(10.0, 1.0, 0.1))


def test_window_steady_judges_the_steady_requests_and_says_when_there_were_none():
    stats = LLMStats()
    for i in range(20):  # the ramp's requests are slow; the steady ones fast
        rec = _rec(100.0 + i, 0.5, 2.0 if i < 5 else 0.1)
        rec.steady = i >= 5
        stats.add(rec)
    summary = stats.summary()
    steady, run = parse_slo_option("ttft.p99<=1s", "steady"), parse_slo_option("ttft.p99<=1s")
    assert evaluate(steady, summary)[0].passed and not evaluate(run, summary)[0].passed
    # a run-wide metric stays the run's; a named SLO cannot be judged on the window
    (outage,) = evaluate(parse_slo_option("outage.seconds<=1", "steady"), summary)
    assert outage.passed and "steady" not in outage.detail
    (named,) = evaluate(parse_slo_option("ttft[a].p99<=1s", "steady"), summary)
    assert named.value is None and "per-name" in named.detail
    empty = LLMStats()
    empty.add(_rec(1.0, 0.5, 0.1))
    (none,) = evaluate(steady, empty.summary())
    assert not none.passed and "no request ran in the steady window" in none.detail


def test_a_count_ended_window_closes_as_its_last_request_starts(tmp_path):
    """--num-requests: the share's last ticket closes the window, not the one before it (an open loop at 10 req/s
    spaces the two 0.1 s apart; benchmarks/mutations.py's mutation 2 closed it a ticket early and no test saw it)."""
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", CHAT, "--headless", "-u", "2", "-r", "2", "-t", "60s", "--num-requests", "20",
                          "--request-rate", "10", "--burstiness", "inf", "--output-tokens", "4", "--window", "steady",
                          "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    starts = sorted(r["start"] for r in read_log(run_dir / "requests.jsonl"))
    assert len(starts) == 20
    # closed at the 20th request's begin: at or after its (intended) start, and well after the 19th's
    assert res.run.generator.steady.end >= starts[-1] - 0.02 > starts[-2] + 0.05, (res.run.generator.steady.end, starts[-2:])
