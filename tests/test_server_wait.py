"""Start before the server is ready: wait on the command line, in the sidecar, and recover in the web UI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import pytest

from tests.helpers import ROOT, Proc, free_port, run_in_process, wait_for
from vllm_load.errors import UsageError
from vllm_load.workload.lengths import parse_duration

CHAT = str(ROOT / "locustfiles/chat.py")


def test_durations():
    assert [parse_duration(x, "--w") for x in ("15m", "30s", "1h", "500ms", "7", "0")] == [900, 30, 3600, 0.5, 7, 0]
    with pytest.raises(UsageError, match="--w 'soon' is not a duration"):
        parse_duration("soon", "--w")


@pytest.mark.slow  # waits for a server that starts late by design (10 s): the full suite's
def test_a_run_waits_for_a_server_that_comes_up_late_and_then_runs_normally(tmp_path):
    port = free_port()
    late: list[Proc] = []
    # the server under test starts 5 s after the load test (as vLLM does after loading its model)
    timer = threading.Timer(5.0, lambda: late.append(Proc(["-m", "server.emulator", "--port", str(port),
                                                           "--ttft", "0.01", "--itl", "0.002"])))
    timer.start()
    try:
        t0 = time.monotonic()
        res = run_in_process(["-f", CHAT, "--headless", "-u", "2", "-r", "2", "-t", "3s", "--host", f"http://127.0.0.1:{port}",
                              "--wait-for-server", "30s", "--output-tokens", "8", "--run-dir", str(tmp_path / "run")],
                             cwd=tmp_path)
        took = time.monotonic() - t0
    finally:
        timer.join()
        for p in late:
            p.stop()
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    waiting = [line for line in res.stdout.splitlines() if line.startswith(f"vllm-load: waiting for http://127.0.0.1:{port}")]
    assert waiting and "not reachable: connection refused" in waiting[0] and waiting[0].endswith("/ 30 s")
    assert f"vllm-load: http://127.0.0.1:{port} is ready after" in res.stdout
    assert took >= 5 + 3
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())["summary"]
    assert summary["succeeded"] > 0 and summary["failed"] == 0


def test_no_server_within_the_wait_is_exit_2_with_the_reason(tmp_path):
    port = free_port()
    t0 = time.monotonic()
    res = run_in_process(["-f", CHAT, "--headless", "-u", "1", "-t", "2s", "--host", f"http://127.0.0.1:{port}",
                          "--wait-for-server", "3s", "--run-dir", str(tmp_path / "run")], cwd=tmp_path)
    took = time.monotonic() - t0
    assert res.returncode == 2
    errors = [line for line in res.stderr.splitlines() if line.startswith("vllm-load: error:")]
    assert errors == [f"vllm-load: error: http://127.0.0.1:{port} was not ready after 3 s (not reachable: connection "
                      "refused): start the server, or raise --wait-for-server"], res.stderr[-2000:]
    assert took < 30  # it gave up after the 3 s asked (plus Locust's start-up), not later


def test_the_sidecar_waits_too_and_gives_up_with_the_reason():
    port = free_port()
    res = subprocess.run([sys.executable, "-m", "server.sidecar", "--vllm-url", f"http://127.0.0.1:{port}",
                          "--listen", "127.0.0.1:0", "--out", "", "--wait-for-server", "2s"],
                         cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert f"sidecar: waiting for http://127.0.0.1:{port} (not reachable: connection refused)" in res.stderr
    assert "sidecar: error: " in res.stderr and "was not ready after 2 s" in res.stderr


def _get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def _llm_rows(base):
    body = json.loads(_get(base + "/stats/requests"))
    llm = [t for t in body.get("extended_stats", []) if t["key"] == "llm"]
    return llm[0]["data"] if llm else []


@pytest.mark.e2e
def test_the_web_ui_shows_a_failed_target_check_and_runs_once_the_host_is_fixed(tmp_path, emulator_factory):
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002")
    dead = f"http://127.0.0.1:{free_port()}"
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "locust", "-f", CHAT, "--host", dead, "--web-host", "127.0.0.1",
                             "--web-port", str(port), "--output-tokens", "8", "--run-dir", str(tmp_path / "run")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"

    def rows_when(cond):
        def probe():
            try:
                rows = _llm_rows(base)
            except OSError:
                return None  # the UI is not up yet
            return rows if cond(rows) else None
        return probe

    def swarm(host):
        data = urllib.parse.urlencode({"user_count": 2, "spawn_rate": 2, "host": host}).encode()
        with urllib.request.urlopen(urllib.request.Request(base + "/swarm", data=data), timeout=10) as r:
            return json.loads(r.read())

    try:
        # the check at start-up failed: the UI is up and says why, instead of the process exiting 2
        rows = wait_for(rows_when(lambda r: r and r[0]["metric"] == "ERROR"), timeout=60, what="the error row")
        assert f"cannot reach {dead}/v1/models" in rows[0]["mean"]
        assert proc.poll() is None
        # started against the dead host again: the error stays, the process stays
        swarm(dead)
        wait_for(lambda: json.loads(_get(base + "/stats/requests"))["state"] in ("stopped", "ready"), timeout=30,
                 what="the failed start to stop")
        assert proc.poll() is None and _llm_rows(base)[0]["metric"] == "ERROR"
        # fixed in the UI: the run goes ahead and measures
        swarm(emu.url)
        rows = wait_for(rows_when(lambda r: any(x["metric"] == "Requests ok / failed" and int(x["count"]) >= 2
                                                for x in r)), timeout=60, what="requests measured after the fix")
        assert rows[0]["metric"] != "ERROR"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
