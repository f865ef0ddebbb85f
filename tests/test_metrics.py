"""Metric arithmetic, exact histogram merging and wire round-trips."""

import random

import pytest

from vllm_load.histogram import Histogram
from vllm_load.record import RequestRecord
from vllm_load.stats import LLMStats


def rec(offsets, tokens, e2e, start=1000.0, out=None, ok=True, **kw):
    return RequestRecord(api="chat", start=start, e2e=e2e, ok=ok, ttft=offsets[0] if offsets else None,
                         chunk_offsets=offsets, chunk_tokens=tokens, output_tokens=out if out is not None else sum(tokens),
                         input_tokens=100, input_tokens_asked=100, tokens_from_usage=True, **kw)


def test_ttft_itl_tpot_definitions():
    r = rec([0.5, 0.6, 0.9, 1.0], [1, 1, 3, 1], e2e=1.0)
    assert r.ttft == 0.5
    assert r.chunk_itls() == pytest.approx([0.1, 0.3, 0.1])
    # per-token: the 3-token chunk spreads its 0.3 s gap over 3 tokens
    assert r.token_itls() == [(pytest.approx(0.1), 1), (pytest.approx(0.1), 3), (pytest.approx(0.1), 1)]
    assert r.tpot == pytest.approx((1.0 - 0.5) / (6 - 1))
    # out-1 per-token gaps that sum to last minus first token time
    gaps = r.token_itls()
    assert sum(n for _, n in gaps) == r.output_tokens - 1
    assert sum(g * n for g, n in gaps) == pytest.approx(1.0 - 0.5)


def test_first_chunk_with_several_tokens_gives_zero_gaps():
    r = rec([0.2, 0.4], [3, 1], e2e=0.4)
    assert r.token_itls() == [(0.0, 2), (pytest.approx(0.2), 1)]


def test_single_token_output_has_no_tpot():
    assert rec([0.2], [1], e2e=0.2).tpot is None


def test_input_drift_only_counts_server_usage():
    r = rec([0.1], [1], e2e=0.1)
    r.input_tokens = 103
    assert r.input_drift == 3
    r.tokens_from_usage = False
    assert r.input_drift is None


def test_histogram_relative_error_is_within_0_1_percent():
    rng = random.Random(1)
    values = sorted(rng.lognormvariate(-4, 1.5) for _ in range(50_000))
    h = Histogram()
    for v in values:
        h.record(v)
    for p in (50, 90, 99, 99.9):
        exact = values[min(len(values) - 1, int(p / 100 * len(values)))]
        assert h.percentile(p) == pytest.approx(exact, rel=2e-3)
    assert h.percentile(100) == values[-1] and h.count == len(values)


def test_merge_equals_recording_everything_in_one():
    rng = random.Random(2)
    parts = [[rng.expovariate(20) for _ in range(3000)] for _ in range(3)]
    merged, single = Histogram(), Histogram()
    for part in parts:
        h = Histogram()
        for v in part:
            h.record(v)
            single.record(v)
        merged.merge(Histogram.from_wire(h.to_wire()))
    assert merged.count == single.count
    for p in (50, 95, 99, 99.9, 100):
        assert merged.percentile(p) == single.percentile(p)
    assert merged.total == pytest.approx(single.total)


def test_stats_delta_shipping_is_lossless():
    worker = LLMStats()
    master = LLMStats()
    everything = LLMStats()
    rng = random.Random(3)
    for i in range(200):
        offs = [0.05 + rng.random() * 0.01]
        for _ in range(rng.randint(1, 20)):
            offs.append(offs[-1] + rng.random() * 0.02)
        r = rec(offs, [1] * len(offs), e2e=offs[-1], start=1000.0 + i * 0.1, ok=rng.random() > 0.1,
                error=None)
        if not r.ok:
            r.error = "HTTP 500: boom"
        worker.add(r)
        everything.add(r)
        if i % 37 == 0:
            master.merge(LLMStats.from_wire(worker.take_delta()))
    master.merge(LLMStats.from_wire(worker.take_delta()))
    assert worker.requests == 0
    a, b = master.summary(10.0), everything.summary(10.0)
    ma, mb = a.pop("metrics"), b.pop("metrics")
    assert a == b
    assert ma.keys() == mb.keys()
    for key in ma:  # percentiles and counts exact; means equal up to float summation order
        assert {k: v for k, v in ma[key].items() if k != "mean"} == {k: v for k, v in mb[key].items() if k != "mean"}
        assert ma[key]["mean"] == pytest.approx(mb[key]["mean"], rel=1e-12)
    assert master.tokens_per_second == everything.tokens_per_second


def test_open_loop_arrivals_rate_burstiness_and_ramp():
    import random as _random

    from vllm_load.arrivals import ArrivalProcess

    for burstiness in (1.0, 0.5, 4.0):
        p = ArrivalProcess(20.0, burstiness, _random.Random(1))
        gaps = [p.next_gap() for _ in range(20000)]
        mean = sum(gaps) / len(gaps)
        var = sum((g - mean) ** 2 for g in gaps) / len(gaps)
        assert mean == pytest.approx(1 / 20, rel=0.03)
        # gamma(k): coefficient of variation 1/sqrt(k): Poisson 1, burstier above, more regular below
        assert (var ** 0.5) / mean == pytest.approx(1 / burstiness ** 0.5, rel=0.05)
    ramp = ArrivalProcess(10.0, 1.0, _random.Random(2), ramp_up=10.0)
    assert ramp.rate_at(0.0) == pytest.approx(0.1) and ramp.rate_at(5.0) == 5.0 and ramp.rate_at(20.0) == 10.0
