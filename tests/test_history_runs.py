"""The history over real runs of the emulator: eight runs of one load, the server 15 % slower to its first token
(``--emulator-ttft``) from the sixth on. A gate of ``ttft.p99<=baseline*1.10`` against the last 4 passes the
unchanged fifth run and fails the sixth, naming the baseline's runs and judging by their own summaries; `vllm-load
history show` finds no change point in the first five and one at the sixth after eight; the history page draws its
charts in a real browser."""

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

#: the runs' trust is part of what is judged (a baseline holds trusted runs only) and a 10 % limit is a timing
#: bound: these run on the quiet cores, as every test whose subject is a time the client keeps
pytestmark = [pytest.mark.slow, pytest.mark.quiet_cores]
CHAT = str(ROOT / "locustfiles" / "chat.py")
#: the emulator's time to first token, and 15 % more from the sixth run on
TTFT, SLOWER = 0.2, 0.23
GATE = ["--baseline", "last 4", "--slo", "ttft.p99<=baseline*1.10"]


def _run(cwd: Path, ttft: float, *extra: str):
    res = run_in_process(["-f", CHAT, "--headless", "-u", "2", "-r", "2", "-t", "3s", "--output-tokens", "16",
                          "--emulator-ttft", str(ttft), *extra], cwd, emulator_process=True)
    run_dir = cwd / res.run_dir
    return res, json.loads((run_dir / "summary.json").read_text()), run_dir


def _changes(store: Path, capsys) -> dict:
    capsys.readouterr()
    assert history(["--results-db", str(store), "show", "ttft.p99", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    """The eight runs (their outcomes, summaries, run ids), and the series' change points seen after five."""
    cwd = tmp_path_factory.mktemp("series")
    runs = [_run(cwd, TTFT) for _ in range(4)]
    runs.append(_run(cwd, TTFT, *GATE))
    store = cwd / "reports" / "history.sqlite"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert history(["--results-db", str(store), "show", "ttft.p99", "--json"]) == 0
    after_five = json.loads(out.getvalue())
    runs.append(_run(cwd, SLOWER, *GATE))
    runs += [_run(cwd, SLOWER) for _ in range(2)]
    return {"runs": runs, "store": store, "after_five": after_five, "cwd": cwd}


def test_the_gate_passes_the_unchanged_run_and_fails_the_slowed_one_naming_its_baseline(series):
    runs = series["runs"]
    ids = [json.loads((d / "config.json").read_text())["run_id"] for _, _, d in runs]
    p99 = [s["summary"]["metrics"]["ttft"]["p99"] for _, s, _ in runs]
    for (res, data, _), n in ((runs[4], 4), (runs[5], 5)):
        check = data["slo"][0]
        baseline_ids = ids[n - 4:n][::-1]  # the last 4 before it, newest first
        assert data["baseline_runs"] == baseline_ids
        base = statistics.median(p99[n - 4:n])  # the baseline's own summaries, not the store's copy of them
        assert check["value"] == p99[n]
        assert f"against the baseline's {base * 1000:.2f} ms" in check["detail"]
        assert "median of 4 runs: " + ", ".join(baseline_ids[:3]) in check["detail"]
        assert res.code == (EXIT_OK if n == 4 else EXIT_SLO_MISS), (n, check, res.stdout[-3000:])
        assert check["passed"] == (n == 4) and (p99[n] <= base * 1.10) == (n == 4)
    assert "history: TTFT p99" in runs[5][0].stdout and "CHANGED" in runs[5][0].stdout


def test_history_finds_no_change_in_five_unchanged_runs_and_one_at_the_slowed_run(series, capsys):
    runs = series["runs"]
    assert series["after_five"]["changes"] == [] and len(series["after_five"]["points"]) == 5
    found = _changes(series["store"], capsys)
    ids = [json.loads((d / "config.json").read_text())["run_id"] for _, _, d in runs]
    assert [p["run_id"] for p in found["points"]] == ids
    assert [c["run_id"] for c in found["changes"]] == [ids[5]], found["changes"]
    assert 0.08 < found["changes"][0]["shift"] < 0.25


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
    assert attr["points"] == "8,8,8,8"
    assert "trusted runs" in attr["legend"] and "level (between change points)" in attr["legend"]
    assert "ttft.p99" in dom and dom.count("<a href=") == 8  # each run's report linked
