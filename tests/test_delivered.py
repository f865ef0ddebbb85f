"""The load delivered against the load asked (metrics/shape/delivered.py): an open loop's sent rate and inter-arrival CV
against its sampling band, a closed loop's requests in flight against its users, and --strict-load's verdict.
The shipped arrivals pass; arrivals made wrong on purpose (the old per-user gamma processes, a slow sender) are
flagged; the band's false-flag rate is measured over many seeded draws."""

from __future__ import annotations

import json
import math
import random

import pytest

from tests.helpers import ROOT, run_in_process
from vllm_load.metrics.shape.delivered import MIN_GAPS, Sends, delivered, expected_cv, in_flight, in_flight_finding
from vllm_load.metrics.stats import LLMStats
from vllm_load.metrics.judge.verdict import judge
from vllm_load.workload.arrivals import ArrivalSequence, constant_gap, unit_gap


def shipped(rate: float, k: float, n: int, processes: int = 1, seed: str = "s") -> list[float]:
    """The shipped arrivals of every process of a run, merged (each takes every processes-th of one sequence)."""
    out: list[float] = []
    for index in range(processes):
        seq = ArrivalSequence(constant_gap(rate), k, seed, index, processes)
        out += [seq.next() for _ in range(n // processes)]
    return out


@pytest.mark.parametrize("k", [0.5, 1.0, 8.0, math.inf])
@pytest.mark.parametrize("processes", [1, 3])
def test_the_shipped_arrivals_are_delivered_as_asked(k, processes):
    found = delivered(shipped(20.0, k, 3000, processes), 20.0, k)
    assert found is not None and found.judged and found.as_asked, found.describe()
    assert found.cv == pytest.approx(expected_cv(k), abs=found.cv_band)
    if math.isinf(k):
        assert found.ks_d is None  # a constant rate has no shape to test
    else:  # the Kolmogorov-Smirnov test finds the asked gamma shape (scipy's, over the gaps' own mean)
        assert found.ks_p is not None and found.ks_p > 1e-3 and found.ks_d < 0.05, found.describe()


def test_per_user_gamma_processes_are_flagged_as_burstier_than_asked():
    """The old defect: 8 users each a gamma(8) process at R/8, merged: Poisson-like (CV ~0.9 for 0.35)."""
    rng = random.Random(1)
    sends = []
    for _ in range(8):
        t = 0.0
        for _ in range(400):
            t += unit_gap(rng, 8.0) / (20.0 / 8)
            sends.append(t)
    found = delivered(sends, 20.0, 8.0)
    assert found is not None and found.as_asked is False and found.rate_ok and not found.cv_ok
    assert found.cv > 0.7 and "NOT as asked (burstiness)" in found.describe()
    assert found.ks_p is not None and found.ks_p < 1e-6 and found.ks_d > 0.1  # the shape is not gamma(8)


def test_a_sender_that_falls_behind_is_flagged_at_its_rate():
    """Each send 15 % later than the last (a client short of time): the rate delivered is 13 % under the asked."""
    sends = [i / 20.0 * 1.15 for i in range(1000)]
    found = delivered(sends, 20.0, math.inf)
    assert found is not None and not found.rate_ok and found.cv_ok and "NOT as asked (rate)" in found.describe()


def test_too_few_gaps_are_not_judged():
    found = delivered(shipped(20.0, 1.0, MIN_GAPS), 20.0, 1.0)
    assert found is not None and found.as_asked is None and "too few to judge" in found.describe()
    assert delivered([1.0, 2.0], 1.0, 1.0) is None


@pytest.mark.parametrize("k", [0.5, 1.0, 4.0])
def test_the_band_flags_under_one_percent_of_true_arrivals(k):
    """400 seeded runs of 300 gaps each from the asked distribution: the band (4 standard errors by the delta
    method) flags at most 1 % of them, and would flag far more at 2 standard errors' width (it is not loose)."""
    flagged, tight = 0, 0
    for seed in range(400):
        found = delivered(shipped(10.0, k, 301, seed=f"band{seed}"), 10.0, k)
        assert found is not None
        flagged += not found.as_asked
        tight += abs(found.cv - found.cv_asked) > found.cv_band / 2 or abs(found.rate - found.rate_asked) > \
            found.rate_band / 2
    assert flagged <= 4, flagged
    assert tight >= 8, tight  # ~5-9 % beyond 2 SE: the band is as wide as the sampling error, not wider


def test_sends_are_shipped_and_merged_as_the_other_totals():
    a, b = LLMStats(), LLMStats()
    a.sends.extend([1.0, 3.0])
    b.sends.extend([2.0])
    merged = LLMStats.from_wire(a.to_wire())
    merged.merge(LLMStats.from_wire(b.take_delta()))
    assert sorted(merged.sends.times) == [1.0, 2.0, 3.0] and not b.sends.times
    s = Sends()
    s.extend(range(5))
    assert list(s.times) == [0, 1, 2, 3, 4]


def test_a_closed_loops_in_flight_is_littles_law():
    assert in_flight(requests=400, mean_e2e=0.5, window_s=50.0) == pytest.approx(4.0)
    assert in_flight_finding(3.95, 4)["as_asked"] and not in_flight_finding(3.0, 4)["as_asked"]


def test_strict_load_makes_an_undelivered_run_invalid():
    summary = {"requests": 10, "succeeded": 10, "failed": 0, "usage_missing": 0, "input_drift_requests": 0,
               "delivered": {"as_asked": False, "detail": "17.4 req/s sent of 20 asked: NOT as asked (rate)"}}
    assert judge(summary, []).exit_code == 0  # said, not held against the run
    strict = judge(summary, [], strict_load=True)
    assert strict.exit_code == 4 and "NOT as asked (rate)" in strict.invalid[0].detail
    summary["delivered"]["as_asked"] = None  # too few to judge: not a failure
    assert judge(summary, [], strict_load=True).exit_code == 0


@pytest.mark.slow  # the fast selection's unit tests hold the logic; these two runs its timing, on quiet cores
@pytest.mark.quiet_cores  # the sends' own timing is the subject
def test_an_open_loop_run_says_its_delivered_load(tmp_path):
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "8", "-r", "8", "-t", "60s",
                          "--request-rate", "40", "--burstiness", "4", "--num-requests", "260", "--strict-load",
                          "--input-tokens", "32", "--output-tokens", "4", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    d = json.loads((run_dir / "summary.json").read_text())["summary"]["delivered"]
    assert d["as_asked"] is True and d["cv_asked"] == 0.5 and d["gaps"] >= 150, d
    assert "delivered load: " in res.stdout
    assert "Delivered load: " in (run_dir / "report.html").read_text()


@pytest.mark.slow
@pytest.mark.quiet_cores  # requests in flight are a matter of the client's time
def test_a_closed_loop_run_says_its_requests_in_flight(tmp_path):
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "4", "-r", "4", "-t", "60s",
                          "--num-requests", "200", "--strict-load", "--emulator-ttft", "0.02", "--emulator-itl", "0.01",
                          "--input-tokens", "32", "--output-tokens", "8", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    d = json.loads((run_dir / "summary.json").read_text())["summary"]["delivered"]
    assert d["users"] == 4 and d["as_asked"] is True and 3.6 <= d["in_flight"] <= 4.0, d

