"""The history over real runs of the emulator: runs of one load, the server 30 % slower to its first token
(``--emulator-ttft``) from the gate's second run on. A gate of ``ttft.p50<=baseline*1.10`` against the last 4
trusted runs passes the unchanged run and fails the slowed one, naming the baseline's runs and judging by their own
summaries; `vllm-load history show` finds no change point among the unchanged runs and one at the first slowed one;
the history page draws its charts in a real browser. What a busy host distrusts is run again and left out, as the
baseline and the change points leave it out: the expectations are read from each run's own verdict."""

from __future__ import annotations

import contextlib
import io
import json
import statistics
from pathlib import Path

import pytest

from tests.browser import INKED_JS, probe_page
from tests.helpers import ROOT, run_in_process
from vllm_load.errors import EXIT_OK, EXIT_SLO_MISS
from vllm_load.history.cli import main as history
from vllm_load.metrics.judge.verdict import Verdict

#: the runs' trust is part of what is judged (a baseline holds trusted runs only) and a 10 % limit is a timing
#: bound: these run on the quiet cores, as every test whose subject is a time the client keeps
pytestmark = [pytest.mark.slow, pytest.mark.quiet_cores]
CHAT = str(ROOT / "locustfiles" / "chat.py")
#: the emulator's time to first token, and 30 % more from the slowed gate run on: a 60 ms step, three times what the
#: gate's 10 % allows. The gate and the change points judge the median of a run's ~18 requests: its p99 is its slowest
#: one, which CI's busy host delayed by 50 ms in an unchanged run (+14.7 %, a failed gate and a change point there)
TTFT, SLOWER = 0.2, 0.26
GATE = ["--baseline", "last 4", "--slo", "ttft.p50<=baseline*1.10"]
#: at most this many runs of a kind: a busy host distrusts a run now and then (its event loop lagged), and a
#: baseline holds trusted runs only, so the series runs until it has the trusted runs it needs
TRIES = 4


def _run(cwd: Path, ttft: float, *extra: str):
    res = run_in_process(["-f", CHAT, "--headless", "-u", "2", "-r", "2", "-t", "3s", "--output-tokens", "16",
                          "--emulator-ttft", str(ttft), *extra], cwd, emulator_process=True)
    run_dir = cwd / res.run_dir
    return res, json.loads((run_dir / "summary.json").read_text()), run_dir


def _trusted(run) -> bool:
    """The run's own verdict, as summary.json holds it: what the store's baseline reads."""
    return not Verdict.from_json(run[1]).distrusted


def _until_trusted(cwd: Path, ttft: float, need: int, *extra: str) -> list:
    """Runs of one kind until ``need`` of them are trusted (each a try's run, kept: the store holds them all)."""
    runs: list = []
    while sum(map(_trusted, runs)) < need:
        assert len(runs) < need + TRIES, [r[1]["trust"]["detail"] for r in runs]
        runs.append(_run(cwd, ttft, *extra))
    return runs


def _said(runs) -> list[tuple[str, float, bool]]:
    """Each run's id, TTFT p50 and trust: what a failed assertion shows."""
    return [(json.loads((d / "config.json").read_text())["run_id"], s["summary"]["metrics"]["ttft"]["p50"],
             _trusted((r, s, d))) for r, s, d in runs]


def _changes(store: Path, capsys) -> dict:
    capsys.readouterr()
    assert history(["--results-db", str(store), "show", "ttft.p50", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    """The runs (their outcomes, summaries, run dirs): 4 trusted unchanged ones, the unchanged gate run, the
    slowed gate run, 2 more slowed (each kind run again while a busy host distrusts it), and the series' change
    points seen after the unchanged gate run."""
    cwd = tmp_path_factory.mktemp("series")
    runs = _until_trusted(cwd, TTFT, 4)
    gate = _until_trusted(cwd, TTFT, 1, *GATE)
    runs += gate
    store = cwd / "reports" / "history.sqlite"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert history(["--results-db", str(store), "show", "ttft.p50", "--json"]) == 0
    after_unchanged = json.loads(out.getvalue())
    slowed_gate = _until_trusted(cwd, SLOWER, 1, *GATE)
    first_slowed = len(runs)
    runs += slowed_gate
    runs += _until_trusted(cwd, SLOWER, 2)
    return {"runs": runs, "store": store, "after_unchanged": after_unchanged, "cwd": cwd,
            "unchanged_gate": first_slowed - 1, "slowed_gate": first_slowed + len(slowed_gate) - 1,
            "first_slowed": first_slowed}


def test_the_gate_passes_the_unchanged_run_and_fails_the_slowed_one_naming_its_baseline(series):
    runs = series["runs"]
    said = _said(runs)
    ids = [i for i, _, _ in said]
    p50 = [v for _, v, _ in said]
    for n in (series["unchanged_gate"], series["slowed_gate"]):
        res, data, _ = runs[n]
        check = data["slo"][0]
        before = [i for i in range(n) if said[i][2]][-4:]  # the last 4 trusted runs before it
        baseline_ids = [ids[i] for i in before][::-1]  # newest first
        assert data["baseline_runs"] == baseline_ids, said
        base = statistics.median(p50[i] for i in before)  # the baseline's own summaries, not the store's copy
        assert check["value"] == p50[n]
        assert f"against the baseline's {base * 1000:.2f} ms" in check["detail"]
        assert "median of 4 runs: " + ", ".join(baseline_ids[:3]) in check["detail"]
        unchanged = n == series["unchanged_gate"]
        assert res.code == (EXIT_OK if unchanged else EXIT_SLO_MISS), (n, check, said, res.stdout[-3000:])
        assert check["passed"] == unchanged and (p50[n] <= base * 1.10) == unchanged, (check, said)
    slowed = runs[series["slowed_gate"]][0].stdout
    assert "history: TTFT p99" in slowed and "CHANGED" in slowed


def test_history_finds_no_change_in_unchanged_runs_and_one_at_the_first_slowed_one(series, capsys):
    runs = series["runs"]
    said = _said(runs)
    assert series["after_unchanged"]["changes"] == [], said
    assert len(series["after_unchanged"]["points"]) == series["first_slowed"]
    found = _changes(series["store"], capsys)
    ids = [i for i, _, _ in said]
    assert [p["run_id"] for p in found["points"]] == ids
    # the change is at the first trusted slowed run: an untrusted run is left out of the statistics
    first = next(i for i in range(series["first_slowed"], len(runs)) if said[i][2])
    assert [c["run_id"] for c in found["changes"]] == [ids[first]], (found["changes"], said)
    assert 0.2 < found["changes"][0]["shift"] < 0.4, (found["changes"], said)


def test_the_history_page_draws_its_charts_in_headless_chromium(series, tmp_path):
    from tests.test_report import chromium

    browser = chromium()
    if browser is None:
        pytest.fail("CI must install chromium (.ci/run does)")
    page = tmp_path / "history.html"
    assert history(["--results-db", str(series["store"]), "page", "--out", str(page)]) == 0
    dom, attr = probe_page(browser, page, INKED_JS + "b.setAttribute('data-points',[...document.querySelectorAll("
                           "'.chart')].map(e=>e.dataset.points).join(','));", tmp_path / "profile")
    assert 'id="history-charts" data-drawn="4"' in dom and int(attr["inked"]) == 4
    n = len(series["runs"])
    assert attr["points"] == ",".join([str(n)] * 4)
    assert "trusted runs" in attr["legend"] and "level (between change points)" in attr["legend"]
    assert "ttft.p99" in dom and dom.count("<a href=") == n  # each run's report linked
