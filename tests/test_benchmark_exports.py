"""Every run and every sweep step in the public benchmarks' formats, with the run's own numbers: llm-d's Benchmark
Report v0.2 (benchmark_report_v0.2.yaml), validated by llm-d's own models (the ``llmd-benchmark-report``
package), and MLPerf Endpoints' performance report (performance/result_summary.json)."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.helpers import ROOT, run_in_process

def check_schema(report: dict) -> None:
    """llm-d's own models validate it (``llmd-benchmark-report``'s ``schema_v0_2``: no field they do not define, the
    units each statistic allows, the required fields); a hand-kept copy of their rules let ``requests_rate`` through
    where the schema names ``request_rate``, so llm-d's analysis refused every report vllm-load wrote."""
    from llmd_benchmark_report import BenchmarkReportV02

    BenchmarkReportV02.model_validate(report)
    assert report["version"] == "0.2"
    assert report["scenario"]["load"]["standardized"]["source"] in ("random", "sampled")
    aggregate = report["results"]["request_performance"]["aggregate"]
    assert isinstance(aggregate["requests"]["total"], int) and aggregate["requests"]["total"] >= 0


def test_the_schema_refuses_what_it_does_not_define():
    """The check above can fail: llm-d's model refuses a field it does not name and a unit it does not allow."""
    from llmd_benchmark_report import BenchmarkReportV02
    from pydantic import ValidationError

    good = {"version": "0.2", "run": {"uid": "u", "eid": "u"}, "scenario": {"load": {
        "metadata": {"schema_version": "0.0.1", "cfg_id": "c", "description": "d"}, "native": {"args": {}},
        "standardized": {"tool": "vllm-load", "tool_version": "1", "source": "random",
                         "input_seq_len": {"distribution": "fixed", "value": 128.0}}}},
            "results": {"request_performance": {"aggregate": {"requests": {"total": 1, "failures": 0},
                                                              "throughput": {"request_rate": {"units": "queries/s",
                                                                                              "mean": 1.0}}}}}}
    BenchmarkReportV02.model_validate(good)
    for path, bad in ((("throughput",), {"requests_rate": {"units": "queries/s", "mean": 1.0}}),
                      (("throughput",), {"request_rate": {"units": "tokens/s", "mean": 1.0}})):
        report = json.loads(json.dumps(good))
        report["results"]["request_performance"]["aggregate"][path[0]] = bad
        with pytest.raises(ValidationError):
            BenchmarkReportV02.model_validate(report)


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
