"""locustfiles/reuse.py: a prefix, DISTANCE tokens of other work, the prefix again; the server's own cached tokens
for the return draw the curve of its cache's memory, which falls to 0 at the distance its capacity predicts."""

from __future__ import annotations

import json
import urllib.request

from tests.helpers import ROOT, run_in_process
from vllm_load.metrics.shape.reuse import curve


def _curve(tmp_path, emulator_factory, flags: list[str], distances: str, requests: int):
    """reuse.py's two cycles of ``distances`` (256-token prefixes) against an emulator of 64 blocks of 16 tokens:
    the emulator, the run's outcome and folder, and each distance's (cached share, returns)."""
    emu = emulator_factory("--enable-prompt-tokens-details", "--num-gpu-blocks", "64", "--block-size", "16", *flags,
                           "--ttft", "0.002", "--itl", "0.001")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/reuse.py"), "--headless", "-u", "1", "-r", "1", "-t", "60s",
                          "--num-requests", str(requests), "--input-tokens", "256", "--reuse-distance", distances,
                          "--host", emu.url, "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    names = json.loads((run_dir / "summary.json").read_text())["summary"]["names"]
    points = {d: (share, n) for d, share, n in curve(names)}
    assert sorted(points) == [int(d) for d in distances.split(",")] and all(n == 2 for _, n in points.values()), \
        points  # two cycles of each
    return emu, res, run_dir, points


def test_the_reuse_curve_falls_to_zero_where_the_servers_cache_is_full(tmp_path, emulator_factory):
    # 64 blocks of 16 tokens: 1,024 tokens of cache. A 256-token prefix (16 blocks) survives while it and the work
    # since fit: up to 48 blocks of fillers, 768 tokens (the capacity's prediction, the last distance that hits);
    # 1,024 tokens of fillers evict it
    _emu, res, run_dir, points = _curve(tmp_path, emulator_factory, [], "0,512,768,1024,2048", 54)
    # within the capacity: the whole prefix but the block the template shifts (240 of the return's 272 tokens)
    assert all(points[d][0] == 240 / 272 for d in (0, 512, 768)), points
    assert points[1024][0] == 0 and points[2048][0] == 0, points
    line = next(x for x in res.stdout.splitlines() if x.startswith("reuse curve: "))
    assert "1,024 tok 0% (2)" in line and "2,048 tok 0% (2)" in line
    assert "id='reuse'" in (run_dir / "report.html").read_text()


def test_kv_offload_keeps_the_prefix_past_the_gpus_blocks_until_its_own_tier_forgets(tmp_path, emulator_factory):
    """The same server with KV offloading's CPU tier behind its 64 blocks (the emulator's --kv-offload-blocks 256,
    vLLM's --kv-offloading-size): every computed block is written through, so the prefix the GPU forgot at 1,024
    tokens of work is loaded back from the tier (vLLM's external hits) until the tier's own 256 blocks have turned
    over: 240 blocks of fillers beside its 16, 3,840 tokens. What offload recovered is the curve's difference, and the
    server's external hits are exactly the tokens the returns past the GPU's capacity found."""
    from prometheus_client.parser import text_string_to_metric_families

    emu, _res, _run_dir, points = _curve(tmp_path, emulator_factory, ["--kv-offload-blocks", "256"],
                                         "0,1024,2048,4096", 72)
    # past the GPU's 1,024 tokens (where the curve without offload is 0) and up to the tier's 3,840: whole
    assert all(points[d][0] == 240 / 272 for d in (0, 1024, 2048)), points
    assert points[4096][0] == 0, points
    metrics = {s.name: s.value for f in text_string_to_metric_families(urllib.request.urlopen(
        emu.url + "/metrics").read().decode()) for s in f.samples if s.name.endswith("_total")}
    # the loaded tokens are the four returns' past the GPU (1,024 and 2,048, two cycles): 240 each
    assert metrics["vllm:external_prefix_cache_hits_total"] == 4 * 240, metrics
    assert metrics["vllm:prefix_cache_hits_total"] == 2 * 240, metrics  # the returns at 0: the GPU's own


def test_bad_distances_are_one_line(tmp_path):
    res = run_in_process(["-f", str(ROOT / "locustfiles/reuse.py"), "--headless", "-u", "1", "-t", "2s",
                          "--reuse-distance", "10,-5", "--run-dir", str(tmp_path / "run")], cwd=tmp_path, timeout=60)
    assert res.returncode == 2 and "--reuse-distance '10,-5': give tokens of work" in res.stderr
