"""Saturated-client detection: the verdict rules, and a real open-loop run that the client cannot keep up with."""

import json

from tests.conftest import ROOT, run_locust
from vllm_load.client_health import ClientHealth


def test_verdict_rules():
    h = ClientHealth()
    h.add("w1", {"cpu": 95.0, "lag": 0.001, "streams": 10})
    h.add("w1", {"cpu": 50.0, "lag": 0.001, "streams": 10})
    h.add("w1", {"cpu": 96.0, "lag": 0.002, "streams": 12})
    assert not h.verdict()["saturated"]  # hot, but never twice in a row
    h.add("w1", {"cpu": 97.0, "lag": 0.002, "streams": 12})
    v = h.verdict()
    assert v["saturated"] and "two reports in a row" in v["reasons"][0] and v["streams_max"] == 12
    lagging = ClientHealth()
    lagging.add("w2", {"cpu": 10.0, "lag": 0.2, "streams": 1})
    assert "event loop lagged 200 ms" in lagging.verdict()["reasons"][0]
    assert ClientHealth().verdict(send_lag_p99=0.3)["reasons"] == ["open loop: requests left 300 ms late at p99"]
    assert not ClientHealth().verdict(send_lag_p99=0.001)["saturated"]


def test_open_loop_beyond_what_the_client_can_send_is_marked_untrustworthy(tmp_path, emulator_factory):
    emu = emulator_factory("--ttft", "0.05", "--itl", "0.01")
    run_dir = tmp_path / "run"
    # 50 req/s asked, but one user may hold only 2 streams of ~0.4 s: the client itself falls behind
    res = run_locust(["-f", str(ROOT / "locustfiles/completions.py"), "--headless", "-u", "1", "-r", "1", "-t", "4s",
                      "--host", emu.url, "--request-rate", "50", "--max-concurrency", "2", "--output-tokens", "32",
                      "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert summary["client"]["saturated"] and "late at p99" in summary["client"]["reasons"][-1]
    assert "UNTRUSTWORTHY RUN" in res.stdout
    assert "id='client-saturated'" in (run_dir / "report.html").read_text()


def test_a_comfortable_run_is_not_flagged(tmp_path, emulator_factory):
    emu = emulator_factory("--ttft", "0.02", "--itl", "0.005")
    run_dir = tmp_path / "run"
    res = run_locust(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "4s",
                      "--host", emu.url, "--output-tokens", "16", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0
    client = json.loads((run_dir / "summary.json").read_text())["summary"]["client"]
    assert client["saturated"] is False and client["streams_max"] >= 1
