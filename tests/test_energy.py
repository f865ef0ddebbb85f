"""GPU telemetry and energy (--dcgm-url): the emulator's DCGM-shaped power model, energy over the run's window
from the exporter's energy counter (or the power's integral), per output token and per request, and the SLO."""

from __future__ import annotations

import json
import urllib.request

import pytest

from server.emulator.dcgm import PowerModel
from tests.helpers import ROOT, run_in_process
from vllm_load.metrics.fleet.energy import energy_summary
from vllm_load.plugin.sources.dcgm_source import parse


def test_the_power_model_integrates_exactly_and_speaks_dcgm():
    m = PowerModel(idle_w=50.0, per_seq_w=10.0, last=0.0)
    m.advance(2, now=1.0)  # 1 s idle
    m.advance(0, now=3.0)  # 2 s at 2 sequences: 70 W
    assert m.energy_j == pytest.approx(50.0 + 140.0)
    gpus = parse(m.exposition(0).decode())
    (gpu, fields), = gpus.items()
    assert gpu == "GPU-emulator-0" and fields["power_w"] == 50.0 and fields["energy_mj"] >= 190_000.0
    assert set(fields) == {"power_w", "energy_mj", "util", "fb_mib", "sm_mhz"}


def test_energy_over_a_window_from_the_counter_or_the_power():
    samples = [{"t": t, "gpus": {"g0": {"power_w": 100.0, "energy_mj": 100_000.0 * t},
                                 "g1": {"power_w": 300.0, "energy_mj": 300_000.0 * t}}} for t in range(0, 11)]
    e = energy_summary(samples, 2.5, 7.5, output_tokens=1000, requests=10)
    assert e["energy_j"] == pytest.approx(400.0 * 5) and e["average_power_w"] == pytest.approx(400.0)
    assert e["energy_per_output_token_j"] == pytest.approx(2.0) and e["output_tokens_per_joule"] == pytest.approx(0.5)
    assert e["gpus"] == 2 and e["source"] == "energy counter"
    power_only = [{"t": s["t"], "gpus": {"g0": {"power_w": 100.0 + 10 * s["t"]}}} for s in samples]
    p = energy_summary(power_only, 0.0, 10.0, output_tokens=0, requests=0)
    assert p["energy_j"] == pytest.approx(1500.0) and p["source"] == "power samples"
    assert p["energy_per_output_token_j"] is None
    assert energy_summary([], 0.0, 1.0, 1, 1) is None


@pytest.mark.slow  # a quiet test of seconds: the full suite's (the fast selection's quiet tail is serial)
@pytest.mark.quiet_cores  # the window's edges lie between 1 s reads: a starved start stretched them (9 % off)
def test_a_run_reports_the_power_models_energy_per_token(tmp_path, emulator_factory):
    emu = emulator_factory("--ttft", "0.02", "--itl", "0.005", "--dcgm", "--dcgm-idle-watts", "0",
                           "--dcgm-watts-per-seq", "10")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "3", "-r", "3", "-t", "4s",
                          "--host", emu.url, "--dcgm-url", emu.url + "/dcgm/metrics", "--output-tokens", "32",
                          "--slo", "energy_per_token<=100J", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    with urllib.request.urlopen(emu.url + "/dcgm/metrics") as resp:  # no idle draw: every joule is the run's
        total_j = next(iter(parse(resp.read().decode()).values()))["energy_mj"] / 1000.0
    result = json.loads((run_dir / "summary.json").read_text())
    s = result["summary"]
    assert s["energy"]["energy_j"] == pytest.approx(total_j, rel=0.02)
    assert s["energy"]["energy_per_output_token_j"] == pytest.approx(total_j / s["output_tokens"], rel=0.02)
    assert result["slo"][0]["passed"] and "J" in result["slo"][0]["detail"]
    assert "energy (DCGM, 1 GPU, from the energy counter)" in res.stdout
    assert (run_dir / "dcgm.jsonl").exists()
    assert json.loads((run_dir / "vllm-result.json").read_text())["energy"]["gpus"] == 1


def test_the_embedded_emulator_serves_its_telemetry_when_asked(tmp_path):
    run_dir = tmp_path / "run"
    # ended by its count: a 3 s run beside a busy suite once measured nothing
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "60s",
                          "--num-requests", "8", "--emulator-dcgm", "--output-tokens", "8", "--run-dir", str(run_dir)],
                         cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    e = json.loads((run_dir / "summary.json").read_text())["summary"]["energy"]
    assert e["average_power_w"] >= 60.0 and e["energy_per_request_j"] > 0  # idle 60 W, 4 W a sequence


def test_the_gpus_can_come_through_a_prometheus_that_scrapes_dcgm(tmp_path, emulator_factory):
    """--prometheus-url with --dcgm-selector: a Prometheus-compatible query_range endpoint served here holds two GPUs'
    DCGM series (100 W each, the energy counter rising with it); the run's energy is 200 W over its measured window."""
    from tests.helpers import FakePrometheus

    def answer(query, start, end):
        if not query.startswith("DCGM_FI_DEV_"):
            return []
        ts = [start + i for i in range(int(end - start) + 1)]
        value = {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": lambda t: 100_000.0 * t,  # mJ: 100 W since t=0
                 "DCGM_FI_DEV_POWER_USAGE": lambda t: 100.0}.get(query.split("{")[0], lambda t: 1.0)
        return [{"metric": {"UUID": gpu, "Hostname": "node-1"}, "values": [[t, str(value(t))] for t in ts]}
                for gpu in ("GPU-a", "GPU-b")]

    with FakePrometheus(answer) as prom:
        emu = emulator_factory("--ttft", "0.02", "--itl", "0.005")
        run_dir = tmp_path / "run"
        res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "2", "-t", "3s",
                              "--host", emu.url, "--output-tokens", "8", "--prometheus-url", prom.url,
                              "--dcgm-selector", '{Hostname="node-1"}', "--run-dir", str(run_dir)], cwd=tmp_path)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    seen = prom.seen
    assert 'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{Hostname="node-1"}' in seen
    s = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert s["energy"]["gpus"] == 2 and s["energy"]["source"] == "energy counter"
    assert s["energy"]["energy_j"] == pytest.approx(200.0 * s["duration_s"], rel=0.001)
    assert s["energy"]["energy_per_output_token_j"] == pytest.approx(s["energy"]["energy_j"] / s["output_tokens"])
    assert len((run_dir / "dcgm.jsonl").read_text().splitlines()) >= 3
    assert "energy (DCGM, 2 GPUs" in res.stdout
