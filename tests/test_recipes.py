"""Named search recipes (metrics/judge/recipes.py): ``--recipe max-goodput[:F]`` becomes the SLOs every run, sweep step and
tune probe is judged by; bad input is one line."""

from __future__ import annotations

import pytest

from vllm_load.errors import UsageError
from vllm_load.metrics.judge.recipes import Recipe, judged_slos, parse_recipe, with_recipe
from vllm_load.metrics.judge.slo import goodput_thresholds


@pytest.mark.parametrize("text, share", [("max-goodput", 0.9), ("max-goodput:95%", 0.95), ("max-goodput:0.5", 0.5),
                                         ("max-goodput:100%", 1.0), (" max-goodput:99.9% ", 0.999)])
def test_a_recipe_reads_its_attainment(text, share):
    r = parse_recipe(text)
    assert r == Recipe("max-goodput", pytest.approx(share))
    assert parse_recipe("") is None


@pytest.mark.parametrize("text, says", [("min-latency", "the recipes are max-goodput"),
                                        ("max-goodput:0%", "a share in (0, 100 %]"),
                                        ("max-goodput:150%", "a share in (0, 100 %]"),
                                        ("max-goodput:ninety", "a share in (0, 100 %]")])
def test_a_bad_recipe_is_one_line(text, says):
    with pytest.raises(UsageError, match=r"^--recipe .*" + says.replace("(", r"\(").replace(")", r"\)")):
        parse_recipe(text)


def test_max_goodput_is_the_attainment_floor_beside_the_per_request_limits():
    slos = judged_slos("max-goodput:95%", ["ttft.p90<=2s", "tpot.p90<=50ms", "error_rate<=1%"])
    assert [s.text for s in slos] == ["ttft.p90<=2s", "tpot.p90<=50ms", "error_rate<=1%", "good_request_fraction>=95%"]
    floor = slos[-1]
    assert (floor.metric, floor.op, floor.threshold) == ("good_request_fraction", ">=", pytest.approx(0.95))
    # each request is judged by the limits, the run by their share
    assert goodput_thresholds(slos) == {"ttft": 2.0, "tpot": 0.05}
    # multi-tier limits count: a class's own limit makes its requests good or bad
    assert with_recipe(parse_recipe("max-goodput"), ["ttft[interactive].p99<=200ms"])[-1] == "good_request_fraction>=90%"
    assert judged_slos("", ["ttft.p90<=2s"])[0].text == "ttft.p90<=2s"  # no recipe: the SLOs as given


def test_max_goodput_without_a_limit_or_beside_its_own_floor_is_refused():
    with pytest.raises(UsageError, match="needs a per-request limit to count good requests"):
        judged_slos("max-goodput", ["error_rate<=1%"])
    with pytest.raises(UsageError, match="needs a per-request limit"):
        judged_slos("max-goodput", ["ttft.p90>=1ms"])  # a lower bound makes no request bad
    with pytest.raises(UsageError, match="sets good_request_fraction itself"):
        judged_slos("max-goodput", ["ttft.p90<=2s", "good_request_fraction>=80%"])


def test_the_recipe_says_its_answer():
    assert Recipe("max-goodput", 0.9).headline("concurrency", 4, 11.234) == ("max goodput at 90% attainment: "
                                                                            "concurrency 4, 11.23 good req/s")
