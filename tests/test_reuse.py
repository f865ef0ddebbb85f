"""locustfiles/reuse.py: a prefix, DISTANCE tokens of other work, the prefix again; the server's own cached tokens
for the return draw the curve of its cache's memory, which falls to 0 at the distance its capacity predicts."""

from __future__ import annotations

import json

from tests.helpers import ROOT, run_in_process
from vllm_load.metrics.reuse import curve


def test_the_reuse_curve_falls_to_zero_where_the_servers_cache_is_full(tmp_path, emulator_factory):
    # 64 blocks of 16 tokens: 1,024 tokens of cache. A 256-token prefix (16 blocks) survives while it and the work
    # since fit: up to 48 blocks of fillers, 768 tokens (the capacity's prediction, the last distance that hits);
    # 1,024 tokens of fillers evict it
    emu = emulator_factory("--enable-prompt-tokens-details", "--num-gpu-blocks", "64", "--block-size", "16",
                           "--ttft", "0.002", "--itl", "0.001")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/reuse.py"), "--headless", "-u", "1", "-r", "1", "-t", "60s",
                          "--num-requests", "54", "--input-tokens", "256", "--reuse-distance", "0,512,768,1024,2048",
                          "--host", emu.url, "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    names = json.loads((run_dir / "summary.json").read_text())["summary"]["names"]
    points = {d: (share, n) for d, share, n in curve(names)}
    assert sorted(points) == [0, 512, 768, 1024, 2048] and all(n == 2 for _, n in points.values())  # two cycles
    # within the capacity: the whole prefix but the block the template shifts (240 of the return's 272 tokens)
    assert all(points[d][0] == 240 / 272 for d in (0, 512, 768)), points
    assert points[1024][0] == 0 and points[2048][0] == 0, points
    line = next(x for x in res.stdout.splitlines() if x.startswith("reuse curve: "))
    assert "1,024 tok 0% (2)" in line and "2,048 tok 0% (2)" in line
    assert "id='reuse'" in (run_dir / "report.html").read_text()


def test_bad_distances_are_one_line(tmp_path):
    res = run_in_process(["-f", str(ROOT / "locustfiles/reuse.py"), "--headless", "-u", "1", "-t", "2s",
                          "--reuse-distance", "10,-5", "--run-dir", str(tmp_path / "run")], cwd=tmp_path, timeout=60)
    assert res.returncode == 2 and "--reuse-distance '10,-5': give tokens of work" in res.stderr
