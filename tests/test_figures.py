"""Figures that leave the browser (report/figures.py): a run's headline charts as PNG and SVG in its figures/,
shown in summary.md; a sweep's against its level. Read back as files: their size, their pixels, one SVG group per
series drawn. The rest of the suite runs with --no-figures (its environment variable, tests/conftest.py)."""

from __future__ import annotations

import json
import re

from PIL import Image

from tests.helpers import ROOT, run_in_process
from vllm_load.report.figures import DPI, SIZE, draw


def _series(svg: str) -> list[str]:
    return re.findall(r'<g id="(series-\d+)"', svg)


def test_a_run_writes_its_headline_figures_and_shows_them_in_summary_md(tmp_path, emulator_factory):
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "60s",
                          "--num-requests", "30", "--host", emu.url, "--output-tokens", "8", "--run-dir",
                          str(run_dir)], tmp_path, env_extra={"VLLM_LOAD_NO_FIGURES": None})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    figures = run_dir / "figures"
    assert sorted(p.name for p in figures.iterdir()) == ["latency.png", "latency.svg", "throughput.png",
                                                        "throughput.svg"]
    for name in ("latency", "throughput"):
        with Image.open(figures / f"{name}.png") as png:
            assert png.size == (int(SIZE[0] * DPI), int(SIZE[1] * DPI))
            colors = {c: n for n, c in png.convert("RGB").getcolors(maxcolors=1 << 20) or ()}
            assert colors.get((0x1F, 0x77, 0xB4), 0) > 10  # the first series drawn in its colour (a lone window too)
    # the report's charts, series for series: latency's percentiles, throughput's rates
    html = (run_dir / "report.html").read_text()
    specs = {c["id"]: c for c in json.loads(re.search(r'id="chart-data">(.*?)</script>', html, re.S)[1])["timeline"]}
    for name in ("latency", "throughput"):
        assert len(_series((figures / f"{name}.svg").read_text())) == len(specs[name]["series"]) >= 1
    assert len(specs["latency"]["series"]) >= 2  # its percentiles
    md = (run_dir / "summary.md").read_text()
    assert "## Figures" in md and "![latency](figures/latency.png)" in md and "([SVG](figures/throughput.svg))" in md


def test_no_figures_writes_none_and_says_none(tmp_path, emulator_factory):
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "1", "-r", "1", "-t", "60s",
                          "--num-requests", "5", "--host", emu.url, "--output-tokens", "4", "--no-figures",
                          "--run-dir", str(run_dir)], tmp_path, env_extra={"VLLM_LOAD_NO_FIGURES": None})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert not (run_dir / "figures").exists() and "## Figures" not in (run_dir / "summary.md").read_text()


def test_a_second_unit_gets_its_own_axis_and_a_step_its_steps(tmp_path):
    """A sweep's throughput (req/s on a right-hand axis, as sweep.html draws it) and a Pareto front's steps."""
    spec = {"id": "sweep-throughput", "title": "Throughput against the users", "x_label": "users",
            "y_label": "output tok/s", "y2_label": "req/s", "kind": "level", "x": [1, 2, 4, 8],
            "series": [{"label": "output tok/s", "values": [40.0, 80.0, 150.0, None]},
                       {"label": "req/s", "values": [2.0, 4.0, 7.5, 8.0], "axis": "y2"},
                       {"label": "front", "values": [1, 2, 2, 3], "step": True, "dash": True}]}
    png, svg = draw(spec, tmp_path)
    text = svg.read_text()
    assert sorted(_series(text)) == ["series-0", "series-1", "series-2"]
    assert "req/s" in text and "output tok/s" in text  # both axes' labels
    with Image.open(png) as image:
        assert image.size == (800, 320)


def test_a_sweep_writes_its_charts_against_the_level_as_figures(tmp_path):
    from tests.test_report import make_run_dir
    from vllm_load.cli import main as cli_main

    runs = [make_run_dir(tmp_path / f"l{u}", users=u, base_ttft=0.1 * u) for u in (2, 4, 8)]
    assert cli_main(["report", *map(str, runs), "--slo", "ttft.p99<=500ms", "--out", str(tmp_path / "sweep")]) == 3
    figures = tmp_path / "sweep" / "figures"
    pngs = sorted(p.stem for p in figures.glob("*.png"))
    assert pngs == sorted(p.stem for p in figures.glob("*.svg")) and {"sweep-throughput", "sweep-latency"} <= set(pngs)
    # throughput: tok/s and req/s, each against its own axis; latency: TTFT and E2E, mean and p99
    assert sorted(_series((figures / "sweep-throughput.svg").read_text())) == ["series-0", "series-1"]
    assert len(_series((figures / "sweep-latency.svg").read_text())) == 4
    md = (tmp_path / "sweep" / "sweep.md").read_text()
    assert "![sweep-throughput](figures/sweep-throughput.png)" in md


def test_compare_and_tune_write_their_headline_charts_as_figures(tmp_path, monkeypatch):
    """compare's distributions (A against B, on the nines axis) and tune's curves (TTFT p99 and output tokens/s
    against the load, the Pareto front) as files beside their pages, shown in compare.md and tune.md; the suite's
    --no-figures variable turns them off, as a run's."""
    from tests.test_report import make_pages

    monkeypatch.delenv("VLLM_LOAD_NO_FIGURES")
    make_pages(tmp_path)
    compared = tmp_path / "cmp" / "figures"
    assert sorted(p.name for p in compared.glob("*.png")) == ["ab-e2e.png", "ab-itl.png", "ab-tpot.png", "ab-ttft.png"]
    svg = (compared / "ab-ttft.svg").read_text()
    assert _series(svg) == ["series-0", "series-1"] and "p99.9" in svg  # A and B; the nines named as the page names
    assert "![ab-ttft](figures/ab-ttft.png)" in (tmp_path / "cmp" / "compare.md").read_text()
    tuned = tmp_path / "tune" / "figures"
    assert {"tune-latency", "tune-throughput"} <= {p.stem for p in tuned.glob("*.png")}
    assert len(_series((tuned / "tune-latency.svg").read_text())) == 2  # a series per configuration
    assert "![tune-throughput](figures/tune-throughput.png)" in (tmp_path / "tune" / "tune.md").read_text()
    monkeypatch.setenv("VLLM_LOAD_NO_FIGURES", "true")
    from vllm_load.report.compare import run_compare

    _, off = run_compare(str(tmp_path / "l2"), str(tmp_path / "l8"), str(tmp_path / "off"))
    assert not (off / "figures").exists() and "## Figures" not in (off / "compare.md").read_text()
