"""Reasoning models: TTFT stamps the first reasoning token, TTFO the answer's first, and the tokens spent
thinking are counted exactly, against the embedded emulator acting as a reasoning model."""

from __future__ import annotations

import json

import pytest

from tests.helpers import ROOT, run_in_process
from vllm_load.rundir.reqlog import read_log

TTFT, ITL, THINK, OUT = 0.05, 0.01, 32, 48


def test_a_reasoning_model_reports_ttfo_after_its_thinking(tmp_path):
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "4s",
                          "--emulator-ttft", str(TTFT), "--emulator-itl", str(ITL), "--emulator-reasoning-tokens",
                          str(THINK), "--input-tokens", "64", "--output-tokens", str(OUT), "--run-dir", str(run_dir),
                          "--slo", "ttfo.p99<=2s"], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = [r for f in run_dir.glob("requests*.jsonl") for r in read_log(f)]
    assert len(logs) >= 4 and all(r["ok"] for r in logs)
    for r in logs:
        # the thinking is part of the output (max_tokens bounds both), counted from the server's own details
        assert r["reasoning_tokens"] == THINK and r["reasoning_source"] == "usage" and r["output_tokens"] == OUT
        # TTFO is the answer's first chunk (index THINK, one token a chunk) as it landed: exact, whatever the host's
        # load (a request's own gap from TTFT is not: a busy CI host landed the answer 5.7 ms late, and with two busy
        # loops beside the suite the first reasoning token came 4 ms late; the median below is timed)
        assert r["chunk_tokens"][:THINK + 1] == [1] * (THINK + 1)
        assert r["ttfo"] == pytest.approx(r["chunk_offsets"][THINK], abs=1e-6)
    out = json.loads((run_dir / "summary.json").read_text())
    s = out["summary"]
    assert s["reasoning_tokens"] == THINK * len(logs) and s["reasoning_requests"] == len(logs)
    m = s["metrics"]
    # the medians' distance is the thinking's 32 gaps, within one gap: the index of each request's answer is checked
    # exactly above; this is the emulator's schedule as timed (a busy host moved it 5.5-5.7 ms, past half a gap)
    assert m["ttfo"]["p50"] - m["ttft"]["p50"] == pytest.approx(THINK * ITL, abs=ITL)
    assert m["reasoning_tokens"]["min"] == m["reasoning_tokens"]["max"] == THINK
    # the gaps within each phase: 31 while thinking, 15 in the answer, per request, each ~ITL
    assert m["itl_reasoning"]["count"] == (THINK - 1) * len(logs) and m["itl_answer"]["count"] == (OUT - THINK - 1) * len(logs)
    assert m["itl_reasoning"]["p50"] == pytest.approx(ITL, abs=0.002) and m["itl_answer"]["p50"] == pytest.approx(ITL, abs=0.002)
    assert "TTFO (first answer token) (ms)" in res.stdout and f"reasoning: {THINK * len(logs)} of the output" in res.stdout
    (check,) = out["slo"]
    assert check["slo"] == "ttfo.p99<=2s" and check["passed"] and check["value"] == pytest.approx(m["ttfo"]["p99"])


def test_a_model_that_does_not_reason_shows_no_reasoning_rows(tmp_path):
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "1", "-r", "1", "-t", "2s",
                          "--output-tokens", "8", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    logs = [r for f in run_dir.glob("requests*.jsonl") for r in read_log(f)]
    assert logs and all(r["ttfo"] == r["ttft"] and r["reasoning_tokens"] is None for r in logs)
    assert "TTFO" not in res.stdout and "reasoning:" not in res.stdout and "while reasoning" not in res.stdout


def test_chunks_read_together_at_the_answers_start_split_the_phases_by_the_thinkings_tokens():
    """A late read gives several chunks one offset; the answer's first is picked by the thinking's token count."""
    from vllm_load.client.record import RequestRecord
    from vllm_load.metrics.fold import _phase_gaps

    offsets = [0.0, 0.01, 0.02, 0.03, 0.03, 0.03, 0.04, 0.05]  # chunks 3, 4 and 5 landed in one read
    rec = RequestRecord(api="chat", start=0.0, e2e=0.06, ok=True, chunk_offsets=offsets, chunk_tokens=[1] * 8,
                        ttft=0.0, ttfo=0.03, reasoning_tokens=5, output_tokens=8)
    thinking, answering = _phase_gaps([rec])
    assert len(thinking) == 4 and len(answering) == 2  # chunks 0-4 think, 5-7 answer; the crossing gap in neither
    assert thinking == pytest.approx([0.01, 0.01, 0.01, 0.0]) and answering == pytest.approx([0.01, 0.01])
