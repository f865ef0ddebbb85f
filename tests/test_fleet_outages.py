"""Outages per target on a fleet (``--host a,b``): a dead replica is that replica's outage, not the fleet's, while
the other serves long requests; ``--stop-on-outage`` stops only a run whose every target is unreachable, and the
stop is in every output with its exit code. Judged against the replicas' own counters and the request logs'
timestamps, not the tool's own figures."""

from __future__ import annotations

import json

import pytest

from tests.helpers import ROOT, Proc, counter, run_in_process

CHAT = str(ROOT / "locustfiles/chat.py")


def _fleet_run(tmp_path, delay: str, seconds: str, tokens: str, fault, *extra: str):
    """Two emulators behind --host a,b and a run with --stop-on-outage 3s and ``fault(a, b)``; the run's result, its
    summary.json, the two servers and a's own served count (read before they stop)."""
    a, b = (Proc(["-m", "server.emulator", "--port", "0", "--ttft", delay, "--itl", delay]) for _ in range(2))
    try:
        res = run_in_process([
            "-f", CHAT, "--headless", "-u", "4", "-r", "4", "-t", seconds, "--host", f"{a.url},{b.url}",
            "--input-tokens", "32", "--output-tokens", tokens, "--retry-backoff-max", "0.5s", "--stop-on-outage", "3s",
            "--fault", fault(a, b), "--run-dir", str(tmp_path / "run"), *extra], cwd=tmp_path, timeout=150)
        try:
            a_served = counter(a.url, "vllm:request_success_total")
        except OSError:  # a killed by the plan too
            a_served = None
    finally:
        a.stop()
        b.stop()
    return res, json.loads((tmp_path / "run" / "summary.json").read_text()), (a, b), a_served


def _logs(run_dir) -> list[dict]:
    return [json.loads(line) for f in run_dir.glob("requests*.jsonl") for line in f.read_text().splitlines()]


@pytest.mark.slow
def test_a_dead_replica_beside_long_requests_is_its_outage_and_stops_no_healthy_fleet(tmp_path):
    """b killed at 1 s of 16; a serves 8 s requests (160 tokens at 50 ms), none ended before b had been down 3 s:
    the run said "server unreachable since 21.2 s" and --stop-on-outage stopped it (a fleet of the targets that had
    ended a request: b alone, as beside two real vLLMs streaming 2,000-token answers)."""
    res, data, (a, b), a_served = _fleet_run(tmp_path, "0.05", "16s", "160", lambda a, b: f"1s: kill: kill -9 {b.p.pid}",
                                             "--allow-untrustworthy")
    summary, logs = data["summary"], _logs(tmp_path / "run")
    kill = summary["faults"][0]
    assert "stopping the run" not in res.stdout + res.stderr and data["stopped"] is None, res.stdout[-3000:]
    assert res.code == data["exit_code"] == 1  # b's requests failed (no error SLO); not stopped, not invalid
    assert summary["outage_seconds"] == 0  # the fleet was never unreachable: a answered all along
    on_a = [r for r in logs if r["target"] == a.url]
    assert on_a and all(r["ok"] for r in on_a) and a_served == len(on_a)  # a's own count, exactly
    mine = [w for w in summary["outages"] if w.get("target") == b.url and w["outage"]]
    assert len(mine) == 1, summary["outages"]
    # from b's last answer (it streamed until the kill) to the run's end: its start within 1 s of the kill
    answered_b = [r["start"] + r["e2e"] for r in logs if r["target"] == b.url and r["ok"]]
    assert abs(mine[0]["start"] - kill["start"]) < 1.0, (mine[0]["start"] - kill["start"])
    assert not answered_b or max(answered_b) <= mine[0]["start"] + 0.2
    assert any(f"target {b.url}: server unreachable" in line for line in res.stdout.splitlines())
    assert "every target" not in res.stdout


@pytest.mark.slow
def test_a_fleet_whose_every_replica_is_dead_is_stopped_and_every_file_says_so(tmp_path):
    res, data, _, _ = _fleet_run(tmp_path, "0.01", "60s", "8", lambda a, b: f"2s: kill: kill -9 {a.p.pid} {b.p.pid}")
    run_dir = tmp_path / "run"
    kill = data["summary"]["faults"][0]
    assert "stopping the run (--stop-on-outage 3s)" in res.stderr
    assert res.code == data["exit_code"] == 1 and data["stopped"].startswith("server unreachable since")
    assert "(every target)" in data["stopped"]
    assert data["summary"]["features"]["stopped"]["code"] == 1
    assert "the run was stopped: server unreachable" in (run_dir / "summary.md").read_text()
    assert "the run was stopped" in (run_dir / "report.html").read_text()
    assert 'name="the run was not stopped early"' in (run_dir / "junit.xml").read_text()
    assert data["summary"]["outage_seconds"] >= 3.0
    fleet = [w for w in data["summary"]["outages"] if "target" not in w and w["outage"]]
    assert fleet and abs(fleet[0]["start"] - kill["start"]) < 1.0
