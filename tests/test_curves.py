"""Latency curves (metrics/shape/curves.py): TTFT against the prompt's length, ITL against concurrency, each a line
fitted through its points; and on a server whose prefill costs a known time per token, the curve finds it."""

from __future__ import annotations

import json

import pytest

from tests.helpers import ROOT, run_in_process


def test_the_curves_fit_what_the_requests_drew():
    """The prefill curve's bins and line on TTFT = 10 ms + 20 ms per 1k input tokens, exactly; the decode curve's on
    ITL = 5 ms + 0.25 ms per user; too few requests, one length, or two levels draw none."""
    from vllm_load.features.prefill_curve import describe as describe_prefill
    from vllm_load.metrics.shape.curves import decode_curve, describe_decode, prefill_curve

    logs = [{"ok": True, "input_tokens": n, "ttft": 0.010 + 20e-6 * n} for n in range(200, 3400, 100)]
    c = prefill_curve(logs + [{"ok": False, "input_tokens": 99999, "ttft": 9.0}, {"ok": True, "warmup": True,
                                                                                  "input_tokens": 5, "ttft": 9.0}])
    assert c is not None and len(c["points"]) == 8 and sum(p["requests"] for p in c["points"]) == 32
    assert c["intercept_ms"] == pytest.approx(10.0) and c["ms_per_1k_tokens"] == pytest.approx(20.0)
    assert c["tokens_range"] == [200, 3300]
    assert describe_prefill(c) == "prefill curve: TTFT p50 10.0 ms + 20.00 ms per 1k input tokens (8 bins of 200-3,300 tokens)"
    assert prefill_curve(logs[:15]) is None  # too few to draw
    assert prefill_curve([{**r, "input_tokens": 1000} for r in logs]) is None  # one length: no curve
    d = decode_curve([1, 8, 32, 64], [0.005 + 0.00025 * u for u in (1, 8, 32, 64)])
    assert d["ms_per_user"] == pytest.approx(0.25) and d["intercept_ms"] == pytest.approx(5.0)
    assert describe_decode(d) == "decode curve: ITL p50 5.00 ms + 0.250 ms per concurrent user (4 levels, 1-64 users)"
    assert decode_curve([1, 8, 32], [0.005, None, 0.006]) is None
    # --repeat 3 of one level is no curve (it printed one over "3 levels, 4-4 users"); repeats of 3 levels are 3
    assert decode_curve([4, 4, 4], [0.005, 0.0051, 0.0049]) is None
    r = decode_curve([1, 1, 8, 8, 32, 32], [0.005, 0.005, 0.007, 0.007, 0.013, 0.013])
    assert describe_decode(r).endswith("(3 levels, 1-32 users)")


@pytest.mark.quiet_cores  # the fitted slope is a time the server keeps and the client reads: the test's subject
def test_the_prefill_curve_finds_the_servers_per_token_prefill_time(tmp_path, emulator_factory):
    """An emulator whose TTFT is 10 ms + 40 ms per 1k prompt tokens, one request at a time (no queue): the run's
    curve reads 40 ms per 1k within 15 %, and the report draws it."""
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002", "--prefill-per-token", "40e-6")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "1", "-r", "1", "-t", "120s",
                          "--num-requests", "48", "--input-tokens", "200-3000", "--output-tokens", "2", "--host",
                          emu.url, "--run-dir", str(run_dir)], tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    curve = json.loads((run_dir / "summary.json").read_text())["summary"]["features"]["prefill_curve"]
    assert curve["ms_per_1k_tokens"] == pytest.approx(40.0, rel=0.15), curve
    assert sum(p["requests"] for p in curve["points"]) == 48
    assert "prefill curve: TTFT p50 " in res.stdout and "prefill curve: TTFT p50 " in (run_dir / "report.html").read_text()


def test_a_falling_prefill_line_is_said_as_no_prefill_cost():
    from vllm_load.features.prefill_curve import describe

    c = {"tokens_range": [128, 4096], "intercept_ms": 24.9, "ms_per_1k_tokens": -11.0,
         "points": [{"tokens": 200 * i} for i in range(8)]}
    said = describe(c)
    assert said.startswith("prefill curve: TTFT p50 did not rise with the input length (its line falls 11.00 ms")
    assert "+ -" not in said
