"""The four pages a person reads (report.html, sweep.html, compare.html, tune.html) as headless Chromium draws them
at 1280 x 900: what each says first is on its first screen (the report's Load line and verdict, the sweep's answer
and each step's trust, compare's conclusion, the tune's recommendation), its charts drawn, and a screenshot taken.
With $VLLM_LOAD_DOCS_SCREENSHOTS=DIR the screenshots are also written there (docs/screenshots/ was made so)."""

from __future__ import annotations

import os
import shutil

import pytest
from PIL import Image

from tests.browser import Browser, chromium
from tests.test_report import make_pages, make_run_dir

WIDTH, HEIGHT = 1280, 900


def _pages(tmp_path):
    """Each page built from run directories as the commands make them: name -> file."""
    from vllm_load.report.html import build

    run = make_run_dir(tmp_path / "run")
    build(run, ["ttft.p99<=500ms"])
    make_pages(tmp_path)
    return {"report": run / "report.html", "sweep": tmp_path / "sweep" / "sweep.html",
            "compare": tmp_path / "cmp" / "compare.html", "tune": tmp_path / "tune" / "tune.html"}


#: per page: (the element a person reads first, what it says, the charts' host)
FIRST = {"report": ("load", "Load: 4 users, closed loop · input 128 output 64 tokens", "timeline-charts"),
         "sweep": ("best", "Largest concurrency meeting every SLO: 4", "sweep-charts"),
         "compare": ("conclusion", "", "distributions-charts"),
         "tune": ("recommended", "Recommended: max_num_seqs=8", "tune-charts")}


def test_each_page_says_its_first_things_on_its_first_screen_and_draws_its_charts(tmp_path):
    if chromium() is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install chromium (.ci/run does)")
        pytest.skip("chromium is not installed (CI installs it)")
    pages = _pages(tmp_path)
    keep = os.environ.get("VLLM_LOAD_DOCS_SCREENSHOTS")
    browser = Browser(tmp_path / "chromium")
    try:
        browser.set_width(WIDTH, HEIGHT)
        for name, page in pages.items():
            element, says, charts = FIRST[name]
            browser.goto(page.as_uri(), ready=f"document.getElementById('{charts}')?.dataset.drawn > 0", probe=False)
            box = browser.eval(f"(() => {{ const e = document.getElementById('{element}'); const r = "
                               "e.getBoundingClientRect(); return [e.innerText, r.top, r.bottom]; })()")
            text, top, bottom = box
            assert says in " ".join(text.split()) and text.strip(), (name, text)
            assert 0 <= top and bottom <= HEIGHT, (name, top, bottom)  # on the first screen, whole
            if name == "sweep":  # each step's trust, in its table
                trust = browser.eval("[...document.querySelectorAll('table tr')].map(r => r.innerText).join('\\n')")
                assert trust.count("trusted") >= 3, trust
            shot = browser.screenshot(tmp_path / f"{name}.png")
            with Image.open(shot) as image:
                assert image.size == (WIDTH, HEIGHT)
                assert len(image.convert("RGB").getcolors(maxcolors=1 << 20) or ()) > 50  # text and charts drawn
            if keep:
                os.makedirs(keep, exist_ok=True)
                shutil.copy(shot, os.path.join(keep, f"{name}.png"))
    finally:
        browser.close()
