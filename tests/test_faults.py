"""Fault suite: every fault is a failure with a clear reason, never lost, counted the same everywhere."""

import csv
import json

from tests.helpers import ROOT, run_locust
from vllm_load.rundir.reqlog import read_log

FAULTS = ["500:0.08", "503:0.04", "429:0.04", "drop:0.08", "malformed:0.06", "error:0.06", "stall:0.04"]
REASONS = {"500": "HTTP 500: injected fault", "503": "HTTP 503: injected", "429": "HTTP 429: injected", "drop": "connection closed mid-stream after",
           "malformed": "malformed SSE", "error": "error in stream: injected fault", "stall": "timeout"}


def test_faults_are_counted_once_everywhere_across_workers(tmp_path, emulator_factory):
    args = ["--ttft", "0.01", "--itl", "0.002", "--stall-seconds", "3", "--seed", "1"]
    for f in FAULTS:
        args += ["--fault", f]
    emu = emulator_factory(*args)
    run_dir = tmp_path / "run"
    # ended by its count: 6 s on a busy host once sent too few to show every fault
    res = run_locust(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "8", "-r", "8", "-t", "180s",
                      "--num-requests", "60", "--processes", "2", "--host", emu.url, "--output-tokens", "20", "--request-timeout", "1",
                      "--csv", str(tmp_path / "locust"), "--run-dir", str(run_dir)], cwd=tmp_path, timeout=180)
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]  # failures, no SLO: exit code 1
    logs = []
    for f in run_dir.glob("requests-*.jsonl"):
        logs += read_log(f)
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    with open(tmp_path / "locust_stats.csv") as fh:
        agg = [r for r in csv.DictReader(fh) if r["Name"] == "Aggregated"][0]
    failed_logs = [r for r in logs if not r["ok"]]
    # sent = succeeded + failed, equal in the per-request log, Locust's stats and the report
    assert summary["requests"] == len(logs) == int(agg["Request Count"]) == 60
    assert summary["failed"] == len(failed_logs) == int(agg["Failure Count"]) > 0
    assert summary["succeeded"] + summary["failed"] == summary["requests"]
    # every kind of fault shows up with its own clear reason
    reasons = [r["error"] for r in failed_logs]
    for kind, needle in REASONS.items():
        assert any(needle in e for e in reasons), (kind, sorted(set(reasons)))
    # a failure is never also counted as a success
    assert all(r["error"] for r in failed_logs) and not any(r["error"] for r in logs if r["ok"])
    assert sum(summary["errors"].values()) == summary["failed"]


def test_the_api_key_never_reaches_logs_run_dirs_or_reports(tmp_path, emulator_factory):
    secret = "sk-vllm-load-test-4b1d2c9e7f"
    emu = emulator_factory("--api-key", secret, "--ttft", "0.01", "--itl", "0.002")
    run_dir = tmp_path / "run"
    res = run_locust(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "3s",
                      "--host", emu.url, "--api-key", secret, "--output-tokens", "8", "--loglevel", "DEBUG",
                      "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert read_log(run_dir / "requests.jsonl")  # the key worked: requests went through
    assert secret not in res.stdout and secret not in res.stderr
    for f in run_dir.rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f
    assert json.loads((run_dir / "config.json").read_text())["options"]["api_key"] == "***"


def test_a_wrong_api_key_is_refused_before_the_run(tmp_path, emulator_factory):
    emu = emulator_factory("--api-key", "right-key")
    res = run_locust(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "1", "-t", "2s", "--host", emu.url,
                      "--api-key", "wrong-key", "--run-dir", str(tmp_path / "run")], cwd=tmp_path)
    assert res.returncode == 2 and "check --api-key" in res.stderr and "wrong-key" not in res.stderr
