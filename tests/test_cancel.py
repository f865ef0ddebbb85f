"""--cancel: requests the client gives up on mid-answer (users closing a tab), counted apart and freed by the server
(``workload/cancel.py``; the emulator counts them as vLLM does, under finished_reason="abort")."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.helpers import ROOT, run_in_process, wait_for
from vllm_load.errors import UsageError
from vllm_load.rundir.reqlog import read_log
from vllm_load.workload.cancel import CancelPlan, parse_cancel

CHAT = str(ROOT / "locustfiles" / "chat.py")


def _series(url: str, name: str, label: str = "") -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and label in line)


@pytest.mark.parametrize("native", ["1", "0"])  # the direct transport, and Locust's session (the Python reader)
def test_a_share_of_the_requests_is_given_up_on_and_the_server_frees_each(tmp_path, emulator_factory, native):
    # answers of 1 s: the server is still writing when the client gives up after 8 tokens (~80 ms)
    emu = emulator_factory("--ttft", "0.005", "--itl", "0.01")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", CHAT, "--headless", "-u", "2", "-r", "2", "-t", "60s", "--num-requests", "12",
                          "--host", emu.url, "--output-tokens", "100", "--cancel", "rate=0.25,after=8tok",
                          "--run-dir", str(run_dir)], cwd=tmp_path, env_extra={"VLLM_LOAD_NATIVE": native})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    logs = read_log(run_dir / "requests.jsonl")
    cut = [r for r in logs if r["abandoned"]]
    # exactly a quarter of what this process sent, every fourth, each cut once it carried its 8 tokens
    assert len(cut) == len(logs) // 4 and cut, (len(cut), len(logs))
    assert all(sum(r["chunk_tokens"]) == 8 and "abandoned by the client after 8 tokens" in r["error"] for r in cut)
    assert all(r["ttft"] is not None for r in cut)  # their partial timings kept
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    # neither successes nor failures: the measured requests are the others, none failed
    assert summary["abandoned_excluded"] == len(cut) and summary["requests"] == len(logs) - len(cut) >= 12
    assert summary["failed"] == 0 and f"cancelled by the client (--cancel): {len(cut)} requests" in res.stdout
    # Locust's own table: the cancelled in a row of their own, no failure anywhere (a 50 % cancel share showed as
    # 50 % failures)
    stats = res.process.environment.stats
    mine, apart = stats.get("/v1/chat/completions", "POST"), stats.get("/v1/chat/completions (cancelled)", "POST")
    assert (mine.num_requests, apart.num_requests) == (len(logs) - len(cut), len(cut))
    assert stats.total.num_failures == 0
    # the server's view: each one aborted, and nothing left running
    assert wait_for(lambda: _series(emu.url, "vllm:request_success_total", "finished_reason=\"abort\"") == len(cut),
                    timeout=10, what="the server's abort count")
    assert _series(emu.url, "vllm:num_requests_running") == 0


def test_the_cut_is_dealt_exactly_and_bad_values_are_one_line():
    plan = CancelPlan(0.1, 16)
    assert [i for i in range(30) if plan.cuts(i)] == [9, 19, 29]  # every tenth, any count
    assert sum(CancelPlan(1 / 3, 1).cuts(i) for i in range(300)) == 100
    assert parse_cancel("rate=0.1,after=16tok") == plan and parse_cancel("") is None
    for bad, said in (("rate=0,after=4tok", "rate must be a share above 0"), ("rate=1,after=4tok", "below 1"),
                      ("rate=0.1,after=0tok", "after must be a count of tokens"), ("rate=0.1", "after must be"),
                      ("every=3", "give rate=SHARE,after=Ntok")):
        with pytest.raises(UsageError, match=said):
            parse_cancel(bad)
