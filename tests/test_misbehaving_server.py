"""A misbehaving server is not hammered and not believed: 5xx without Retry-After and broken streams make each
closed-loop user back off (counted), and a stream far past its max_tokens is cut as a protocol failure, with
the native reader and with the Python one (real Locust processes against the emulator's injected faults)."""

import pytest

from tests.helpers import ROOT, run_in_process
from tests.test_e2e import load_run

CHAT = str(ROOT / "locustfiles/chat.py")


@pytest.mark.parametrize("fault", ["503", "malformed"])
def test_a_failing_server_sees_a_bounded_request_rate(emulator_factory, tmp_path, fault):
    emu = emulator_factory("--ttft", "0.002", "--itl", "0.001", "--fault", f"{fault}:1")
    run_dir = tmp_path / "run"
    # ended by its count: a busy host only slows the run (4 s of a busy host once held too few failures)
    res = run_in_process(["-f", CHAT, "--headless", "-u", "2", "-r", "2", "-t", "120s", "--num-requests", "16",
                          "--host", emu.url, "--output-tokens", "4", "--retry-backoff-max", "1s",
                          "--run-dir", str(run_dir)], cwd=tmp_path)
    stats, logs = load_run(run_dir)
    s = stats["summary"]
    assert res.returncode != 0 and s["failed"] == s["requests"] == len(logs) == 16
    # without a backoff 2 users made ~1,250 requests/s; with it each failure waits 50 ms doubling to 1 s, times a
    # jitter of 0.5-1: 16 failures over 2 users wait at least 2 x 0.5 x (0.05 + ... + 0.8 + 1 + 1 + 1) = 4.55 s
    assert s["backoffs"] >= s["requests"] - 2 and s["backoff_s"] >= 4.5, (s["backoffs"], s["backoff_s"])
    assert s["duration_s"] >= 4.5 / 2  # two users wait side by side
    assert "backoff: users waited" in res.stdout


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_stream_far_past_max_tokens_is_cut_and_counted(emulator_factory, tmp_path, native):
    emu = emulator_factory("--ttft", "0.005", "--itl", "0.002", "--fault", "overrun:1")  # 1,600 tokens for 16
    run_dir = tmp_path / "run"
    run_in_process(["-f", CHAT, "--headless", "-u", "2", "-r", "2", "-t", "3s", "--host", emu.url, "--output-tokens",
                    "16", "--retry-backoff-max", "50ms", "--run-dir", str(run_dir)], cwd=tmp_path,
                   env_extra={"VLLM_LOAD_NATIVE": native})
    _stats, logs = load_run(run_dir)
    cut = [r for r in logs if not r["ok"] and "ran past 32 tokens for max_tokens 16: cut" in (r["error"] or "")]
    assert len(cut) >= 2 and len(cut) >= len(logs) - 2, [r["error"] for r in logs]
    for r in cut:
        assert 32 < sum(r["chunk_tokens"]) <= 40  # cut at the limit, not read to its 1,600 tokens
        assert r["e2e"] < 1.0  # 1,600 tokens take 3.2 s


def test_failures_quoting_a_unique_id_make_one_error_row_and_a_small_summary(emulator_factory, tmp_path):
    import json

    emu = emulator_factory("--ttft", "0.002", "--itl", "0.001", "--fault", "error:1")  # each error names its request
    run_dir = tmp_path / "run"
    run_in_process(["-f", CHAT, "--headless", "-u", "4", "-r", "4", "-t", "60s", "--num-requests", "220", "--host",
                    emu.url, "--request-rate", "150",
                    "--output-tokens", "4", "--run-dir", str(run_dir)], cwd=tmp_path)
    data = json.loads((run_dir / "summary.json").read_text())
    s = data["summary"]
    _stats, logs = load_run(run_dir)
    raw = {r["error"] for r in logs}
    assert s["failed"] >= 200 and len(raw) == s["failed"]  # every raw reason differs, and the log keeps each
    assert s["errors"] == {"error in stream: injected fault: engine error in request <id>": s["failed"]}
    assert s["error_examples"][next(iter(s["errors"]))] in raw
    assert (run_dir / "summary.json").stat().st_size < 100_000


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_stream_of_bytes_without_a_line_end_is_a_counted_failure_in_bounded_memory(emulator_factory, tmp_path,
                                                                                      native):
    """Bytes without a newline grew the line buffer at ~190 MB/s (1.9 GB in 10 s); each reader now refuses a line
    past 16 MiB: the request fails, counted, and the process's memory stays bounded."""
    import resource

    emu = emulator_factory("--ttft", "0.002", "--itl", "0.001", "--fault", "endless:1")
    run_dir = tmp_path / "run"
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    res = run_in_process(["-f", CHAT, "--headless", "-u", "2", "-r", "2", "-t", "60s", "--num-requests", "2",
                          "--host", emu.url, "--output-tokens", "8", "--retry-backoff-max", "50ms",
                          "--run-dir", str(run_dir)], cwd=tmp_path, env_extra={"VLLM_LOAD_NATIVE": native})
    _stats, logs = load_run(run_dir)
    assert res.returncode != 0 and len(logs) == 2 and not any(r["ok"] for r in logs), [r["error"] for r in logs]
    # cut at the bound (the native thread marks the body malformed), not read to the 24 MiB and the server's close
    assert all("a body line over 16 MiB" in r["error"] or r["error"].startswith("malformed") for r in logs), \
        sorted({r["error"][:80] for r in logs})
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 200, grown_mb
