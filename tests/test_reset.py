"""Locust's --reset-stats and the web UI's Reset reset the LLM metrics too, so the two tables keep agreeing."""

from __future__ import annotations

import pytest

import csv
import json
import os
import subprocess
import sys
import urllib.request

from tests.helpers import ROOT, free_port, run_in_process, wait_for
from tests.test_process_faults import logs

CHAT = str(ROOT / "locustfiles/chat.py")


@pytest.mark.slow  # a quiet test of seconds: the full suite's (the fast selection's quiet tail is serial)
@pytest.mark.quiet_cores  # requests before the spawn's end (the reset): beside a busy suite 3 in 11 s, all after it
def test_reset_stats_resets_the_llm_metrics_in_every_worker_and_the_master(tmp_path, emulator_factory):
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.005")
    run_dir = tmp_path / "run"
    # 4 users at 0.4/s over 2 workers: each worker's first user runs 5 s before its second one spawns (the reset;
    # at 1/s a busy host once finished no request before it, and at 0.5/s once beside the full suite)
    res = run_in_process(["-f", CHAT, "--headless", "--processes", "2", "-u", "4", "-r", "0.4", "-t", "11s", "--host",
                          emu.url,
                          "--output-tokens", "8", "--reset-stats", "--csv", str(tmp_path / "locust"),
                          "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    with open(tmp_path / "locust_stats.csv") as fh:
        agg = [r for r in csv.DictReader(fh) if r["Name"] == "Aggregated"][0]
    # the request log keeps every request; both tables count only those after the reset, the same ones
    assert summary["requests"] == int(agg["Request Count"]) < len(logs(run_dir)), (summary["requests"], agg["Request Count"])
    assert summary["metrics"]["ttft"]["count"] == summary["succeeded"] == summary["requests"]


def _stats(base):
    with urllib.request.urlopen(base + "/stats/requests", timeout=5) as r:
        body = json.loads(r.read())
    llm = [t for t in body.get("extended_stats", []) if t["key"] == "llm"]
    rows = {row["metric"]: row for row in (llm[0]["data"] if llm else [])}
    locust_total = next((s["num_requests"] for s in body["stats"] if s["name"] == "Aggregated"), 0)
    ours = int(rows["Requests ok / failed"]["count"]) if "Requests ok / failed" in rows else None
    return locust_total, ours


@pytest.mark.e2e
def test_the_web_uis_reset_button_resets_both_tables_alike(tmp_path, emulator_factory):
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.005")
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "locust", "-f", CHAT, "--host", emu.url, "--processes", "2",
                             "--master-bind-port", str(free_port()), "--web-host", "127.0.0.1", "--web-port", str(port),
                             "--autostart", "-u", "4", "-r", "4",
                             "--output-tokens", "8", "--run-dir", str(tmp_path / "run")],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"

    def counts():
        try:
            return _stats(base)
        except OSError:
            return None

    try:
        # the same worker reports feed both tables (Locust's part of the answer may be cached a moment)
        before = wait_for(lambda: (c := counts()) and c[1] is not None and c[0] >= 400 and c[0] == c[1] and c,
                          timeout=60, what="400 requests, alike in both tables")
        with urllib.request.urlopen(urllib.request.Request(base + "/stats/reset", data=b""), timeout=5):
            pass
        # after the next worker reports both count again from zero, together
        after = wait_for(lambda: (c := counts()) and c[0] > 0 and c[0] == c[1] and c, timeout=30,
                         what="both tables counting again, alike")
        logged = len(logs(tmp_path / "run"))  # every request, reset or not
        # what both tables count now left out at least the `before` requests finished ahead of the reset; a
        # table that kept counting would hold all but the last report's (< 3 s, ~250 requests here)
        assert after[1] <= logged - before[1], (before, after, logged)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
