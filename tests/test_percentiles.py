"""--metric-percentiles: the percentiles every medium shows, as vllm bench serve's option, computed exactly from the
histograms; an SLO on any percentile is computed for it."""

from __future__ import annotations

import json

import pytest

from tests.helpers import ROOT, run_in_process
from vllm_load.metrics.histogram import Histogram, parse_percentiles
from vllm_load.errors import UsageError
from vllm_load.rundir.reqlog import read_log


def test_parse_and_the_histograms_rank():
    assert parse_percentiles("99,25, 50") == (25.0, 50.0, 99.0)
    for bad in ("", "0", "100", "fifty", "50,-1"):
        with pytest.raises(UsageError):
            parse_percentiles(bad)
    h = Histogram()
    values = [i / 1000 for i in range(1, 1001)]  # 1 ms .. 1 s
    h.record_many(values)
    s = h.summary((25.0, 75.0, 99.99))
    for p, key in ((25.0, "p25"), (75.0, "p75"), (99.99, "p99.99")):
        assert s[key] == pytest.approx(values[hdr_rank(p, len(values)) - 1], rel=1e-3)
    # hdrh's rank rounds p*N half up: of 7 values, p75 is the 5th (5.25 rounds to 5; a ceiling would say the 6th)
    few = Histogram()
    few.record_many([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
    assert few.summary((75.0,))["p75"] == pytest.approx(0.5, rel=1e-3)


def hdr_rank(p: float, n: int) -> int:
    """The 1-based rank hdrh's get_value_at_percentile reports (its target count: p*N/100 rounded half up)."""
    return max(int(p * n / 100 + 0.5), 1)


def test_a_run_shows_the_percentiles_asked_for_in_every_medium(tmp_path):
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "4", "-r", "4", "-t", "3s",
                          "--output-tokens", "8", "--metric-percentiles", "25,50,75", "--slo", "ttft.p80<=10s",
                          "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    header = next(line for line in res.stdout.splitlines() if line.startswith("metric "))
    assert header.split()[3:] == ["p25", "p50", "p75", "max"]
    result = json.loads((run_dir / "summary.json").read_text())
    summary = result["summary"]
    assert summary["percentiles"] == ["p25", "p50", "p75"]
    ttft = summary["metrics"]["ttft"]
    # the SLO's percentile is computed too, and judged
    assert ttft["p25"] <= ttft["p50"] <= ttft["p75"] <= ttft["p80"] and result["slo"][0]["passed"]
    logs = sorted(r["ttft"] for f in run_dir.glob("requests*.jsonl") for r in read_log(f) if r["ok"])
    assert ttft["count"] == len(logs)  # a run of 4N+3 requests is where a ceiling's rank and hdrh's part (CI failed on it)
    assert ttft["p75"] == pytest.approx(logs[hdr_rank(75.0, len(logs)) - 1], rel=2e-3)
    vllm = json.loads((run_dir / "vllm-result.json").read_text())
    assert vllm["p25_ttft_ms"] == pytest.approx(ttft["p25"] * 1000) and "p75_e2el_ms" in vllm
    assert "p90_ttft_ms" not in vllm  # as vLLM: only the percentiles asked for
    # the console's last line says what to do next (the run was against the built-in emulator)
    assert res.stdout.rstrip().splitlines()[-1] == (
        f"next: open {run_dir / 'report.html'} in a browser; compare with another run: vllm-load compare {run_dir} "
        "OTHER; measure a real server: --host http://HOST:8000")
    html = (run_dir / "report.html").read_text()
    assert "<th>p25</th>" in html and "<th>p90</th>" not in html
