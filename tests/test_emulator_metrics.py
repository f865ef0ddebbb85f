"""The emulator's /metrics in V1 and V0 naming, and its stats log line, read back by the sidecar."""

import json
import urllib.request

import pytest

from server.sidecar.vllm_schema import parse_log_line, parse_metrics
from tests.helpers import wait_for


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
def test_stats_log_line_is_vllms_and_the_sidecar_reads_it(tmp_path, naming, emulator_process_factory,
                                                          sidecar_factory):
    log = tmp_path / "emulator.log"
    with open(log, "w") as err:  # the lines the emulator process writes on its stderr, as vLLM's own
        emu = emulator_process_factory("--metrics-naming", naming, "--log-stats-interval", "0.2", stderr=err)
        post(emu.url + "/v1/completions", {"model": "emulator/mistral-7b-v0.1", "prompt": "hello", "max_tokens": 3})
        side = sidecar_factory("--log-file", str(log), "--out", "")

        def two_samples() -> list[str] | None:
            lines = get(side.url + "/series").splitlines()
            return lines if len(lines) >= 2 else None

        lines = wait_for(two_samples, 20, "two samples from the emulator's stats lines (one every 0.2 s)")
        sample = json.loads(lines[-1])
        assert sample["source"] == f"log-{naming}" and "kv_cache_usage" in sample and "running" in sample
        emu.stop()
    parsed = [parse_log_line(x) for x in log.read_text().splitlines()]
    assert sum(x is not None for x in parsed) >= 2


def test_the_offload_tier_continues_a_prefix_from_the_first_gpu_miss_and_forgets_by_lru():
    """The emulator's KV offloading model (server/emulator/prefix_cache.py): a chain is the GPU's up to its first miss,
    then the offload tier's while it holds the next blocks (loaded back into the GPU), then computed; every computed
    block is written through; each tier forgets the least recently used first."""
    from server.emulator.prefix_cache import Hits, PrefixCache

    def blocks(*ids: int) -> list[int]:
        return [t for i in ids for t in [i] * 4]  # a block of 4 tokens per id

    c = PrefixCache(block_size=4, capacity_blocks=3, offload_blocks=7)
    assert c.query(blocks(1, 2, 3)) == Hits(0, 0)  # computed: on the GPU and written through
    assert c.query(blocks(1, 2, 3)) == Hits(12, 0)
    assert c.query(blocks(7, 8, 9)) == Hits(0, 0)  # the GPU's 3 blocks turned over; the tier holds all 6 (of 7)
    assert c.query(blocks(1, 2, 3, 4)) == Hits(0, 12)  # loaded back, the 4th computed
    assert c.query(blocks(7, 8)) == Hits(0, 8)
    c.query(blocks(20, 21, 22, 23, 24))  # 5 new blocks: the tier's 5 least recently used go (1-4 and 9)
    assert c.query(blocks(1, 2)).total == 0
    off = PrefixCache(block_size=4, capacity_blocks=3)  # no tier: vLLM without a connector
    off.query(blocks(1, 2, 3))
    off.query(blocks(7, 8, 9))
    assert off.query(blocks(1, 2, 3)) == Hits(0, 0) and not off.offloaded
