"""Where each request's time went (metrics/breakdown.py): the server's own times of each request (vLLM's per-request
metrics; the emulator sends the same) joined to the client's timeline, the tails split into queue, prefill, decode
and the client's rest, SLOs on the parts; against the emulator here, against a real vLLM in
test_real_vllm_timing.py."""

from __future__ import annotations

import json
import statistics

from tests.helpers import ROOT, run_locust
from vllm_load.rundir.reqlog import read_log

CHAT = str(ROOT / "locustfiles" / "chat.py")


def _run(tmp_path, *args):
    run_dir = tmp_path / "run"
    # --allow-untrustworthy: what is checked is the server's times and their split, not the client's timekeeping
    res = run_locust(["-f", CHAT, "--headless", "-r", "16", "--allow-untrustworthy", "--run-dir", str(run_dir), *args],
                     tmp_path, timeout=180)
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    return res, read_log(run_dir / "requests.jsonl"), summary


def test_the_default_target_gives_every_request_its_server_parts(tmp_path):
    res, logs, summary = _run(tmp_path, "-u", "4", "-t", "5s", "--output-tokens", "16")
    assert res.returncode == 0, res.stdout[-2000:]
    ok = [r for r in logs if r["ok"]]
    assert ok and all(r["server_queue"] is not None and r["server_prefill"] is not None for r in ok)
    # the server's TTFT is inside the client's: what is left is the network, the API server (here: loopback)
    assert all(r["client_overhead"] >= -0.0005 and r["server_ttft"] <= r["ttft"] + 0.0005 for r in ok)
    # the decode the server says took place between its first and last token is what the client saw between them
    gaps = [abs((r["chunk_offsets"][-1] - r["chunk_offsets"][0]) - r["server_decode"]) for r in ok]
    assert statistics.median(gaps) <= 0.001, statistics.median(gaps)
    assert summary["timing"]["requests"] == len(ok)
    assert "where TTFT p99" in res.stdout


def test_a_small_server_s_tail_is_its_queue_and_an_slo_on_the_queue_fails(tmp_path):
    res, _logs, summary = _run(tmp_path, "-u", "16", "-t", "6s", "--emulator-profile", "cpu-tiny",
                               "--emulator-max-num-seqs", "2", "--output-tokens", "16", "--slo",
                               "server_queue.p99<=10ms")
    split = summary["timing"]["tails"]["ttft"]["p99"]["split"]
    assert split["server_queue"] > 0.5 * sum(split.values()), split  # 16 users, 2 sequences at a time: a queue
    assert res.returncode == 3 and "FAIL  server_queue.p99<=10ms" in res.stdout, res.stdout[-2000:]


def test_long_prompts_tail_is_the_prefill(tmp_path):
    res, _logs, summary = _run(tmp_path, "-u", "1", "-t", "6s", "--emulator-profile", "cpu-tiny", "--input-tokens",
                               "3000", "--output-tokens", "4", "--slo", "server_prefill.p50>=1ms")
    split = summary["timing"]["tails"]["ttft"]["p99"]["split"]
    assert split["server_prefill"] > split["server_queue"] and split["server_prefill"] > split["client_overhead"], split
    assert res.returncode == 0, res.stdout[-2000:]
