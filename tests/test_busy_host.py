"""A swarm on a busy host: start-up work must not hold a worker's loop (Locust's heartbeats run on it), a worker
Locust marks missing is named in the verdict, and a run's rate counts from its first request.

Measured before the fix (benchmarks/busy_spawn.py, 10 CPU hogs on 2 cores): both workers of `--processes 2`
loaded their tokenizer on the loop at spawn (transformers' import and a SentencePiece conversion, ~1 s of CPU,
5-6 s on a starved host), missed their heartbeats ~4 s after it, and Locust stopped the test; the run said only
"no request completed". Here the slow start-up is made deterministic: the tokenizer load sleeps 6 s."""

from __future__ import annotations

import json

import pytest

from tests.helpers import ROOT, run_locust
from vllm_load.report.results import trust_check
from vllm_load.rundir.reqlog import read_log

SLOW_START = '''
from gevent import monkey
from vllm_load.plugin.requests import request_source
from vllm_load.locustfiles.chat import ChatUser  # noqa: F401

_load = request_source.load_tokenizer


def slow_load(name):
    # as long as a tokenizer load took a starved worker, over Locust's 3 s heartbeat limit; the unpatched sleep
    # holds the calling thread as CPU work would (Locust's gevent patches time.sleep into a yield)
    monkey.get_original("time", "sleep")(6.0)
    return _load(name)


request_source.load_tokenizer = slow_load
'''

HELD_LOOP = '''
from gevent import monkey
from locust import constant, task
from vllm_load import LLMUser

HELD = []


class Holder(LLMUser):
    wait_time = constant(0.05)

    @task
    def talk(self):
        self.llm.chat([{"role": "user", "content": self.llm.text(tokens=16)}], max_tokens=4)
        if self.environment.runner.worker_index == 0 and not HELD:
            HELD.append(True)
            # a blocking call in a task (the unpatched sleep): this worker's loop and heartbeats stop for 6 s
            monkey.get_original("time", "sleep")(6.0)
'''


def _run(tmp_path, source: str, seconds: int, host: str, judge_trust: bool = False):
    lf = tmp_path / "lf.py"
    lf.write_text(source)
    run_dir = tmp_path / "run"
    out = run_locust(["-f", str(lf), "--headless", "--processes", "2", "-u", "4", "-r", "4", "-t", f"{seconds}s",
                      "--host", host, "--output-tokens", "8", "--input-tokens", "32", "--run-dir", str(run_dir)],
                     ROOT, timeout=120, judge_trust=judge_trust)
    return out, run_dir


def test_a_slow_start_up_keeps_the_heartbeats_and_the_rate_counts_from_the_first_request(tmp_path, emulator_factory):
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002")
    out, run_dir = _run(tmp_path, SLOW_START, 20, emu.url)  # 6 s of loading, then load (12 s once sent none)
    text = out.stdout + out.stderr
    # its whole log on a failure (beside the full suite it once ended 4, both workers quitting: its tail, Locust's
    # tables, did not say why)
    assert out.returncode == 0, "\n".join(ln for ln in text.splitlines() if "|" not in ln)[-6000:]
    assert "failed to send heartbeat" not in text
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert summary["workers_missing"] == {}
    assert summary["succeeded"] > 0
    stats = json.loads((run_dir / "llm_stats.json").read_text())
    starts = [r["start"] for f in run_dir.glob("requests-*.jsonl") for r in read_log(f)]
    assert min(starts) - stats["start"] > 6.0  # the workers sent nothing while they loaded
    # the rate's clock starts at the first request, not at Locust's spawn 6 s before it
    assert abs(summary["duration_s"] - (stats["end"] - min(starts))) < 0.01
    assert abs(summary["request_rate"] - summary["succeeded"] / summary["duration_s"]) < 1e-6


@pytest.mark.quiet_cores
def test_a_worker_whose_loop_is_held_is_named_and_the_run_is_untrustworthy(tmp_path, emulator_factory):
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002")
    out, run_dir = _run(tmp_path, HELD_LOOP, 14, emu.url, judge_trust=True)
    text = out.stdout + out.stderr
    assert out.returncode == 5, text[-3000:]
    result = json.loads((run_dir / "summary.json").read_text())
    missing = result["summary"]["workers_missing"]
    assert len(missing) == 1, missing  # the held worker; the other kept its heartbeats and the run went on
    (worker, at), = missing.items()
    assert 3.0 < at < 14.0
    assert f"{worker} ({at:.1f} s into the run)" in result["trust"]["detail"]
    assert "Locust stopped the test" not in result["trust"]["detail"]
    assert "Locust marked them missing" in text


def test_the_trust_check_names_silent_workers_and_says_when_every_one_was():
    base = {"client": {}, "workers": ["w1", "w2"], "workers_lost": []}
    one = trust_check({**base, "workers_missing": {"w2": 4.2}})
    assert not one.passed and "w2 (4.2 s into the run)" in one.detail and "stopped the test" not in one.detail
    assert "Cause: silent" in one.detail
    both = trust_check({**base, "workers_missing": {"w1": 4.0, "w2": 4.1}})
    assert "with every worker missing Locust stopped the test" in both.detail
    assert trust_check({**base, "workers_missing": {"w1": 4.0}}, allow=True).passed
    # a worker that was lost is said once, as lost
    lost = trust_check({**base, "workers_lost": ["w1"], "workers_missing": {"w1": 4.0}})
    assert "Locust marked them missing" not in lost.detail and "lost mid-run" in lost.detail
    assert trust_check({**base, "workers_missing": {}}).passed
