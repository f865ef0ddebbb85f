"""--num-requests: a run ends after exactly N requests finished across all load processes, warm-up aside."""

from __future__ import annotations

import json

from tests.helpers import ROOT, run_locust
from vllm_load.rundir.reqlog import read_log


def _logs(run_dir):
    return [r for f in sorted(run_dir.glob("requests*.jsonl")) for r in read_log(f)]


def test_exactly_n_requests_across_two_processes(tmp_path):
    run_dir = tmp_path / "run"
    res = run_locust(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "6", "-r", "6", "--processes", "2",
                      "--num-requests", "41", "--output-tokens", "8", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = _logs(run_dir)
    assert len(logs) == 41 and all(r["ok"] for r in logs)
    # split over the two workers (21 + 20), each worker's own log
    assert sorted(len(read_log(f)) for f in run_dir.glob("requests-*.jsonl")) == [20, 21]
    assert "41 requests completed (--num-requests): stopping the run" in res.stdout
    result = json.loads((run_dir / "vllm-result.json").read_text())
    assert result["completed"] == 41 and result["num_prompts"] == 41


def test_warm_up_requests_do_not_count(tmp_path):
    run_dir = tmp_path / "run"
    res = run_locust(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "4", "-r", "4",
                      "--emulator-ttft", "0.02", "--emulator-itl", "0.01", "--output-tokens", "10",
                      "--warmup", "1s", "--num-requests", "30", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = _logs(run_dir)
    warm = [r for r in logs if r["warmup"]]
    assert warm and len(logs) - len(warm) == 30
    s = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert s["requests"] == 30 and s["warmup_excluded"] == len(warm)
