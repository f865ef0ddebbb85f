"""--ramp-up-strategy linear|exponential (vllm bench serve's ramp): the open loop's rate goes from
--ramp-up-start-rps to --ramp-up-end-rps over the run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT, run_in_process
from vllm_load.rundir.reqlog import read_log
from vllm_load.workload.arrivals import ramp_rate


def test_the_rate_follows_vllms_formulas():
    # vLLM: request i of N at start + (end - start)·i/(N-1), or start·(end/start)^(i/(N-1))
    assert ramp_rate("linear", 2, 20, 0.0) == 2 and ramp_rate("linear", 2, 20, 0.5) == 11
    assert ramp_rate("linear", 2, 20, 1.7) == 20  # past the end: the end rate
    assert ramp_rate("exponential", 2, 32, 0.5) == pytest.approx(8.0)
    assert ramp_rate("exponential", 2, 32, 0.25) == pytest.approx(4.0)
    assert ramp_rate("linear", 0, 10, 0.0) == pytest.approx(0.1)  # a rate of 0 would never send again


def _starts(run_dir):
    return sorted(r["start"] for f in run_dir.glob("requests*.jsonl") for r in read_log(f))


def _expected(strategy, start, end, seconds=6.0, until=6.0):
    """The run's one arrival sequence with constant gaps (--burstiness inf): request 0 at the start, then each
    next one once the ramp's rate has integrated to one more request; the sends in each half of the run."""
    from vllm_load.workload.arrivals import ArrivalSequence, time_ramp_gap

    seq = ArrivalSequence(lambda t, _i, u: time_ramp_gap(strategy, start, end, seconds, t, u), float("inf"), "x")
    halves = [0, 0]
    while (t := seq.next()) <= until:
        halves[t >= seconds / 2] += 1
    return halves


@pytest.mark.parametrize("strategy,start,end", [("linear", 2, 20), ("exponential", 2, 32)])
def test_a_ramped_run_sends_what_the_ramp_says(tmp_path, strategy, start, end):
    """With --burstiness inf (vLLM's constant gaps) the sends in each half of a 6 s run are the ramp's integral
    (19.5/46.5 for linear 2 -> 20 req/s, 13/52 for exponential 2 -> 32), from the run's one sequence over its
    two users."""
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "6s",
                          "--ramp-up-strategy", strategy, "--ramp-up-start-rps", str(start), "--ramp-up-end-rps", str(end),
                          "--burstiness", "inf", "--output-tokens", "4", "--emulator-ttft", "0.005",
                          "--emulator-itl", "0.002", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    starts = _starts(run_dir)
    t0 = json.loads((run_dir / "llm_stats.json").read_text())["start"]  # the schedule's start (its epoch)
    # up to the last send: the run's -t counts from Locust's start, a little before the schedule's
    halves = _expected(strategy, start, end, until=max(starts) - t0 + 0.001)
    first = sum(s - t0 < 3.0 for s in starts)
    second = sum(3.0 <= s - t0 < 6.0 for s in starts)
    assert first == pytest.approx(halves[0], abs=2) and second == pytest.approx(halves[1], abs=3), (first, second, halves)
    result = json.loads((run_dir / "vllm-result.json").read_text())
    assert (result["ramp_up_strategy"], result["ramp_up_start_rps"], result["ramp_up_end_rps"]) == (strategy, start, end)
    assert result["request_rate"] == "inf"


def test_a_ramp_over_a_request_count_ends_at_the_end_rate(tmp_path):
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "1", "-r", "1",
                          "--num-requests", "21", "--ramp-up-strategy", "linear", "--ramp-up-start-rps", "4",
                          "--ramp-up-end-rps", "40", "--burstiness", "inf", "--output-tokens", "4",
                          "--emulator-ttft", "0.005", "--emulator-itl", "0.002", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    starts = _starts(run_dir)
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert len(starts) == 21
    # request i leaves at rate 4 + 36·i/20: the first gap 1/4 s, the last 1/38.2 s
    assert gaps[0] == pytest.approx(1 / 4, abs=0.02) and gaps[-1] == pytest.approx(1 / 38.2, abs=0.01)


def test_the_users_ramp_follows_the_same_curves():
    from vllm_load.workload.arrivals import ramp_users

    assert [ramp_users("exponential", 1, 16, x / 4) for x in range(5)] == [1, 2, 4, 8, 16]
    assert [ramp_users("linear", 0, 8, x / 4) for x in range(5)] == [1, 2, 4, 6, 8]  # never 0 users
    # the shape in a child: importing Locust monkey-patches the process, and once ssl is imported (a test before
    # this one may have) the patch recurses in SSLContext
    check = ("from vllm_load.plugin.lifecycle.shapes import UsersRamp\nr = UsersRamp('exponential', 2, 32, 8.0)\n"
             "print(r.users_at(0.0), r.users_at(4.0), r.users_at(99.0))")
    out = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["2", "8", "32"], out.stderr[-2000:]


@pytest.mark.slow  # a users ramp over its seconds (10 s): the full suite's; the rate ramps stay fast
def test_a_closed_loop_ramps_its_users(tmp_path):
    """--ramp-up-strategy with --ramp-up-*-users (no rate): Locust's user count, as its own history records it each
    second, climbs the exponential curve from 1 to 16 users over the run, on chat.py with no shape of its own."""
    import csv

    from vllm_load.workload.arrivals import ramp_users

    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-t", "8s", "--ramp-up-strategy",
                          "exponential", "--ramp-up-start-users", "1", "--ramp-up-end-users", "16", "--output-tokens", "4",
                          "--emulator-ttft", "0.01", "--emulator-itl", "0.005", "--run-dir", str(run_dir),
                          "--csv", str(tmp_path / "locust"), "--csv-full-history"], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = [r for r in csv.DictReader(open(tmp_path / "locust_stats_history.csv")) if r["Name"] == "Aggregated"]
    counts = [int(r["User Count"]) for r in rows]
    while counts and counts[-1] == 0:  # the rows after the run stopped its users
        counts.pop()
    curve = {ramp_users("exponential", 1, 16, t / 80) for t in range(81)}  # the shape's users at each tenth of 8 s
    assert counts and all(c in curve | {0} for c in counts), counts  # only the curve's own steps
    assert counts == sorted(counts), counts  # it climbs, never drops mid-run
    assert counts[0] <= 2 and max(counts) >= 8, counts  # 1 at the start, 11 by 7 s (a row a second)
    result = json.loads((run_dir / "vllm-result.json").read_text())
    assert (result["ramp_up_strategy"], result["ramp_up_start_users"], result["ramp_up_end_users"]) == (
        "exponential", 1, 16)
    assert result["ramp_up_start_rps"] is None and result["completed"] > 0
