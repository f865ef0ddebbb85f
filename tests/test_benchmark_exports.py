"""Every run and every sweep step in the public benchmarks' formats, with the run's own numbers: llm-d's Benchmark
Report v0.2 (benchmark_report_v0.2.yaml), checked against the schema's rules as llm-d-benchmark's
benchmark_report/schema_v0_2.py states them (no field it does not define, the units each statistic allows, the
required fields), and MLPerf Endpoints' performance report (performance/result_summary.json)."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.helpers import ROOT, run_in_process

STAT = {"units", "mean", "mode", "stddev", "min", "p0p1", "p1", "p5", "p10", "p25", "p50", "p75", "p90", "p95", "p99",
        "p99p9", "max"}
#: schema_v0_2.py's fields per object (its models forbid any other), and the units each statistic takes
FIELDS = {"": {"version", "run", "scenario", "results"}, "run": {"uid", "eid", "cid", "time", "user"},
          "run.time": {"start", "end", "duration"}, "scenario": {"stack", "load"},
          "scenario.load": {"metadata", "standardized", "native"},
          "scenario.load.metadata": {"schema_version", "cfg_id", "description"},
          "scenario.load.standardized": {"tool", "tool_version", "source", "stage", "input_seq_len", "output_seq_len",
                                         "prefix", "multi_turn", "rate_qps", "concurrency"},
          "scenario.load.native": {"args", "envars", "config"},
          "results": {"request_performance", "observability", "profiling"},
          "results.request_performance": {"aggregate", "time_series"},
          "results.request_performance.aggregate": {"requests", "latency", "throughput"}}
AGGREGATE = {"requests": {"total", "failures", "incomplete", "input_length", "output_length"},
             "latency": {"time_to_first_token", "normalized_time_per_output_token", "time_per_output_token",
                         "inter_token_latency", "request_latency"},
             "throughput": {"input_token_rate", "output_token_rate", "total_token_rate", "requests_rate"}}
UNITS = {"input_length": {"count"}, "output_length": {"count"}, "time_to_first_token": {"ms", "s"},
         "request_latency": {"ms", "s"}, "time_per_output_token": {"ms/token", "s/token"},
         "inter_token_latency": {"ms/token", "s/token"}, "normalized_time_per_output_token": {"ms/token", "s/token"},
         "input_token_rate": {"tokens/s"}, "output_token_rate": {"tokens/s"}, "total_token_rate": {"tokens/s"},
         "requests_rate": {"queries/s"}}


def check_schema(report: dict) -> None:
    for path, allowed in FIELDS.items():
        node = report
        for part in filter(None, path.split(".")):
            node = node.get(part, {})
        assert set(node) <= allowed, (path, set(node) - allowed)
    assert report["version"] == "0.2" and "run" in report and "results" in report
    standardized = report["scenario"]["load"]["standardized"]
    assert {"tool", "tool_version", "source"} <= set(standardized) and standardized["source"] in ("random", "sampled")
    for name in ("input_seq_len", "output_seq_len"):
        if name in standardized:
            seq = standardized[name]
            assert seq["distribution"] in ("fixed", "gaussian", "random", "uniform", "other") and seq["value"] >= 1
    aggregate = report["results"]["request_performance"]["aggregate"]
    for part, allowed in AGGREGATE.items():
        assert set(aggregate[part]) <= allowed, (part, set(aggregate[part]) - allowed)
        for name, stats in aggregate[part].items():
            if isinstance(stats, dict):
                assert set(stats) <= STAT and stats["units"] in UNITS[name] and isinstance(stats["mean"], float)
    assert isinstance(aggregate["requests"]["total"], int) and aggregate["requests"]["total"] >= 0


@pytest.mark.slow  # a sweep (the fast selection keeps the Pareto front's own test)
def test_a_sweep_writes_each_public_format_per_run_and_per_step(tmp_path, emulator_factory):
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/sweep.py"), "--headless", "--host", emu.url, "--sweep", "1,3",
                          "--num-requests", "12", "--input-tokens", "64", "--output-tokens", "6",
                          "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    steps = sorted((run_dir / "steps").iterdir())
    reports = [yaml.safe_load((d / "benchmark_report_v0.2.yaml").read_text()) for d in [run_dir, *steps]]
    for report, d in zip(reports, [run_dir, *steps]):
        check_schema(report)
        s = json.loads((d / "summary.json").read_text())["summary"]
        aggregate = report["results"]["request_performance"]["aggregate"]
        assert aggregate["requests"]["total"] == s["requests"] and aggregate["requests"]["failures"] == s["failed"]
        ttft = aggregate["latency"]["time_to_first_token"]
        assert ttft["p99"] == s["metrics"]["ttft"]["p99"] and ttft["p99p9"] == s["metrics"]["ttft"]["p99.9"]
        assert aggregate["latency"]["inter_token_latency"]["mean"] == s["metrics"]["itl"]["mean"]
        assert aggregate["throughput"]["output_token_rate"]["mean"] == s["output_tokens"] / s["duration_s"]
        load = report["scenario"]["load"]["standardized"]
        assert load["tool"] == "vllm-load" and load["source"] == "random"
        assert load["input_seq_len"] == {"distribution": "fixed", "value": 64}
        assert load["output_seq_len"] == {"distribution": "fixed", "value": 6}
    # each step is a stage of the sweep's experiment, at its own concurrency
    run_id = reports[0]["run"]["uid"]
    assert [(r["run"]["eid"], r["scenario"]["load"]["standardized"]["stage"],
             r["scenario"]["load"]["standardized"]["concurrency"]) for r in reports[1:]] == [(run_id, 0, 1),
                                                                                        (run_id, 1, 3)]
    assert "api_key" not in (run_dir / "benchmark_report_v0.2.yaml").read_text()
    check_mlperf(run_dir)
    # the sweep page draws the steps' Endpoints points and their Pareto front
    page = (run_dir / "sweep.html").read_text()
    data = json.loads(re.search(r'<script type="application/json" id="chart-data">(.*?)</script>', page, re.S)[1])
    pareto = next(c for c in data["sweep"] if c["id"] == "sweep-pareto")
    points = sorted(json.loads((d / "performance" / "result_summary.json").read_text())["system_tps"]
                    for d in sorted((run_dir / "steps").iterdir()))
    assert pareto["x"] == [round(x, 3) for x in points] and pareto["series"][0]["step"] is True


def check_mlperf(run_dir) -> None:
    """performance/result_summary.json in MLPerf Endpoints' Report shape (inference_endpoint/metrics/report.py):
    its fields, times in ns, the exact statistics, a histogram holding every request, and the Pareto point's two
    numbers (tps_per_user = 1 / TPOT p90 in s, system_tps)."""
    fields = {"version", "git_sha", "test_started_at", "n_samples_issued", "n_samples_completed", "n_samples_failed",
              "duration_ns", "state", "complete", "ttft", "tpot", "latency", "input_sequence_lengths",
              "output_sequence_lengths", "legacy_loadgen_window_duration_ns", "qps", "tps", "run_config",
              "steady_state", "tps_per_user", "system_tps"}
    rollup = {"total", "min", "max", "median", "avg", "std_dev", "percentiles", "histogram"}
    for d in [run_dir, *sorted((run_dir / "steps").iterdir())]:
        point = json.loads((d / "performance" / "result_summary.json").read_text())
        s = json.loads((d / "summary.json").read_text())["summary"]
        assert set(point) == fields and point["state"] == "complete" and point["complete"] is True
        assert point["n_samples_completed"] == s["succeeded"] and point["n_samples_failed"] == s["failed"]
        for name in ("ttft", "tpot", "latency", "input_sequence_lengths", "output_sequence_lengths"):
            assert set(point[name]) == rollup, name
            hist = point[name]["histogram"]
            assert sum(hist["counts"]) == s["succeeded"] and len(hist["buckets"]) == len(hist["counts"]) == 10
        ttft = point["ttft"]
        assert ttft["percentiles"]["99"] == round(s["metrics"]["ttft"]["p99"] * 1e9)
        assert ttft["median"] == round(s["metrics"]["ttft"]["p50"] * 1e9) and isinstance(ttft["min"], int)
        assert point["output_sequence_lengths"]["total"] == s["output_tokens"]
        assert point["qps"] == s["succeeded"] / s["duration_s"] and point["system_tps"] == point["tps"]
        # 12 requests a step: too few for a plateau, said so; the point is then the whole step's
        assert point["steady_state"] == {"reason": f"{s['succeeded']} requests with a TPOT: a plateau needs 40"}
        assert point["tps_per_user"] == 1 / s["metrics"]["tpot"]["p90"]
    steps = sorted((run_dir / "steps").iterdir())
    patterns = [json.loads((d / "performance" / "result_summary.json").read_text())["run_config"]["load_pattern"]
                for d in steps]
    assert patterns == [{"type": "concurrency", "target_concurrency": 1}, {"type": "concurrency",
                                                                          "target_concurrency": 3}]


def test_the_pareto_front_is_the_points_no_other_beats_drawn_as_steps():
    from vllm_load.report.charts import pareto, pareto_steps

    points = [(100.0, 50.0, "a"), (300.0, 40.0, "b"), (250.0, 30.0, "c"), (500.0, 10.0, "d"), (80.0, 45.0, "e")]
    assert [p[2] for p in pareto(points)] == ["a", "b", "d"]  # c is beaten by b on both axes, e by a
    spec = pareto_steps(points, "x", "t")
    assert spec["x"] == [80.0, 100.0, 250.0, 300.0, 500.0]
    front, every = spec["series"]
    assert front["step"] is True and front["values"] == [None, 50.0, None, 40.0, 10.0]
    assert every["values"] == [45.0, 50.0, 30.0, 40.0, 10.0]
