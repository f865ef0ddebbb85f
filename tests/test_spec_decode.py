"""Speculative decoding: the emulator's drafter (tokens per step, vLLM's vllm:spec_decode_* counters), and a run that
reports acceptance rate and length from the sidecar's window equal to the emulator's own counters."""

from __future__ import annotations

import json
import urllib.request

import pytest

from server.emulator.engine import EngineConfig, FixedScheduleEngine
from server.sidecar.vllm_schema import parse_metrics
from vllm_load.rundir.reqlog import read_log
from tests.helpers import ROOT, run_in_process


def test_each_decode_step_yields_one_plus_its_accepted_drafts_in_one_step_time():
    engine = FixedScheduleEngine(EngineConfig(ttft=0.0, itl=0.001, spec_tokens=3, spec_acceptance=0.6, seed=3))
    chunks = [em for _ in range(40) for em in engine.generate(8, 50)]
    spec = engine.spec
    assert spec is not None
    # every request: one token from the prefill, then one chunk per decode step
    assert sum(em.tokens for em in chunks) == 40 * 50
    assert spec.drafts == len(chunks) - 40 and spec.draft_tokens == 3 * spec.drafts
    assert spec.accepted == 40 * 50 - 40 - spec.drafts  # each step: its own token plus the accepted drafts
    assert sum(spec.per_pos) == spec.accepted and spec.per_pos[0] >= spec.per_pos[1] >= spec.per_pos[2]
    assert max(em.tokens for em in chunks) == 4
    # a step's chunk comes one ITL after the last, however many tokens it carries
    one = [em.due for em in FixedScheduleEngine(EngineConfig(ttft=0.0, itl=0.001, spec_tokens=3)).generate(8, 30)]
    assert all(b - a == pytest.approx(0.001) for a, b in zip(one, one[1:]))
    # the acceptance is what was asked: p + p^2 + p^3 tokens per draft at p = 0.6 (1.176), less the steps cut short
    assert spec.accepted / spec.drafts == pytest.approx(1.176, rel=0.15)


def test_a_run_reports_the_servers_acceptance_exactly(tmp_path, emulator_factory, sidecar_factory):
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.004", "--spec-tokens", "3", "--spec-acceptance", "0.6")
    side = sidecar_factory("--vllm-url", emu.url, "--interval", "200ms", "--out", "")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "4", "-r", "4", "-t", "4s",
                          "--host", emu.url, "--sidecar-url", side.url, "--output-tokens", "40",
                          "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    with urllib.request.urlopen(emu.url + "/metrics") as resp:  # the emulator's own totals: the run was its only load
        own = parse_metrics(resp.read().decode())
    spec = json.loads((run_dir / "summary.json").read_text())["server"]["spec_decode"]
    assert spec["num_drafts"] == own["spec_drafts_total"] > 0
    assert spec["draft_tokens"] == own["spec_draft_tokens_total"] == 3 * spec["num_drafts"]
    assert spec["accepted_tokens"] == own["spec_accepted_tokens_total"]
    assert spec["acceptance_rate"] == pytest.approx(own["spec_accepted_tokens_total"] / own["spec_draft_tokens_total"] * 100)
    assert spec["acceptance_length"] == pytest.approx(1 + own["spec_accepted_tokens_total"] / own["spec_drafts_total"])
    per_pos = own["spec_accepted_per_pos_total"]
    assert spec["per_position_acceptance_rates"] == pytest.approx(
        [per_pos[str(p)] / own["spec_drafts_total"] for p in range(3)])
    result = json.loads((run_dir / "vllm-result.json").read_text())
    assert result["spec_decode_acceptance_rate"] == pytest.approx(spec["acceptance_rate"])
    assert result["spec_decode_num_drafts"] == spec["num_drafts"]
    assert "speculative decoding (server): acceptance rate" in res.stdout
    assert "id='spec-decode'" in (run_dir / "report.html").read_text()
    # the client sees the steps: chunks of up to 4 tokens, so fewer chunks than tokens
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert summary["metrics"]["itl"]["count"] < summary["output_tokens"] - summary["succeeded"]


def test_the_embedded_emulator_drafts_when_asked(tmp_path):
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "3s",
                          "--emulator-spec-tokens", "2", "--emulator-spec-acceptance", "1.0", "--output-tokens", "21",
                          "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    spec = json.loads((run_dir / "summary.json").read_text())["server"]["spec_decode"]
    # the server's series runs past the last request's end (the end waits for the sidecar's next scrape): its
    # counters hold every step of every request
    last_end = max(r["start"] + r["e2e"] for r in read_log(run_dir / "requests.jsonl"))
    # (json, not orjson: a sample may hold NaN, which json writes)
    assert max(json.loads(line)["t"] for line in (run_dir / "server.jsonl").open()) >= last_end
    # every draft accepted: 1 + 2 tokens per step, 20 decode tokens in 7 steps (the last one cut to 2)
    assert spec["acceptance_length"] == pytest.approx(1 + 13 / 7) and spec["per_position_acceptance_rates"][0] == 1.0
