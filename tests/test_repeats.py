"""The spread over repeated runs: Student's t quantiles against published tables, and an interval that covers."""

import random

import pytest

from vllm_load.metrics.repeats import spread, spread_text, t_quantile


@pytest.mark.parametrize("p,df,table", [(0.975, 1, 12.706), (0.975, 2, 4.303), (0.975, 4, 2.776), (0.975, 9, 2.262),
                                        (0.975, 29, 2.045), (0.95, 9, 1.833), (0.995, 4, 4.604), (0.975, 10_000, 1.960)])
def test_t_quantiles_match_the_tables(p, df, table):
    assert round(t_quantile(p, df), 3) == table


def test_the_interval_covers_the_mean_as_often_as_it_says():
    rng = random.Random(1)
    hits = sum(abs(s["mean"] - 10.0) <= s["half"] for s in
               (spread([rng.gauss(10.0, 2.0) for _ in range(5)]) for _ in range(2000)))
    assert 0.93 <= hits / 2000 <= 0.97


def test_one_value_has_no_spread():
    assert spread([3.0]) is None and spread_text(None) == "-"
    s = spread([10, 12, 11, 13, 9])
    assert (s["mean"], round(s["std"], 4), s["n"]) == (11.0, 1.5811, 5) and spread_text(s) == "11.00 ± 1.96"


def test_welch_decides_from_the_spread_of_both_sides():
    from vllm_load.metrics.repeats import welch
    a = [100.0, 102.0, 98.0, 101.0, 99.0]
    assert welch(a, [x * 1.10 for x in a])["verdict"] == "higher"  # 10 % up, runs within 2 %: decided
    assert welch(a, [x * 0.9 for x in a])["verdict"] == "lower"
    assert welch(a, [101.0, 97.0, 103.0, 99.0, 100.0])["verdict"] == "no difference"
    w = welch(a, [x + 4.0 for x in a])
    assert round(w["pct"], 3) == 4.0 and 0 < w["half_pct"] < 4.0
    assert welch([1.0], a) is None
