"""The web UI's LLM tab, live SLO status and report link, on a real Locust process."""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from tests.helpers import ROOT, free_port, trusted_or_host_named, wait_for


def get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.read().decode()


def test_llm_tab_live_rows_slo_status_server_side_and_report_link(tmp_path, emulator_factory, sidecar_factory):
    emu = emulator_factory("--ttft", "0.02", "--itl", "0.005", "--enable-per-request-metrics")
    side = sidecar_factory("--vllm-url", emu.url, "--interval", "250ms", "--out", str(tmp_path / "series.jsonl"))
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles/chat.py"), "--host", emu.url,
                             "--web-host", "127.0.0.1", "--web-port", str(port), "--autostart", "-u", "2", "-r", "2",
                             # 8 s: two of the tab's 5 s polls of the sidecar inside the run (4 s, beside the full
                             # suite, twice ended before one saw a request running: 'Server: running max' 0)
                             "-t", "8s", "--autoquit", "300", "--output-tokens", "16", "--slo", "ttft.p99<=2s", "--sidecar-url", side.url,
                             "--run-dir", str(tmp_path / "run")],
                            cwd=tmp_path, env=env, stdout=open(tmp_path / "locust.out", "wb"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    seen: list = []  # the tab's last rows, for the failure's message

    def report_listed() -> tuple[str, list[dict]] | None:
        try:
            _, page = get(base + "/")
            _, body = get(base + "/stats/requests")
        except OSError:
            return None  # the UI is not up yet
        llm = [t for t in json.loads(body).get("extended_stats", []) if t["key"] == "llm"]
        rows = llm[0]["data"] if llm else []
        seen[:] = rows
        done = any(r["metric"] == "Report of the last run" for r in rows)
        # the sidecar is polled every 5 s: its running gauge shows the run's requests once a poll saw them
        server = any(r["metric"] == "Server: running max" and float(r["mean"]) >= 1 for r in rows)
        return (page, rows) if done and server else None

    try:
        try:
            page, rows = _up(proc, tmp_path, report_listed, "the LLM tab to list the run's report and the server's "
                                                             "running requests")
        except AssertionError as e:
            raise AssertionError(f"{e}\nthe tab's last rows: {seen}") from None
        report = get(base + "/vllm-load/report")[1]
        assert '"extended_tabs"' in page and '"LLM"' in page
        names = [r["metric"] for r in rows]
        assert "TTFT (ms)" in names and "Live charts (TTFT, ITL, tok/s, server)" in names
        # the run stopped (its report is listed): the tab holds its judged numbers, the report's, which no longer
        # move with the wall clock (the run's output rate kept falling after the stop)
        assert "Run stopped: its judged numbers (as in the report)" in names
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())["summary"]
        rate = next(r for r in rows if r["metric"] == "Output tok/s (run)")["mean"]
        assert rate == f"{summary['output_token_rate']:.1f}"
        went = [r["mean"] for r in rows if r["metric"] == "Where the time went"]  # the server's parts, as judged
        assert went and went[0].startswith("where TTFT p99 (")
        assert any(r["metric"] == "SLO ttft.p99<=2s" and r["count"] == "PASS" for r in rows)
        assert any(r["metric"] == "Server: prefix-cache hit rate" and r["mean"] == "0.0%" for r in rows)
        assert "SLO verdict" in report and "id=\"chart-data\"" in report
        stats = json.loads(get(base + "/stats/requests")[1])["extended_stats"]
        named = next(t["data"] for t in stats if t["key"] == "llm_names")  # chat.py names nothing: the tab says how
        assert len(named) == 1 and named[0]["c0"].startswith("no request was named yet: give self.llm.chat(")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_llm_by_name_tab_shows_one_row_per_name_and_the_total(tmp_path, emulator_factory):
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002")
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles/multiturn.py"), "--host",
                             emu.url, "--web-host", "127.0.0.1", "--web-port", str(port), "--autostart", "-u", "2",
                             "-r", "2", "-t", "20s", "--autoquit", "30", "--output-tokens", "8", "--turns", "2",
                             "--run-dir", str(tmp_path / "run")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def by_name() -> list[dict] | None:
        try:
            _, page = get(f"http://127.0.0.1:{port}/")
            _, body = get(f"http://127.0.0.1:{port}/stats/requests")
        except OSError:
            return None
        tab = [t for t in json.loads(body).get("extended_stats", []) if t["key"] == "llm_names"]
        rows = tab[0]["data"] if tab else []
        return rows if '"LLM by name"' in page and [r["c0"] for r in rows] == ["turn 1", "turn 2", "total"] else None

    try:
        rows = wait_for(by_name, timeout=180, what="the LLM by name tab to list both turns", poll=0.2)
        turn1, turn2, total = rows
        assert int(total["c1"]) >= int(turn1["c1"]) + int(turn2["c1"]) - 0 and int(turn1["c1"]) >= 1
        assert float(turn2["c9"]) > float(turn1["c9"])  # the second turn re-sends the first: more input tokens
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_live_charts_render_the_runs_series_in_headless_chromium(tmp_path, emulator_factory, sidecar_factory):
    import shutil

    import pytest

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install chromium (.ci/run does)")
        pytest.skip("chromium is not installed (CI installs it)")
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.003")
    side = sidecar_factory("--vllm-url", emu.url, "--interval", "250ms", "--out", str(tmp_path / "series.jsonl"))
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles/chat.py"), "--host", emu.url,
                             "--web-host", "127.0.0.1", "--web-port", str(port), "--autostart", "-u", "2", "-r", "2",
                             "-t", "30s", "--autoquit", "5", "--output-tokens", "16", "--sidecar-url", side.url,
                             "--run-dir", str(tmp_path / "run")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"

    def series() -> dict | None:
        try:
            data = json.loads(get(base + "/vllm-load/live.json")[1])
        except OSError:
            return None
        ids = {c["id"] for c in data["charts"]}
        return data if {"latency", "throughput", "server-requests", "server-kv"} <= ids else None

    try:
        wait_for(series, timeout=180, what="client and server series in /vllm-load/live.json", poll=0.5)
        out = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                              "--disable-background-networking", "--disable-component-update", "--disable-sync",
                              f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=4000", "--dump-dom",
                              base + "/vllm-load/live"], capture_output=True, text=True, timeout=90)
        dom = out.stdout
        assert 'data-refreshed="1"' in dom, out.stderr[-2000:]
        import re

        points = dict(re.findall(r'id="chart-([\w-]+)"[^>]*data-points="(\d+)"', dom))
        painted = dict(re.findall(r'id="chart-([\w-]+)"[^>]*data-painted="(\d+)"', dom))
        for chart in ("latency", "throughput", "server-requests", "server-kv"):  # drawn by uPlot, with data
            assert int(points[chart]) > 0 and int(painted[chart]) > 500, (chart, points, painted)
        assert dom.count('class="uplot') >= 4 and "TTFT p99 (ms)" in dom  # a legend with units
        rows = json.loads(get(base + "/stats/requests")[1])["extended_stats"][0]["data"]
        assert any(r["mean"] == "/vllm-load/live" for r in rows)  # the LLM tab links the page
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _chromium(tmp_path, url: str, budget_ms: int = 6000) -> str:
    import shutil

    import pytest

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install chromium (.ci/run does)")
        pytest.skip("chromium is not installed (CI installs it)")
    out = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                          "--disable-background-networking", "--disable-component-update", "--disable-sync",
                          f"--user-data-dir={tmp_path / 'profile'}", f"--virtual-time-budget={budget_ms}",
                          "--dump-dom", url], capture_output=True, text=True, timeout=90)
    return out.stdout


def _ui(tmp_path, *args: str, pipe: bool = False) -> tuple[subprocess.Popen, str]:
    """Locust's web UI on chat.py. Its output goes to ``locust.out`` in the test's folder (``pipe``: to the test,
    which then reads it as it goes): a pipe nobody reads stops a process that prints for long (Locust's table every
    2 s) once its 64 KiB are full."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.PIPE if pipe else open(tmp_path / "locust.out", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles/chat.py"),
                             "--web-host", "127.0.0.1", "--web-port", str(port), "--output-tokens", "8",
                             "--run-dir", str(tmp_path / "run"), *args],
                            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    if not pipe:
        out.close()
    return proc, f"http://127.0.0.1:{port}"


def _up(proc: subprocess.Popen, tmp_path, cond, what: str, timeout: float = 180):
    """``wait_for`` while the UI's process lives: if it ends first, its output says why (a port another test took
    between free_port and the bind, a start-up error), not a timeout minutes later."""
    def check():
        if proc.poll() is not None:
            out = tmp_path / "locust.out"
            raise AssertionError(f"Locust exited ({proc.returncode}) before {what}: "
                                 f"{out.read_text()[-3000:] if out.exists() else ''}")
        return cond()

    try:
        return wait_for(check, timeout=timeout, what=what, poll=0.2)
    except AssertionError as e:
        out = tmp_path / "locust.out"
        raise AssertionError(f"{e}\n{out.read_text()[-3000:] if out.exists() else ''}") from None


def _target_row(base: str) -> dict | None:
    try:
        rows = json.loads(get(base + "/stats/requests")[1])["extended_stats"][0]["data"]
    except OSError:
        return None
    return rows[0] if rows and rows[0]["metric"] == "Target" else None


def test_the_llm_tab_names_the_emulator_in_a_browser(tmp_path):
    """No --host: the LLM tab's first row says the target is the built-in EMULATOR (rendered by the UI's own
    code in headless Chromium, the tab opened by its ?tab= link)."""
    proc, base = _ui(tmp_path, "--autostart", "-u", "1", "-r", "1", "-t", "120s", "--autoquit", "5")
    try:
        row = _up(proc, tmp_path, lambda: _target_row(base), "the web UI with its target")
        assert row["count"] == "EMULATOR (of vLLM 0.32.0)" and "not a real vLLM" in row["mean"]
        wait_for(lambda: "TTFT (ms)" in get(base + "/stats/requests")[1], timeout=180, what="the run's first rows")
        import re

        doms: list[str] = []

        def rendered() -> str | None:  # the page as the UI's code drew it (once its first poll of the stats is in)
            dom = _chromium(tmp_path, base + "/?tab=llm", budget_ms=8000)
            doms.append(dom)
            shown = " ".join(re.sub(r"<[^>]+>", " ", re.sub(r"<script.*?</script>", "", dom, flags=re.S)).split())
            return shown if "TTFT (ms)" in shown else None

        shown = wait_for(rendered, timeout=90, what="the LLM tab drawn in Chromium", poll=1.0)
        assert "EMULATOR" in shown and "the built-in emulator: results describe it" in shown, shown[:1500]
        # the header area, on every tab: the target's kind beside Locust's host
        header = re.search(r"<div id=\"vllm-load-target\"[^>]*>(.*?)</div>", doms[-1], flags=re.S)
        assert header is not None, doms[-1][-2000:]
        assert re.sub(r"<[^>]+>", "", header.group(1)).startswith("Target: EMULATOR (of vLLM 0.32.0) · model "), \
            header.group(1)
        assert "href=\"./vllm-load/live\"" in header.group(1)  # the live charts, one click from any tab
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_swarm_to_a_dead_host_is_refused_where_it_was_started(tmp_path):
    """The reason comes back in /swarm's answer, which the UI shows beside its start button; nothing starts."""
    proc, base = _ui(tmp_path)
    try:
        _up(proc, tmp_path, lambda: _target_row(base), "the web UI with its target")
        dead = f"http://127.0.0.1:{free_port()}"
        form = urllib.parse.urlencode({"user_count": 1, "spawn_rate": 1, "host": dead}).encode()
        with urllib.request.urlopen(urllib.request.Request(base + "/swarm", data=form), timeout=60) as r:
            answer = json.loads(r.read())
        assert answer["success"] is False and dead in answer["message"], answer
        assert json.loads(get(base + "/stats/requests")[1])["state"] == "ready"  # nothing started
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_after_the_run_stops_a_reloaded_llm_tab_shows_the_reports_numbers(tmp_path):
    """A run started from the web UI stops; the page reloaded then (headless Chromium, ?tab=llm) draws the run's
    judged table, row for row the numbers of the report's summary.json, not live numbers recomputed against a moving
    clock nor an empty table."""
    import re

    from vllm_load.report.console import table_rows

    proc, base = _ui(tmp_path, "--autostart", "-u", "2", "-r", "2", "-t", "5s")
    try:
        def stopped() -> bool:
            try:
                state = json.loads(get(base + "/stats/requests")[1]).get("state")
            except OSError:  # not listening yet
                return False
            return state == "stopped" and (tmp_path / "run" / "summary.json").exists()

        wait_for(stopped, timeout=120, what="the run's stop and its report")
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())["summary"]
        dom = _chromium(tmp_path, base + "/?tab=llm", budget_ms=8000)
        shown = " ".join(re.sub(r"<[^>]+>", " ", re.sub(r"<script.*?</script>", "", dom, flags=re.S)).split())
        rows = [r for r in table_rows(summary) if r["metric"].split(" (")[0] in ("TTFT", "E2E latency", "TPOT")]
        assert len(rows) == 3
        for row in rows:  # each row's cells, in the tab's column order, as the report has them
            cells = " ".join(str(row[k]) for k in ("metric", "count", "mean", "p50", "p90", "p95", "p99", "p99.9",
                                                    "max"))
            assert cells in shown, (cells, shown[:2000])
        assert "Run stopped: its judged numbers (as in the report)" in shown
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_tab_open_through_the_stop_turns_to_the_judged_numbers_and_links_the_pages(tmp_path, monkeypatch):
    """A run started from the UI, its LLM tab open in headless Chromium while it runs, ended by its -t: the open tab
    turns by itself to the run's judged table (Locust's UI stops polling as the run stops, its last poll mid-drain:
    the tab kept those numbers), row for row summary.json's; the live charts' and the report's paths are links."""
    from tests.browser import Browser
    from tests.helpers import UIHere
    from vllm_load.report.console import COLUMNS, table_rows

    import gevent

    from vllm_load.plugin.lifecycle import end_of_run

    # the run's end takes 3 s to write (a long run's report), longer than the UI's 2 s poll: its last poll sees the
    # run stopped before the judged numbers are in, and Locust's UI polls no more
    written = end_of_run.stopped
    monkeypatch.setattr(end_of_run, "stopped", lambda ctl: (gevent.sleep(3.0), written(ctl)))
    ui = UIHere(tmp_path, "--autostart", "-u", "2", "-r", "2", "-t", "6s")
    browser = Browser(tmp_path / "chromium")
    try:
        browser.goto(ui.base + "/?tab=llm", ready="document.body.innerText.includes('Output tok/s (live')")
        live = "document.querySelector(\"td a.vllm-load-cell[href='./vllm-load/live']\") !== null"
        wait_for(lambda: browser.eval(live), timeout=30, what="the live charts' cell made a link")
        assert not browser.eval("document.body.innerText.includes('Run stopped')")
        final = "document.body !== null && document.body.innerText.includes('Run stopped: its judged numbers')"

        def turned() -> bool:
            try:
                return browser.eval(final)
            except RuntimeError:  # the page is being replaced
                return False

        wait_for(turned, timeout=120, what="the open tab showing the judged numbers", poll=0.5)
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())["summary"]
        shown = " ".join(browser.eval("document.body.innerText").split())
        rows = [r for r in table_rows(summary) if r["metric"].split(" (")[0] in ("TTFT", "E2E latency")]
        for row in rows:
            cells = " ".join(str(row[k]) for k in ("metric", "count", "mean", *COLUMNS))
            assert cells in shown, (cells, shown[:2000])
        report = "document.querySelector(\"td a.vllm-load-cell[href='./vllm-load/report']\") !== null"
        wait_for(lambda: browser.eval(report), timeout=30, what="the report's cell made a link")
        status, page = get(ui.base + "/vllm-load/report")
        assert status == 200 and "<html" in page.lower()
    finally:
        browser.close()
        ui.close()


@pytest.mark.slow
@pytest.mark.quiet_cores  # the request rate with watchers against without: timing is the subject
def test_a_run_watched_by_two_tabs_and_a_poller_keeps_its_rate_and_stays_trusted(tmp_path):
    """Issue 56's measure: each poll of the UI once blocked the load 2.5-3.5 s (8 users: 9.72 req/s unwatched, 6.79
    watched by one tab, and untrustworthy). The same UI run, started from the form (8 users, 8 s), unwatched, then
    watched by two Chromium tabs open before it starts (the LLM tab and Locust's own) and a poller asking
    /stats/requests twice a second: its request rate within 5 % of the unwatched one, and trusted."""
    import gevent

    from tests.browser import Browser
    from tests.helpers import UIHere
    from tests.test_security import _form, request

    def run(name: str, browsers: list) -> dict:
        (tmp_path / name).mkdir()
        ui = UIHere(tmp_path / name)
        polls: list[float] = []

        def poll() -> None:
            while True:
                began = time.perf_counter()
                get(ui.base + "/stats/requests")
                polls.append(time.perf_counter() - began)
                gevent.sleep(0.5)

        poller = None
        try:
            for browser, tab in zip(browsers, ("/?tab=llm", "/")):
                browser.goto(ui.base + tab, ready="document.querySelector('header p') !== null")
            status, _h, body = request(ui.base + "/swarm", _form(user_count="8", spawn_rate="8", run_time="8s"),
                                       {"Origin": ui.base})
            assert status == 200 and json.loads(body)["success"], body
            poller = gevent.spawn(poll) if browsers else None
            summary = tmp_path / name / "run" / "summary.json"
            wait_for(summary.exists, timeout=120, what=f"the {name} run's summary")
        finally:
            if poller is not None:
                poller.kill()
            ui.close()
        out = json.loads(summary.read_text())["summary"]
        if browsers:
            assert len(polls) >= 10, polls  # the poller asked all along
            print(f"watched: {out['request_rate']:.2f} req/s; /stats/requests answered in "
                  f"{1000 * sorted(polls)[len(polls) // 2]:.1f} ms (median of {len(polls)}), max "
                  f"{1000 * max(polls):.1f}")
        else:
            print(f"unwatched: {out['request_rate']:.2f} req/s")
        return out

    unwatched = run("unwatched", [])
    browsers = [Browser(tmp_path / "chromium-1"), Browser(tmp_path / "chromium-2")]
    try:
        watched = run("watched", browsers)
    finally:
        for browser in browsers:
            browser.close()
    assert watched["request_rate"] >= 0.95 * unwatched["request_rate"], (watched["request_rate"],
                                                                          unwatched["request_rate"])
    trusted_or_host_named(watched["client"])


def test_each_run_the_web_ui_starts_writes_a_run_directory_of_its_own(tmp_path):
    """The UI's second run once appended 18 requests to the first's 14 and overwrote its report. Two runs started
    from one UI's form: the first in --run-dir, the second beside it under its run id, each whole."""
    from tests.helpers import UIHere
    from tests.test_security import _form, request
    from vllm_load.rundir.reqlog import read_log

    ui = UIHere(tmp_path)
    try:
        for n in (1, 2):
            status, _h, body = request(ui.base + "/swarm", _form(user_count="2", spawn_rate="2", run_time="2s"),
                                       {"Origin": ui.base})
            assert status == 200 and json.loads(body)["success"], body
            wait_for(lambda: ui.state() == "stopped" and len(list(tmp_path.glob("run*/summary.json"))) == n,
                     timeout=120, what=f"run {n}'s summary")
    finally:
        ui.close()
    dirs = sorted(d for d in tmp_path.iterdir() if d.name.startswith("run"))
    assert [d.name for d in dirs][0] == "run" and dirs[1].name.startswith("run-") and len(dirs) == 2, dirs
    for d in dirs:  # each its own: its summary counts its own log's requests
        summary = json.loads((d / "summary.json").read_text())["summary"]
        assert summary["requests"] == len(read_log(d / "requests.jsonl")) > 0 and (d / "report.html").exists()
    first = json.loads((dirs[0] / "config.json").read_text())["run_id"]
    assert dirs[1].name == f"run-{json.loads((dirs[1] / 'config.json').read_text())['run_id']}" != f"run-{first}"


@pytest.mark.parametrize("state", ["idle", "running"])
def test_the_target_badge_overlaps_no_header_label_at_1000_and_1400_px(tmp_path, state):
    """The badge sits in the header's free middle, between Locust's logo and its host/status block, whose width
    changes (a run adds Users and the edit/stop/reset buttons: a fixed width overlapped Host and Status then): idle
    and running, at 1,000 and 1,400 px wide (headless Chromium, screenshots in the test's folder), its box meets no
    other header element's; at 1,400 px it shows."""
    from tests.browser import Browser

    proc, base = _ui(tmp_path, *(("--autostart", "-u", "1", "-r", "1", "-t", "120s") if state == "running" else ()))
    browser = Browser(tmp_path / "chromium")
    try:
        for width in (1000, 1400):
            browser.set_width(width)
            ready = "document.querySelector('header p') !== null"
            if state == "running":  # the run's own buttons are in the header
                ready += " && [...document.querySelectorAll('header button')].some(b => b.textContent === 'Stop')"
            browser.goto(base + "/", ready=f"document.getElementById('vllm-load-target') !== null && {ready}")
            browser.eval("new Promise(r => setTimeout(r, 700))")  # the badge's fit runs every 300 ms
            boxes = json.loads(browser.eval("""(() => {
                const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.right, r.top, r.bottom]; };
                const badge = document.getElementById('vllm-load-target');
                const others = [...document.querySelectorAll('header *')].filter(e => !badge.contains(e)
                    && (e.children.length === 0 && e.textContent.trim() || e.tagName === 'svg'))
                    .map(e => [e.tagName + ' ' + e.textContent.trim().slice(0, 20), box(e)])
                    .filter(([, b]) => b[1] > b[0]);
                const links = [...badge.querySelectorAll('a')].map(box);
                return JSON.stringify({badge: box(badge), others, links,
                                       shown: getComputedStyle(badge).display !== 'none'}); })()"""))
            browser.screenshot(tmp_path / f"header-{state}-{width}.png")
            left, right, top, bottom = boxes["badge"]
            assert right <= width, boxes["badge"]
            if width == 1400:
                assert right - left > 100, boxes["badge"]  # shown, wide enough to read
            if boxes["shown"]:  # its links never elide: both whole inside it wherever it shows
                assert len(boxes["links"]) == 2 and all(a[1] <= right + 0.5 and a[1] > a[0]
                                                        for a in boxes["links"]), boxes
            assert [name for name, (l, r, t, b) in boxes["others"]  # noqa: E741
                    if l < right and left < r and t < bottom and top < b] == [], boxes
            assert len(boxes["others"]) >= 5  # the logo, Host, Status, RPS, Failures: the check saw the header
    finally:
        browser.close()
        proc.terminate()
        proc.wait(timeout=30)


def test_the_web_uis_address_is_said_when_its_port_accepts_connections(tmp_path):
    """Locust says "Starting web interface at ..." before its init (the tokenizer, the embedded emulator: ~20 s on a
    busy host); vllm-load drops that line and says the address once the port answers: the page loads at once."""
    proc, base = _ui(tmp_path, pipe=True)
    try:
        seen: list[str] = []
        while True:  # the process's own lines, up to the announcement
            line = proc.stdout.readline().decode()
            assert line, "".join(seen)[-3000:]  # the process ended without saying it
            seen.append(line)
            if "vllm-load: the web UI is ready at" in line:
                break
        assert line.strip().endswith(base), line
        status, page = get(base + "/")  # no retry: it listens
        assert status == 200 and "<html" in page.lower()
        assert not any("Starting web interface" in x for x in seen), "".join(seen)[-3000:]
        assert any("started the built-in vLLM EMULATOR" in x for x in seen)  # said after the slow start-up
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_charts_tab_shows_the_llm_charts_under_locusts_own(tmp_path):
    """Locust's Charts tab, in headless Chromium during a run: below Locust's charts, the LLM charts (the live page,
    framed by the UI's own origin) draw the run's series; another tab drops them."""
    from tests.browser import Browser

    proc, base = _ui(tmp_path, "--autostart", "-u", "2", "-r", "2", "-t", "120s")
    browser = Browser(tmp_path / "chromium")
    try:
        browser.set_width(1400)
        browser.goto(base + "/?tab=charts", ready="document.querySelector('main canvas') !== null", timeout=90)
        frame = "document.querySelector('#vllm-load-charts iframe')"
        wait_for(lambda: browser.eval(f"!!({frame} && {frame}.contentDocument && "
                                      f"{frame}.contentDocument.querySelectorAll('#timeline-charts canvas').length)"),
                 timeout=60, what="the LLM charts drawn in the Charts tab", poll=0.5)
        below = browser.eval("(() => { const c = [...document.querySelectorAll('main canvas')]"
                             ".filter(x => !x.closest('#vllm-load-charts')); const f = document.getElementById("
                             "'vllm-load-charts'); return f.getBoundingClientRect().top >= "
                             "c[c.length - 1].getBoundingClientRect().bottom; })()")
        assert below, "the LLM charts come after Locust's own"
        browser.screenshot(tmp_path / "charts-tab.png")
        browser.eval("[...document.querySelectorAll('[role=tab]')].find(t => t.textContent === 'Statistics').click()")
        wait_for(lambda: browser.eval("document.getElementById('vllm-load-charts') === null"), timeout=10,
                 what="the LLM charts gone with the Charts tab", poll=0.2)
    finally:
        browser.close()
        proc.terminate()
        proc.wait(timeout=30)


def test_the_start_form_is_grouped_as_the_command_line_with_short_labels(tmp_path):
    """The web UI's start form (headless Chromium, its Custom parameters opened as a person would): the options
    chat.py reads, under the groups of `vllm-load options` with what a first run needs first, each labelled by its
    flag's words with its whole help on hover; sweep.py's own options are not offered. Screenshot in the test's
    folder."""
    from tests.browser import Browser
    from vllm_load.options import OPTIONS
    from vllm_load.plugin.webui import web_form
    from vllm_load.plugin.load.users import ChatUser

    want = web_form.fields([ChatUser])
    proc, base = _ui(tmp_path)
    browser = Browser(tmp_path / "chromium")
    try:
        browser.set_width(1200, 2400)
        browser.goto(base + "/", ready="document.querySelector('.vllm-load-group') !== null")
        browser.eval("""(() => { const s = [...document.querySelectorAll('*')].find(e => e.children.length === 0
            && e.textContent.trim() === 'Custom parameters'); s.click(); })()""")
        seen = json.loads(browser.eval("""new Promise(done => { const look = () => {
            const fields = [...document.querySelectorAll('[data-vllm-load-field]')];
            // opened: the accordion's transition has ended with the fields in it
            if (!fields.length || !fields[0].closest('.MuiCollapse-entered')) return setTimeout(look, 100);
            const top = e => e.getBoundingClientRect().top;
            const items = [...fields.map(f => ({top: top(f), name: f.dataset.vllmLoadField, title: f.title,
                                               label: (f.querySelector('.MuiFormControlLabel-label')
                                                       || f.querySelector('label')).textContent.replace('*', '').trim()})),
                           ...[...document.querySelectorAll('.vllm-load-group')].map(h => ({top: top(h), head: h.textContent}))];
            items.sort((a, b) => a.top - b.top);
            done(JSON.stringify(items)); }; look(); })"""))
        browser.screenshot(tmp_path / "start-form.png")
        # the form still starts a run with what was typed in a regrouped field
        browser.eval("(() => { const i = document.querySelector('input[name=inputTokens]'); i.focus(); i.select(); })()")
        browser.call("Input.insertText", text="96")
        browser.eval("[...document.querySelectorAll('button')].find(b => b.textContent.trim() === 'Start').click()")
        config = tmp_path / "run" / "config.json"
        wait_for(lambda: config.exists(), timeout=180, what="the run started from the form")
        assert json.loads(config.read_text())["options"]["input_tokens"] == "96"
    finally:
        browser.close()
        proc.terminate()
        proc.wait(timeout=30)
    fields = [i for i in seen if "name" in i]
    by_dest = {o.dest: o for o in OPTIONS}
    # every option chat.py reads that the form offers, in the command line's order, each once
    assert [f["name"] for f in fields] == sorted((d for d in want if d in {f["name"] for f in fields}),
                                                 key=lambda d: want[d]["order"])
    assert {f["name"] for f in fields} == set(want)  # selects (their labels name them) and checkboxes too
    assert not {"sweep", "step_duration", "turns", "sessions"} & {f["name"] for f in fields}  # other locustfiles'
    heads = [i["head"] for i in seen if "head" in i]
    assert heads[:3] == ["first run", "target", "workload"] and len(heads) == len(set(heads)) >= 8
    assert [i.get("name") for i in seen[:3]] == [None, "input_tokens", "output_tokens"]
    for dest, text in (("input_tokens", "input tokens"), ("server_kind", "server kind"), ("insecure", "insecure")):
        field = next(f for f in fields if f["name"] == dest)
        assert field["label"] == text and field["title"] == by_dest[dest].help


def test_the_form_offers_the_options_a_locustfile_reads_each_once_first_run_first():
    from vllm_load.options import GROUPS
    from vllm_load.plugin.webui import web_form
    from vllm_load.plugin.lifecycle.shapes import SweepShape
    from vllm_load.plugin.load.users import ChatUser

    chat, sweep = web_form.fields([ChatUser]), web_form.fields([ChatUser, SweepShape])
    assert "sweep" in sweep and "sweep" not in chat and "images_per_request" in chat
    orders = [m["order"] for m in chat.values()]
    assert len(orders) == len(set(orders))
    first = sorted(chat, key=lambda d: chat[d]["order"])[:len(web_form.FIRST_RUN)]
    assert [chat[d]["group"] for d in first] == ["first run"] * len(first)
    assert {m["group"] for m in chat.values()} <= {"first run", *GROUPS}
    assert sum(m["head"] for m in chat.values()) == len({m["group"] for m in chat.values()})
    extra = {"input_tokens": {}, "sweep": {}, "turns": {}}
    web_form.keep_used(extra, [ChatUser])
    assert set(extra) == {"input_tokens"}


def test_the_user_class_editor_sets_what_it_shows_and_nothing_else(tmp_path):
    """Locust's ``/user`` (the class picker's editor) set any attribute a POST named on the user class, as given:
    ``wait_time="boom"`` gave three tracebacks and a run of 0 requests. The gate lets through what Locust's editor
    sends, each of its type and in range, for a class the run offers, and refuses the rest in one line."""
    from vllm_load.plugin.webui.web_gate import screen_user

    classes = {"ChatUser": object}
    assert screen_user(b'{"user_class_name": "ChatUser", "weight": 3, "fixed_count": 0, "tasks": ["chat"], '
                       b'"host": "http://127.0.0.1:8000"}', classes) is None
    assert screen_user(b'{"user_class_name": "ChatUser", "wait_time": "boom"}', classes) == (
        "a user class edit sets user_class_name, host, weight, fixed_count, tasks only, not 'wait_time'")
    assert screen_user(b'{"user_class_name": "ChatUser", "weight": "3"}', classes) == (
        "a user class edit's weight is a int, not str")
    assert screen_user(b'{"user_class_name": "ChatUser", "weight": true}', classes).endswith("not bool")
    assert screen_user(b'{"user_class_name": "ChatUser", "fixed_count": 10000000}', classes).endswith(
        "out of range: 0 to 1,000,000")
    assert screen_user(b'{"user_class_name": "Other"}', classes).startswith("no user class 'Other' in this run")
    assert screen_user(b'{"user_class_name": "ChatUser", "host": "127.0.0.1"}', classes).startswith("--host")
    assert screen_user(b"[1]", classes).startswith("a user class edit is a JSON object")
    assert screen_user(b"{", classes).startswith("a user class edit is a JSON object")
    # and in the running UI: refused before Locust sets anything, a right edit applied
    proc, base = _ui(tmp_path, "--class-picker")
    try:
        _up(proc, tmp_path, lambda: _target_row(base), "the web UI with its target")

        def post(body: dict) -> tuple[int, bytes]:
            req = urllib.request.Request(base + "/user", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    return r.status, r.read()
            except urllib.error.HTTPError as e:
                return e.code, e.read()

        status, body = post({"user_class_name": "ChatUser", "wait_time": "boom"})
        assert status == 400 and b"not 'wait_time'" in body, (status, body)
        assert post({"user_class_name": "ChatUser", "weight": 2, "fixed_count": 0})[0] == 201
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "Traceback" not in (tmp_path / "locust.out").read_text()
