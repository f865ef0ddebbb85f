"""--num-requests: a run ends after exactly N requests finished across all load processes, warm-up aside."""

from __future__ import annotations

import json

from tests.helpers import ROOT, run_in_process
from vllm_load.rundir.reqlog import read_log


def _logs(run_dir):
    return [r for f in sorted(run_dir.glob("requests*.jsonl")) for r in read_log(f)]


def test_exactly_n_requests_across_two_processes(tmp_path):
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "6", "-r", "6", "--processes", "2",
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
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "4", "-r", "4",
                          "--emulator-ttft", "0.02", "--emulator-itl", "0.01", "--output-tokens", "10",
                          "--warmup", "1s", "--num-requests", "30", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = _logs(run_dir)
    warm = [r for r in logs if r["warmup"]]
    assert warm and len(logs) - len(warm) == 30
    s = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert s["requests"] == 30 and s["warmup_excluded"] == len(warm)


def test_each_sweep_step_ends_after_exactly_n_requests(tmp_path):
    """--num-requests in a sweep: every step ends once its own N requests finished across both processes (the
    steps take no --step-duration: the default 60 s would fail the deadline), and each step's vLLM JSON says N."""
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/sweep.py"), "--headless", "--processes", "2", "--sweep", "2,6",
                          "--num-requests", "15", "--output-tokens", "8", "--run-dir", str(run_dir)], cwd=tmp_path,
                         timeout=50)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = _logs(run_dir)
    assert sorted({r["step"] for r in logs}) == [0, 1]
    assert [sum(r["step"] == k and not r["warmup"] for r in logs) for k in (0, 1)] == [15, 15]
    for k in (0, 1):
        assert f"sweep step {k}: 15 requests completed (--num-requests)" in res.stdout
    steps = sorted((run_dir / "steps").iterdir())
    assert [d.name for d in steps] == ["00-users-2", "01-users-6"]
    for d in steps:
        assert json.loads((d / "llm_stats.json").read_text())["summary"]["requests"] == 15
        assert json.loads((d / "vllm-result.json").read_text())["completed"] == 15
