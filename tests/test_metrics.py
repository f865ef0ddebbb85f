"""Metric arithmetic, exact histogram merging and wire round-trips."""

import json
import math
import random
from collections import Counter

import pytest

from vllm_load.metrics.histogram import Histogram
from vllm_load.client.record import RequestRecord
from vllm_load.metrics.stats import LLMStats


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


@pytest.mark.parametrize("shape", ["lognormal", "one value", "extremes", "decoded", "coarse"])
def test_the_vectorised_statistics_equal_hdrhs_own_walks(shape):
    """Percentiles, stddev and the recorded values come from numpy passes over the counters (the web UI's poll read
    them through hdrh's Python loops: 90 ms a histogram); each equals what hdrh's own iterators compute."""
    import numpy as np
    from hdrh.histogram import HdrHistogram
    from vllm_load.metrics.histogram import hdr_percentiles, hdr_recorded, hdr_stddev

    rng = np.random.default_rng(7)
    h = Histogram()
    if shape == "one value":
        h.record(0.0123)
    elif shape == "extremes":
        h.record_many([1e-9, 1e-9, 3599.0, 0.5, 2e-9])
    elif shape == "coarse":  # a milliseconds-scale histogram (token counts and the like use other scales)
        h = Histogram(scale=1.0)
        h.record_many(rng.integers(1, 5000, 20_000).astype(float))
    else:
        h.record_many(rng.lognormal(-4, 1.5, 50_000))
    if shape == "decoded":
        h = Histogram.from_wire(h.to_wire())
    hdr = h.counters()
    ps = [0.0, 1.0, 25.0, 50.0, 90.0, 99.0, 99.9, 99.99, 100.0]
    assert hdr_percentiles(hdr, ps) == [hdr.get_value_at_percentile(p) for p in ps]
    assert hdr_stddev(hdr) == pytest.approx(hdr.get_stddev(), rel=1e-12)
    items = [(i.value_iterated_to, i.count_at_value_iterated_to) for i in hdr.get_recorded_iterator()]
    values, counts = hdr_recorded(hdr)
    assert list(zip(values.tolist(), counts.tolist())) == items
    empty = HdrHistogram(1, 3_600_000_000_000, 3)
    assert hdr_percentiles(empty, ps) == [0] * len(ps) and hdr_stddev(empty) == 0.0


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
    a, b = dict(master.summary(10.0)), dict(everything.summary(10.0))
    ma, mb = a.pop("metrics"), b.pop("metrics")
    assert a == b
    assert ma.keys() == mb.keys()
    for key in ma:  # percentiles and counts exact; means equal up to float summation order
        assert {k: v for k, v in ma[key].items() if k != "mean"} == {k: v for k, v in mb[key].items() if k != "mean"}
        assert ma[key]["mean"] == pytest.approx(mb[key]["mean"], rel=1e-12)
    assert master.tokens_per_second == everything.tokens_per_second


def test_open_loop_arrivals_rate_burstiness_and_ramp():
    from vllm_load.workload.arrivals import ArrivalSequence, constant_gap, time_ramp_gap

    for burstiness in (1.0, 0.5, 4.0):
        seq = ArrivalSequence(constant_gap(20.0), burstiness, "seed")
        times = [seq.next() for _ in range(20001)]
        gaps = [b - a for a, b in zip(times, times[1:])]
        mean = sum(gaps) / len(gaps)
        var = sum((g - mean) ** 2 for g in gaps) / len(gaps)
        assert times[0] == 0.0 and mean == pytest.approx(1 / 20, rel=0.03)  # request 0 at the start, as vLLM's
        # gamma(k): coefficient of variation 1/sqrt(k): Poisson 1, burstier above, more regular below
        assert (var ** 0.5) / mean == pytest.approx(1 / burstiness ** 0.5, rel=0.05)
    # a linear ramp from 0 to 10 req/s over 10 s: the arrivals by time t are the rate's integral, 0.5 t² (a gap
    # drawn at the rate of its start would never leave 0)
    ramp = ArrivalSequence(lambda t, _i, u: time_ramp_gap("linear", 0.0, 10.0, 10.0, t, u), float("inf"), "s")
    times = [ramp.next() for _ in range(101)]
    for n, t in enumerate(times[1:], 1):
        assert 0.5 * t * t == pytest.approx(n, abs=1e-6) if t <= 10 else n == pytest.approx(50 + 10 * (t - 10))
    expo = ArrivalSequence(lambda t, _i, u: time_ramp_gap("exponential", 2.0, 32.0, 4.0, t, u), float("inf"), "s")
    times = [expo.next() for _ in range(20)]
    k = __import__("math").log(16.0)
    for n, t in enumerate(times[1:], 1):  # the integral of 2·16^(t/4) from 0 is 8/ln16·(16^(t/4) − 1)
        assert 8 / k * (16 ** (min(t, 4) / 4) - 1) + 32 * max(0.0, t - 4) == pytest.approx(n, abs=1e-6)


def test_the_run_s_one_sequence_is_dealt_to_processes_exactly():
    """Every process draws the run's sequence from one seed and takes arrivals i mod P: together they are the
    sequence, each arrival once, whatever P."""
    from vllm_load.workload.arrivals import ArrivalSequence, constant_gap, index_ramp_gap

    whole = ArrivalSequence(constant_gap(8.0), 8.0, "run")
    reference = [whole.next() for _ in range(600)]
    for processes in (2, 3, 5):
        shares = [ArrivalSequence(constant_gap(8.0), 8.0, "run", index, processes) for index in range(processes)]
        dealt = sorted(t for i, s in enumerate(shares) for t in (s.next() for _ in range(600 // processes)))
        assert dealt == reference[:len(dealt)]
    # vLLM's ramp over a request count: request i at rate start + (end - start)·i/(N-1); from 0, request 1 waits
    # for request 1's rate, not for ever
    seq = ArrivalSequence(index_ramp_gap("linear", 0.0, 40.0, 21), float("inf"), "r")
    times = [seq.next() for _ in range(21)]
    assert times[1] - times[0] == pytest.approx(1 / 2.0) and times[-1] - times[-2] == pytest.approx(1 / 38.0)


def test_batched_fold_equals_recording_each_value():
    """LLMStats defers per-token work and folds it vectorised; the result must equal recording
    every value one by one with Histogram.record (same buckets, counts, sums, min, max)."""
    rng = random.Random(5)
    recs = []
    for i in range(700):  # more than one FOLD_BATCH
        n = rng.randint(0, 40)
        offs = sorted(rng.uniform(0.01, 3.0) for _ in range(n))
        toks = [rng.choice([1, 1, 1, 2, 5]) for _ in range(n)]
        recs.append(rec(offs, toks, e2e=(offs[-1] if offs else 0.5) + 0.01, start=1000.0 + i * 0.05,
                        ok=rng.random() > 0.1, send_lag=rng.random() * 0.01 if i % 3 else None,
                        error=None))
    stats = LLMStats()
    for r in recs:
        stats.add(r)
    want = {k: Histogram(scale=h.scale) for k, h in LLMStats().hists.items()}
    win_itl = {}
    tps = Counter()
    for r in recs:
        if r.send_lag is not None:
            want["send_lag"].record(r.send_lag)
        for o, n in zip(r.chunk_offsets, r.chunk_tokens):
            tps[int(r.start + o)] += n
        if not r.ok:
            continue
        want["e2e"].record(r.e2e)
        if r.ttft is not None:
            want["ttft"].record(r.ttft)
        for g in r.chunk_itls():
            want["itl"].record(g)
        w = win_itl.setdefault(int(r.start // 10) * 10, Histogram())
        for g, times in r.token_itls():
            want["itl_token"].record(g, times)
            w.record(g, times)
        if r.tpot is not None:
            want["tpot"].record(r.tpot)
        if r.output_tps is not None:
            want["output_tps"].record(r.output_tps)
        want["input_tokens"].record(r.input_tokens)
        want["output_tokens"].record(r.output_tokens)
    for k, h in want.items():
        got = stats.hists[k]
        assert got.count == h.count and list(got.hdr.counts) == list(h.hdr.counts), k
        assert got.total == pytest.approx(h.total) and (not h.count or (got.min, got.max) == (h.min, h.max)), k
    assert stats.tokens_per_second == tps
    assert set(stats.windows) == set(win_itl)
    for w, h in win_itl.items():
        assert list(stats.windows[w]["itl_token"].hdr.counts) == list(h.hdr.counts)
    assert stats.requests == 700 and stats.failures == sum(not r.ok for r in recs)


def test_native_batch_recorder_equals_the_numpy_path_and_record():
    """``record_many`` runs in C where it was built (``_hdrnative.c``), else through numpy: both must fill
    exactly the buckets ``record`` fills, one value at a time, with the same count, sum, min and max, for
    lists and arrays, with and without per-value counts, across the histogram's whole range."""
    import numpy as np

    from vllm_load.metrics import histogram

    assert histogram._record_native is not None, "vllm_load/metrics/_hdrnative.c was not built"
    rng = np.random.default_rng(3)
    for trial in range(40):
        values = np.exp(rng.uniform(-25, 9, size=int(rng.integers(1, 3000))))  # 1e-11 s .. 2 h: both clamps
        values[: trial % 4] = [0.5, 1.0005e-6, 2.5e-9][: trial % 4]  # exact ties round half to even
        times = None if trial % 3 == 0 else rng.integers(0, 5, size=values.size)
        as_list = trial % 2 == 1
        native, numpy_path, one_by_one = Histogram(), Histogram(), Histogram()
        native.record_many(values.tolist() if as_list else values,
                           None if times is None else (times.tolist() if as_list else times))
        numpy_path._record_numpy(values, times)
        for i, v in enumerate(values.tolist()):
            if times is None or times[i]:
                one_by_one.record(v, 1 if times is None else int(times[i]))
        for h in (numpy_path, one_by_one):
            assert bytes(memoryview(native.hdr.counts)) == bytes(memoryview(h.hdr.counts)), trial
            assert (native.count, native.hdr.total_count) == (h.count, h.hdr.total_count), trial
            assert native.total == pytest.approx(h.total, rel=1e-12), trial
        assert (native.hdr.min_value, native.hdr.max_value) == (numpy_path.hdr.min_value, numpy_path.hdr.max_value)
        assert (native.min, native.max) == (numpy_path.min, numpy_path.max) == (values.min(), values.max())
    h = Histogram()
    h.record_many([])
    assert h.count == 0 and h.min == math.inf
    with pytest.raises(ValueError, match="NaN"):
        h.record_many([0.1, float("nan")])
    assert h.count == 0 and not any(h.hdr.counts)  # a bad value leaves the histogram as it was
    with pytest.raises(ValueError, match="length"):
        h.record_many([0.1, 0.2], [1])


def test_old_windows_are_packed_and_read_the_same():
    """A long run's per-window histograms must not hold 265 KB of counters each: windows a minute
    older than the newest are packed, and read (percentiles, wire, merge) exactly as before."""
    stats = LLMStats()
    for i in range(200):  # 200 requests over 200 s: 20 windows
        stats.add(rec([0.1 + i * 1e-4, 0.2, 0.35], [1, 1, 1], e2e=0.4, start=1000.0 + i))
    wins = stats.windows
    old = [w for w in wins if w < max(wins) - 60]
    assert len(old) >= 10 and all(h.hdr is None and len(h.packed) < 2000 for w in old for h in wins[w].values())
    assert all(h.hdr is not None for h in wins[max(wins)].values())
    ref = LLMStats()
    for i in range(200):
        if int((1000.0 + i) // 10) * 10 == old[0]:
            ref.add(rec([0.1 + i * 1e-4, 0.2, 0.35], [1, 1, 1], e2e=0.4, start=1000.0 + i))
    for m in ("ttft", "itl_token", "e2e"):
        assert wins[old[0]][m].summary() == ref.windows[old[0]][m].summary()
    # the wire keeps the packed encoding; a merge of two such runs equals the sum
    back = LLMStats.from_wire(json.loads(json.dumps(stats.to_wire())))
    both = LLMStats()
    both.merge(back)
    both.merge(LLMStats.from_wire(stats.to_wire()))
    assert both.windows[old[0]]["ttft"].count == 2 * ref.windows[old[0]]["ttft"].count
    assert both.windows[old[0]]["ttft"].percentile(50) == ref.windows[old[0]]["ttft"].percentile(50)
    # a late request for a packed window unpacks it and counts
    stats.add(rec([0.5], [1], e2e=0.6, start=float(old[0]) + 1))
    assert stats.windows[old[0]]["ttft"].count == ref.windows[old[0]]["ttft"].count + 1


def test_names_are_grouped_shipped_and_merged_exactly_and_bounded():
    from vllm_load.metrics.stats import MAX_NAMES, OTHER_NAMES

    rng = random.Random(7)
    workers = [LLMStats(), LLMStats()]
    by_name: dict = {}
    for i in range(400):
        name = rng.choice(["turn 1", "turn 2", "turn 10", None])
        ttft = rng.uniform(0.01, 0.5)
        r = rec([ttft, ttft + 0.01], [1, 1], e2e=ttft + 0.02, start=1000.0 + i * 0.01, name=name, cached_tokens=16)
        workers[i % 2].add(r)
        if name:
            by_name.setdefault(name, []).append(ttft)
    master = LLMStats()
    for w in workers:
        master.merge(LLMStats.from_wire(json.loads(json.dumps(w.take_delta()))))
    s = master.summary()
    assert list(s["names"]) == ["turn 1", "turn 2", "turn 10"]  # digits compare as numbers
    for name, values in by_name.items():
        h = Histogram()
        for v in values:
            h.record(v)
        named = s["names"][name]
        assert named["requests"] == len(values) and named["metrics"]["ttft"]["count"] == len(values)
        assert named["metrics"]["ttft"]["p99"] == pytest.approx(h.percentile(99), rel=1e-3)
        assert named["cached_fraction"] == pytest.approx(16 / 100)
    assert s["requests"] == 400 and "names" not in s["names"]["turn 1"]
    # a locustfile naming every request apart: the groups stop growing, the rest share one
    many = LLMStats()
    for i in range(MAX_NAMES + 50):
        many.add(rec([0.1], [1], e2e=0.2, name=f"request {i}"))
    assert len(many.names) == MAX_NAMES + 1 and many.names[OTHER_NAMES].requests == 50


def test_failures_group_by_kind_with_a_bound_and_a_raw_example():
    from vllm_load.client.record import RequestRecord
    from vllm_load.metrics.error_kinds import MAX_KINDS, OTHER
    from vllm_load.metrics.stats import LLMStats

    a, b = LLMStats(), LLMStats()
    for i in range(3000):  # a server quoting a unique id in every failure (the issue: 5,577 rows from 6,725)
        (a if i % 2 else b).add(RequestRecord("chat", 1.0 + i, 0.01, False, status=200,
                                              error=f"malformed SSE line: b'dta: {{\"id\": \"chatcmpl-{i:08x}\"}}'"))
    for i in range(200):  # and 200 really different kinds
        a.add(RequestRecord("chat", 1.0, 0.01, False, status=500, error=f"HTTP 500: kind {chr(65 + i % 26)}{i // 26}x"))
    a.merge(LLMStats.from_wire(b.to_wire()))
    s = a.summary(duration=1.0)
    assert s["errors"]["malformed SSE line: '…'"] == 3000
    assert s["error_examples"]["malformed SSE line: '…'"].startswith("malformed SSE line: b'dta: {\"id\": \"chatcmpl-0")
    assert len(s["errors"]) <= MAX_KINDS + 1 and OTHER in s["errors"]
    assert sum(s["errors"].values()) == s["failed"] == 3200


def test_the_live_export_says_which_replica_served_what():
    """Each replica's finished requests and prefix-cache hits, live on /metrics (the run's stats group requests
    by the replica that served them: the one its answer named, or the --host target)."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from vllm_load.metrics.fleet.prometheus import registry_for
    stats = LLMStats()
    for i in range(5):
        stats.add(rec([0.1, 0.2], [1, 1], e2e=0.2, start=1000.0 + i, target="r1" if i < 3 else "r2",
                      cached_tokens=16 * i, ok=i != 4))
    stats.fold()
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(registry_for(lambda: stats)).decode())}
    served = {(s.labels["replica"], s.labels["outcome"]): s.value for s in fams["vllm_load:replica_requests"].samples
              if s.name.endswith("_total")}
    assert served == {("r1", "ok"): 3, ("r1", "failed"): 0, ("r2", "ok"): 1, ("r2", "failed"): 1}
    cached = {s.labels["replica"]: s.value for s in fams["vllm_load:replica_cached_tokens"].samples
              if s.name.endswith("_total")}
    assert cached == {"r1": 16 * (0 + 1 + 2), "r2": 16 * 3}


def test_the_servers_parts_are_merged_exactly_and_exported_live_but_not_rows_of_the_table():
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from vllm_load.metrics.fleet.prometheus import registry_for
    from vllm_load.report.console import table_rows
    a, b = LLMStats(), LLMStats()
    for i in range(40):
        (a if i % 2 else b).add(rec([0.1, 0.2], [1, 1], e2e=0.2, start=1000.0 + i, server_queue=0.001 * i,
                                    server_prefill=0.05, server_decode=0.1, client_overhead=0.002))
    a.merge(LLMStats.from_wire(b.to_wire()))  # a worker's numbers, shipped and merged
    a.fold()
    s = a.summary(duration=10.0)
    assert s["metrics"]["server_queue"]["count"] == 40 and abs(s["metrics"]["server_queue"]["max"] - 0.039) < 1e-4
    assert not any(r["metric"].startswith("Server queue") for r in table_rows(s))  # said as the tails' split
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(registry_for(lambda: a)).decode())}
    count = next(x.value for x in fams["vllm_load:server_queue_seconds"].samples
                 if x.name.endswith("_count") and x.labels.get("name") == "(unnamed)")
    assert count == 40
