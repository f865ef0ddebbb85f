"""The emulator's /metrics in V1 and V0 naming, and its stats log line, read back by the sidecar."""

import json
import time
import urllib.request

import pytest

from server.vllm_schema import parse_log_line, parse_metrics
from tests.conftest import Proc


def get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


@pytest.mark.parametrize("naming", ["v1", "v0"])
def test_metrics_naming_maps_to_the_same_schema(emulator_factory, naming):
    emu = emulator_factory("--metrics-naming", naming, "--ttft", "0.01", "--itl", "0.002")
    prompt = {"model": "emulator/mistral-7b-v0.1", "prompt": "the same prompt " * 20, "max_tokens": 5}
    post(emu.url + "/v1/completions", prompt)
    post(emu.url + "/v1/completions", prompt)  # the second one hits the prefix cache
    text = get(emu.url + "/metrics")
    if naming == "v0":
        assert "vllm:gpu_cache_usage_perc" in text and "vllm:time_per_output_token_seconds_bucket" in text
        assert "vllm:kv_cache_usage_perc" not in text and "engine=" not in text
        assert "vllm:num_requests_swapped" in text and "vllm:prefix_cache_hits" not in text
    else:
        assert "vllm:kv_cache_usage_perc" in text and "vllm:inter_token_latency_seconds_bucket" in text
    s = parse_metrics(text)
    assert s["generation_tokens_total"] == 10 and s["histograms"]["itl"]["count"] == 8
    if naming == "v0":
        assert s["prefix_cache_hit_rate_gauge"] > 0.3
    else:
        assert s["prefix_cache_hits_total"] > 0


@pytest.mark.parametrize("naming", ["v1", "v0"])
def test_stats_log_line_is_vllms_and_the_sidecar_reads_it(tmp_path, naming):
    log = tmp_path / "emulator.log"
    with open(log, "w") as err:
        import subprocess
        import sys

        from tests.conftest import ROOT

        p = subprocess.Popen([sys.executable, "-m", "server.emulator", "--port", "0", "--metrics-naming", naming,
                              "--log-stats-interval", "0.2"], stdout=subprocess.PIPE, stderr=err, cwd=ROOT)
        try:
            url = p.stdout.readline().decode().split("listening on ", 1)[1].split()[0]
            post(url + "/v1/completions", {"model": "emulator/mistral-7b-v0.1", "prompt": "hello", "max_tokens": 3})
            side = Proc(["-m", "server.sidecar", "--log-file", str(log), "--listen", "127.0.0.1:0", "--out", ""])
            try:
                lines = []
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and len(lines) < 2:  # new stats lines every 0.2 s
                    lines = get(side.url + "/series").splitlines()
                    time.sleep(0.1)
                assert len(lines) >= 2
                sample = json.loads(lines[-1])
                assert sample["source"] == f"log-{naming}" and "kv_cache_usage" in sample and "running" in sample
            finally:
                side.stop()
        finally:
            p.terminate()
            p.wait(timeout=10)
    parsed = [parse_log_line(x) for x in log.read_text().splitlines()]
    assert sum(x is not None for x in parsed) >= 2
