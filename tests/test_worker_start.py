"""A worker's start-up is not its master's silence: Locust fires test_start in the greenlet that reads the master's
messages, so while a worker loads its tokenizer and fills its pools (off the loop, waited for there) the master's
heartbeats queue unread. Beside the full suite that took over MASTER_SILENCE_S (15 s) and both workers of a
``--processes 2`` run quit at spawn, having sent nothing (a master and two workers in the test's process)."""

from __future__ import annotations

from gevent import monkey
from locust import runners

from tests.helpers import ROOT, run_in_process
from vllm_load.plugin.requests import request_source
from vllm_load.plugin.lifecycle import worker


def test_a_start_up_longer_than_the_masters_silence_limit_keeps_its_workers(tmp_path, emulator_factory, monkeypatch):
    load = request_source.load_tokenizer

    def slow_load(name):  # each worker's tokenizer load, in its thread: the unpatched sleep holds it as CPU work would
        monkey.get_original("time", "sleep")(10.0)
        return load(name)

    monkeypatch.setattr(request_source, "load_tokenizer", slow_load)
    # the silence limit: 2 s shorter than the start-up, 8 times the master's heartbeats' interval (at 1 s a heartbeat
    # a little late during the run stopped a worker once in 9 runs alone; at 3 s, once in the fast selection's load)
    monkeypatch.setattr(worker, "MASTER_SILENCE_S", 8)
    monkeypatch.setattr(runners, "MASTER_HEARTBEAT_TIMEOUT", runners.MASTER_HEARTBEAT_TIMEOUT)  # put back after
    emu = emulator_factory("--ttft", "0.005", "--itl", "0.002")
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "--processes", "2", "-u", "2", "-r",
                          "2", "-t", "60s", "--num-requests", "6", "--host", emu.url, "--output-tokens", "4",
                          "--run-dir", str(tmp_path / "run")], tmp_path, timeout=60)
    text = res.stdout + res.stderr
    assert res.code == 0, text[-3000:]
    assert "Didn't get heartbeat from master" not in text
    assert res.summary()["summary"]["succeeded"] == 6
    assert runners.MASTER_HEARTBEAT_TIMEOUT == 8  # the limit is the run's again once the start-up ended
