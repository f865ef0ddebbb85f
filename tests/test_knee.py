"""The knee of a sweep's throughput curve (metrics/shape/knee.py, Kneedle): where more load stopped buying throughput."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from tests.helpers import ROOT, run_in_process
from vllm_load.metrics.shape.knee import knee
from vllm_load.report.sweep import knee_line
from vllm_load.rundir.files import load_run


def test_a_saturating_curve_bends_at_its_capacity_and_a_line_has_no_knee():
    levels = [8, 16, 32, 64, 128]
    assert knee(levels, [min(x, 32) * 10.0 for x in levels]) == 32  # saturates at 32 users
    # diminishing returns, on the levels as they are (not their logarithm): scaled, the curve stands furthest above
    # the diagonal at 8 (0.905 of the rise at 0.226 of the span)
    assert knee([1, 2, 4, 8, 16, 32], [100, 180, 250, 290, 305, 310]) == 8
    assert knee(levels, [x * 10.0 for x in levels]) is None  # linear: no bend
    assert knee([8, 16], [80.0, 160.0]) is None and knee(levels, [50.0] * 5) is None  # too few; flat
    assert knee(levels, [80.0, None, 320.0, 320.0, 320.0]) == 32  # a step that measured nothing is left out
    # a collapse past capacity (preemption, a starved emulator): the knee is where the rise stopped, not wherever the
    # falling tail's last point makes the diagonal lean (without the running maximum: 64)
    assert knee(levels, [80.0, 160.0, 320.0, 340.0, 120.0]) == 32


def test_the_sweep_page_says_the_knee_with_its_throughput():
    runs = [SimpleNamespace(concurrency=x, summary=SimpleNamespace(output_token_rate=min(x, 32) * 10.0))
            for x in (8, 16, 32, 64)]
    assert knee_line(runs, "concurrency") == ("knee of the throughput curve: concurrency 32 (320.0 output tok/s, 100% "
                                              "of the most measured)")
    assert knee_line(runs[:2], "concurrency") == ""



@pytest.mark.slow  # a sweep of five levels: the full suite's
def test_a_sweep_finds_the_knee_and_the_max_goodput_at_an_emulators_known_capacity(tmp_path):
    """The embedded emulator batches 4 sequences at a time (small-gpu's cost model, --max-num-seqs 4): its throughput
    grows with the users up to 4 and stays there (the rest queue), so the sweep's knee is 4 users, and the decode
    curve is said beside it. From 5 users on, requests wait for a whole request (about 450 ms at 48 tokens) or half
    of one: at 8 users half of them or more miss a 150 ms TTFT, so ``--recipe max-goodput:90%`` names 4, and
    ``--stop-on-slo-miss`` ends the sweep at 8. What the run prints is the answer of its own steps' numbers on any host; exactly 4 only when the
    emulator kept its schedule (on CI's busy host a starved emulator once served 16 users at 63 % of 4's rate, a
    curve that is not the cost model's)."""
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles" / "sweep.py"), "--headless", "--sweep", "1,2,4,8,16",
                          "--num-requests", "16", "--output-tokens", "48", "--emulator-profile", "small-gpu",
                          "--emulator-max-num-seqs", "4", "--recipe", "max-goodput:90%", "--slo", "ttft.p90<=150ms",
                          "--stop-on-slo-miss", "--run-dir", str(run_dir)], tmp_path, timeout=180)
    steps = [load_run(d) for d in sorted((run_dir / "steps").iterdir())]
    levels = [s.concurrency for s in steps]
    fractions = [s.summary.good_request_fraction for s in steps]
    # the sweep is stopped at its first step under the attainment (a step is judged once its reports are in: these
    # steps of 16 requests end sooner, so the next may be done by then): every earlier one held it
    assert levels == [1, 2, 4, 8, 16][:len(levels)] and len(levels) >= 3, (levels, res.stdout[-3000:])
    miss = next((i for i, f in enumerate(fractions) if f < 0.9), len(levels))
    assert miss > 0, fractions
    if miss < len(levels):
        assert re.search(rf"sweep step {miss} \({levels[miss]}\) missed .*good_request_fraction>=90%: stopping the "
                         "sweep", res.stdout), res.stdout[-3000:]
    # the answer is the largest level that held it and can be trusted (a step the busy host made untrustworthy is
    # passed over, and said so)
    trusted = [not json.loads((s.path / "summary.json").read_text())["trust"]["detail"].startswith("UNTRUSTWORTHY")
               for s in steps]
    held = [i for i in range(miss) if trusted[i]]
    if not held:
        assert "No answer: the step at concurrency" in res.stdout, res.stdout[-2000:]
        return
    answer = levels[held[-1]]
    goodput = next(s.summary.goodput for s in steps if s.concurrency == answer)
    assert f"max goodput at 90% attainment: concurrency {answer}, {goodput:.2f} good req/s" in res.stdout, \
        res.stdout[-2000:]
    if held[-1] < miss - 1:
        assert "met them too but" in res.stdout
    at = knee([float(x) for x in levels], [s.summary.output_token_rate for s in steps])
    assert at is not None, [s.summary.output_token_rate for s in steps]
    assert f"knee of the throughput curve: concurrency {at:g} (" in res.stdout, res.stdout[-2000:]
    if all(trusted):  # every step kept time (no trust finding, accepted or not)
        assert (answer, at) == (4, 4), (fractions, [s.summary.output_token_rate for s in steps])
    assert "decode curve: ITL p50 " in (run_dir / "sweep.md").read_text()
    # the run as a whole (every step's requests, those past the answer's too) misses its SLOs: exit 3, as any sweep
    # that went past its largest passing level
    assert res.returncode == (3 if miss < len(levels) else 0), res.stdout[-3000:] + res.stderr[-3000:]
