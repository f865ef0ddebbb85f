"""SLO parsing, evaluation on known data, JUnit output, and exit codes of real headless runs."""

import json
import xml.etree.ElementTree as ET

import pytest

from tests.helpers import ROOT, run_in_process
from vllm_load.errors import UsageError
from vllm_load.client.record import RequestRecord
from vllm_load.report.results import exit_code
from vllm_load.metrics.judge.slo import evaluate, goodput_thresholds, parse_slo, parse_slo_option
from vllm_load.report.results import junit_xml
from vllm_load.metrics.stats import LLMStats
from vllm_load.metrics.summary import MetricSummary


@pytest.mark.parametrize("text, metric, stat, op, value", [
    ("ttft.p99<=500ms", "ttft", "p99", "<=", 0.5),
    ("itl.p95 < 40ms", "itl", "p95", "<", 0.04),
    ("e2e.max<=2s", "e2e", "max", "<=", 2.0),
    ("tpot.p99.9<=800us", "tpot", "p99.9", "<=", 0.0008),
    ("error_rate<=1%", "error_rate", "", "<=", 0.01),
    ("good_request_fraction>=95%", "good_request_fraction", "", ">=", 0.95),
    ("goodput>=12.5", "goodput", "", ">=", 12.5),
    ("goodput>=12.5req/s", "goodput", "", ">=", 12.5),
    ("e2el.p99<=2s", "e2e", "p99", "<=", 2.0),
    ("itl_token.p99<=20ms", "itl_token", "p99", "<=", 0.02),
    ("output_token_rate>=2000", "output_token_rate", "", ">=", 2000),
    ("server.prefix_cache_hit_rate<=0%", "server.prefix_cache_hit_rate", "", "<=", 0.0),
    ("server.preemptions<=0", "server.preemptions", "", "<=", 0),
])
def test_parse_good(text, metric, stat, op, value):
    s = parse_slo(text)
    assert (s.metric, s.stat, s.op) == (metric, stat, op)
    assert s.threshold == pytest.approx(value)


@pytest.mark.parametrize("text, match", [
    ("ttft<=500ms", "needs a statistic"),
    ("ttft.p99<=500", "needs a time unit"),
    ("latency.p99<=5ms", "unknown metric"),
    ("ttft.p99 = 5ms", "malformed"),
    ("error_rate.p99<=1%", "takes no"),
    ("good_request_fraction>=95ms", "percentage"),
    ("goodput>=95ms", "is in req/s"),
])
def test_parse_bad(text, match):
    with pytest.raises(UsageError, match=match):
        parse_slo(text)


def test_files_yaml_and_toml(tmp_path):
    y = tmp_path / "slo.yaml"
    y.write_text("slo:\n  - ttft.p99<=500ms\n  - error_rate<=1%\n")
    t = tmp_path / "slo.toml"
    t.write_text('[slo]\n"itl.p99" = "<=50ms"\n"goodput" = ">=90%"\n')
    assert [s.text for s in parse_slo_option([str(y)])] == ["ttft.p99<=500ms", "error_rate<=1%"]
    assert [s.text for s in parse_slo_option([str(t)])] == ["itl.p99<=50ms", "goodput>=90%"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("slo: [ttft.p99<=5ms\n")
    with pytest.raises(UsageError, match="does not parse"):
        parse_slo_option([str(bad)])
    with pytest.raises(UsageError, match="cannot be read"):
        parse_slo_option([str(tmp_path / "missing.yaml")])
    evil = tmp_path / "evil.yaml"
    evil.write_text("slo: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(UsageError):  # safe_load refuses Python tags
        parse_slo_option([str(evil)])


def known_stats():
    stats = LLMStats()
    limits = goodput_thresholds([parse_slo("ttft.p99<=100ms"), parse_slo("e2e.p50<=1s")])
    for i in range(100):
        ttft = 0.010 * (i + 1)  # 10 ms .. 1000 ms
        r = RequestRecord(api="chat", start=1000.0, e2e=ttft + 0.5, ok=i < 98, ttft=ttft,
                          chunk_offsets=[ttft, ttft + 0.5], chunk_tokens=[1, 1], output_tokens=2, input_tokens=10,
                          tokens_from_usage=True, error=None if i < 98 else "HTTP 500: x")
        r.good = r.ok and all(getattr(r, m) <= v for m, v in limits.items())
        stats.add(r)
    return stats.summary(duration=10.0)


def test_evaluation_on_known_data():
    summary = known_stats()
    checks = evaluate([parse_slo(t) for t in (
        "ttft.p50<=500ms", "ttft.p99<=100ms", "error_rate<=1%", "error_rate<=5%", "goodput>=10%",
        "goodput>=20%", "server.preemptions<=0")], summary)
    got = {c.slo: c.passed for c in checks}
    assert got == {"ttft.p50<=500ms": True, "ttft.p99<=100ms": False, "error_rate<=1%": False,
                   "error_rate<=5%": True, "goodput>=10%": True, "goodput>=20%": False,
                   "server.preemptions<=0": False}
    # ttft <= 100 ms and e2e <= 1 s: requests 0..9 (ttft 10..100 ms), all of which succeeded: 10 good requests
    # in 10 s is vLLM's goodput, 1/s; the old spelling goodput>=10% judges their share
    assert summary["good_request_fraction"] == pytest.approx(0.10)
    assert summary["goodput"] == pytest.approx(1.0)
    assert "no server-side data" in checks[-1].detail
    root = ET.fromstring(junit_xml(checks))
    assert root.get("tests") == "7" and root.get("failures") == "4"
    assert [tc.get("name") for tc in root.iter("testcase")][1] == "ttft.p99<=100ms"
    # a saved run re-judged on a percentile it did not compute: the check says so, and fails
    m = summary.metrics["ttft"]
    assert isinstance(m, MetricSummary) and m.count == 98 and m.at("p99") == m["p99"] and m.at("p75") is None
    missing = evaluate([parse_slo("ttft.p75<=1s")], summary)[0]
    assert not missing.passed and "computed no p75" in missing.detail


def test_exit_code_rules():
    summary = known_stats()
    slos = [parse_slo("ttft.p50<=500ms")]
    assert exit_code(summary, evaluate(slos, summary), slos) == 1  # failures and no error-rate SLO
    slos = [parse_slo("error_rate<=5%")]
    assert exit_code(summary, evaluate(slos, summary), slos) == 0
    slos = [parse_slo("ttft.p99<=100ms")]
    assert exit_code(summary, evaluate(slos, summary), slos) == 3


@pytest.mark.parametrize("slo, code, verdict", [("ttft.p99<=2s", 0, "pass"), ("itl.p50<=1ms", 3, "fail")])
def test_headless_exit_codes(emulator_factory, tmp_path, slo, code, verdict):
    emu = emulator_factory("--ttft", "0.02", "--itl", "0.005")
    junit = tmp_path / "ci" / "slo.xml"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "3s",
                          "--host", emu.url, "--output-tokens", "16", "--slo", slo, "--slo", "error_rate<=0%",
                          "--junit", str(junit), "--run-dir", str(tmp_path / "run")], cwd=tmp_path)
    assert res.returncode == code, res.stdout[-2000:] + res.stderr[-2000:]
    assert f"SLO verdict: {verdict.upper()}" in res.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["verdict"] == verdict and summary["exit_code"] == code
    assert ET.parse(junit).getroot().get("failures") == ("0" if code == 0 else "1")


def test_malformed_slo_is_refused_before_the_run(tmp_path):
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "1", "-t", "2s",
                          "--slo", "ttft<=5", "--run-dir", str(tmp_path / "run")], cwd=tmp_path)
    assert res.returncode == 2
    assert [line for line in res.stderr.splitlines() if line.startswith("vllm-load: error:")] == [
        "vllm-load: error: SLO 'ttft<=5' needs a statistic: ttft.p99, ttft.p50, ttft.max …"]
    assert not (tmp_path / "run").exists()


def test_an_slo_can_judge_the_requests_of_one_name():
    s = LLMStats()
    for i in range(50):
        s.add(RequestRecord(api="chat", start=1000.0 + i, e2e=1.0, ok=True, ttft=0.1, chunk_offsets=[0.1],
                            chunk_tokens=[1], output_tokens=1, name="turn 1"))
        s.add(RequestRecord(api="chat", start=1000.0 + i, e2e=1.0, ok=True, ttft=0.9, chunk_offsets=[0.9],
                            chunk_tokens=[1], output_tokens=1, name="turn 3"))
    summary = s.summary()
    slos = [parse_slo("ttft[turn 1].p99<=200ms"), parse_slo("ttft[turn 3].p99<=200ms"), parse_slo("ttft[turn 9].p50<=1s")]
    assert slos[0].name == "turn 1" and slos[0].metric == "ttft" and slos[0].stat == "p99"
    checks = evaluate(slos, summary)
    assert [c.passed for c in checks] == [True, False, False]
    assert "no request was named 'turn 9'" in checks[2].detail and "'turn 1'" in checks[2].detail
    # a named SLO does not decide goodput for every request
    assert goodput_thresholds(slos) == {}
    with pytest.raises(UsageError, match="belongs to the whole run"):
        parse_slo("server.preemptions[turn 1]<=0")


def test_old_spellings_keep_working_with_one_deprecation_line(capsys):
    from vllm_load.metrics.judge import slo as slo_mod

    slo_mod._warned.clear()
    assert parse_slo("itl_chunk.p99<=20ms").metric == "itl"
    assert parse_slo("itl_chunk.p50<=20ms").metric == "itl"
    assert parse_slo("goodput>=95%").metric == "good_request_fraction"
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(line.startswith("vllm-load: deprecated:") for line in err)
    assert "itl_token" in err[0] and "good_request_fraction" in err[1]


def test_runs_saved_with_the_old_names_read_with_the_new_ones():
    from vllm_load.metrics.stats import upgrade_summary

    s = LLMStats()
    s.add(RequestRecord(api="chat", start=1000.0, e2e=1.0, ok=True, ttft=0.1, chunk_offsets=[0.1, 0.3],
                        chunk_tokens=[1, 2], output_tokens=3))
    wire = s.to_wire()
    old = dict(wire, hists={{"itl_token": "itl", "itl": "itl_chunk"}.get(k, k): v for k, v in wire["hists"].items()})
    del old["names_version"]
    back = LLMStats.from_wire(old)
    assert back.hists["itl"].count == 1 and back.hists["itl_token"].count == 2  # 1 chunk gap, 2 token gaps
    summary = upgrade_summary({"metrics": {"itl": {"count": 2}, "itl_chunk": {"count": 1}}, "goodput": 0.5,
                               "good_requests": 5, "duration_s": 10.0})
    assert summary["metrics"]["itl"]["count"] == 1 and summary["metrics"]["itl_token"]["count"] == 2
    assert summary["good_request_fraction"] == 0.5 and summary["goodput"] == 0.5


def test_multi_tier_slo_groups_judge_each_request_by_its_own_class():
    """``ttft[interactive].p99<=200ms`` beside ``ttft[batch].p99<=5s``: a request's goodput limits are every request's,
    tightened by its own name's; a name with no limits of its own, where no run-wide one exists, is not judged."""
    slos = [parse_slo(t) for t in ("e2e[interactive].p99<=200ms", "e2e[batch].p99<=5s", "ttft[batch].p90<=2s",
                                         "tpot.p99<=50ms")]
    assert goodput_thresholds(slos, "interactive") == {"e2e": 0.2, "tpot": 0.05}
    assert goodput_thresholds(slos, "batch") == {"e2e": 5.0, "ttft": 2.0, "tpot": 0.05}
    assert goodput_thresholds(slos) == goodput_thresholds(slos, "other") == {"tpot": 0.05}
    assert goodput_thresholds([parse_slo("e2e[batch].p99<=5s")], "other") == {}  # no limit of its own: not judged


MIXED = '''
from locust import task
from vllm_load import LLMUser


class Interactive(LLMUser):
    @task
    def ask(self):
        self.llm.chat([{"role": "user", "content": self.llm.text(tokens=32)}], max_tokens=4, name="interactive")


class Batch(LLMUser):
    @task
    def summarize(self):
        self.llm.chat([{"role": "user", "content": self.llm.text(tokens=32)}], max_tokens=48, name="batch")
'''


def test_a_run_judges_each_class_by_its_tier_and_gates_each_tiers_attainment(emulator_factory, tmp_path):
    """Two classes against an emulator of 10 ms token gaps: interactive answers of 4 tokens (~60 ms), batch ones of
    48 (~500 ms). One run-wide e2e<=200ms would count every batch request bad; each class's own limit counts them
    all good, and each tier's attainment is its own SLO (``good_request_fraction[batch]>=95%``)."""
    emu = emulator_factory("--ttft", "0.02", "--itl", "0.01")
    (tmp_path / "mixed.py").write_text(MIXED)
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(tmp_path / "mixed.py"), "--headless", "-u", "2", "-r", "2", "-t", "60s",
                          "--num-requests", "20", "--host", emu.url, "--slo", "e2e[interactive].p99<=400ms",
                          "--slo", "e2e[batch].p99<=3s", "--slo", "good_request_fraction[interactive]>=95%",
                          "--slo", "good_request_fraction[batch]>=95%", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = [json.loads(x) for x in (run_dir / "requests.jsonl").read_text().splitlines()]
    batch = [r for r in logs if r["name"] == "batch" and r["ok"]]
    assert batch and all(r["e2e"] > 0.4 for r in batch)  # over the interactive limit: good only by their own
    assert all(r["good"] is True for r in logs if r["ok"]), [(r["name"], r["e2e"], r["good"]) for r in logs]
    names = json.loads((run_dir / "summary.json").read_text())["summary"]["names"]
    assert names["batch"]["good_request_fraction"] == names["interactive"]["good_request_fraction"] == 1.0
    assert "PASS  good_request_fraction[batch]>=95%" in res.stdout
