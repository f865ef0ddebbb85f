"""The API key (and every secret a process holds) never leaves it: not through a server that echoes it, a greenlet's
traceback, a fault command's environment or command line, nor a worker's spawn message."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys

import gevent
import pytest

from tests.helpers import ROOT, wait_for
from vllm_load import redact
from vllm_load.plugin.watch import fault_plan
from vllm_load.plugin.swarm import worker_secrets

KEY = "sk-live-ORACLE-4242"


def test_a_greenlet_that_raises_is_printed_without_the_options_secrets(monkeypatch):
    """gevent prints a failed greenlet with its arguments: ``Generator(opts=Namespace(… api_key='sk-…'))``."""
    opts = argparse.Namespace(api_key=KEY, header=[f"Authorization: Bearer {KEY}2", "X-Trace: 1"], host="h")
    worker_secrets.mask_repr(opts)
    printed = io.StringIO()
    hub = gevent.get_hub()
    monkeypatch.setattr(hub, "exception_stream", printed)

    def boom(opts: object) -> None:
        raise ValueError("usage of 10^30")

    gevent.spawn(boom, opts).join()
    text = printed.getvalue()
    assert "ValueError" in text and "boom(Namespace(" in text  # the report is there, the secrets are not
    assert KEY not in text and "api_key='***'" in text
    assert opts.api_key == KEY  # the value itself is untouched


def test_a_fault_command_gets_no_secret_of_the_run(monkeypatch):
    monkeypatch.setenv("VLLM_LOAD_API_KEY", KEY)
    monkeypatch.setenv("OPENAI_API_KEY", KEY + "x")
    monkeypatch.setenv("VLLM_LOAD_SWARM_TOKEN", "swarm-secret-1")
    ok, out = fault_plan._command("env; echo tail-marker")
    assert ok and "tail-marker" in out
    full = subprocess.run(["sh", "-c", "env"], env=worker_secrets.fault_env(), capture_output=True, text=True).stdout
    assert KEY not in full and "swarm-secret-1" not in full and "PATH=" in full


def test_a_fault_commands_endless_output_keeps_its_tail(tmp_path):
    """``exec: yes`` kept 1.4 GB in 5 s: 50 MB of output leaves the tail's 300 characters (64 KB read at most)."""
    ok, out = fault_plan._command("head -c 50000000 /dev/zero | tr '\\0' a; echo; echo the-end; exit 3")
    assert not ok and out.startswith("exit 3") and out.endswith("the-end") and len(out) < 400


def test_an_overrunning_fault_command_dies_with_its_whole_group(tmp_path, monkeypatch):
    monkeypatch.setattr(fault_plan, "COMMAND_TIMEOUT_S", 1.0)  # the overrun is the subject: its limit, made short
    pidfile = tmp_path / "child.pid"
    ok, out = fault_plan._command(f"sleep 300 & echo $! > {pidfile}; yes")
    assert not ok and "still running after" in out
    child = int(pidfile.read_text())
    wait_for(lambda: not _alive(child), timeout=10, what="the command's background child gone with its group")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_credentials_in_a_fault_command_or_header_are_masked_where_written():
    assert redact.redact_urls("30s: exec: curl --token=abc123 -H 'Authorization: Bearer sk-9' http://u:p@h/") == (
        "30s: exec: curl --token=*** -H 'Authorization: Bearer ***' http://h/")
    assert redact.redact_urls("--api-key-file /tmp/k --swarm-token-file t") == "--api-key-file /tmp/k --swarm-token-file t"
    assert worker_secrets.scrub({"fault": ["1s: exec: x --token=1"], "fault_plan": "p", "host": "h"}) == {"host": "h"}


@pytest.mark.e2e  # a Locust process's whole console (gevent's own printing included) is what it checks
def test_a_server_that_echoes_the_key_gets_it_into_no_line_and_no_file(tmp_path, emulator_factory):
    """A gateway's 500 quoting the request's ``Authorization``: the error kind, its example, the request log, the
    stats and the console carry ``***`` instead."""
    emu = emulator_factory("--api-key", KEY, "--fault", "echo:0.5", "--ttft", "0.005", "--itl", "0.002")
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT), VLLM_LOAD_API_KEY=KEY)
    res = subprocess.run([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles/chat.py"), "--headless",
                          "-u", "2", "-r", "2", "--num-requests", "30", "-t", "60s", "--host", emu.url,
                          "--output-tokens", "8", "--run-dir", str(run_dir), "--allow-untrustworthy"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert summary["failed"] > 0 and any("upstream refused the credentials" in k for k in summary["errors"]), \
        res.stdout[-3000:]
    assert KEY not in res.stdout + res.stderr
    assert "Bearer ***" in res.stdout + "".join(p.read_text() for p in run_dir.rglob("*.json*"))
    leaked = [p.name for p in run_dir.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    assert leaked == []
