"""The report from a fixture run directory: files, content, sweep, and a real render in headless Chromium."""

import html
import json
import os
import re
import shutil
import subprocess

import pytest

from tests.browser import INKED_JS, probe_page

from vllm_load.cli import main as cli_main
from vllm_load.client.record import RequestRecord
from vllm_load.report.html import build
from vllm_load.metrics.stats import LLMStats

SECRET = "sk-fixture-secret-0123456789"


def make_run_dir(path, users=4, emulator=True, with_server=True, slo=("ttft.p99<=500ms",), base_ttft=0.05,
                 ttfts=None):
    """A run directory of 60 requests whose TTFT steps 1 ms at a time from ``base_ttft`` (or one per ``ttfts``)."""
    stats = LLMStats()
    t0 = 1_800_000_000.0
    for i, ttft in enumerate(ttfts if ttfts is not None else [base_ttft + 0.001 * (i % 10) for i in range(60)]):
        offs = [ttft + 0.01 * k for k in range(20)]
        stats.add(RequestRecord(api="chat", start=t0 + i * 0.5, e2e=offs[-1], ok=True, ttft=ttft, chunk_offsets=offs,
                                chunk_tokens=[1] * 20, output_tokens=20, input_tokens=128, input_tokens_asked=128,
                                tokens_from_usage=True))
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({
        "run_id": path.name, "host": "http://127.0.0.1:1", "target_is_emulator": emulator, "model": "m",
        "options": {"api_key": "***", "num_users": users, "slo": list(slo)}}))
    (path / "llm_stats.json").write_text(json.dumps({
        "run_id": path.name, "start": t0, "end": t0 + 31, "summary": stats.summary(duration=31.0).to_json(),
        "stats": stats.to_wire()}))
    if with_server:
        lines = [{"t": t0 + s, "running": min(s, 4), "waiting": 0, "kv_cache_usage": 0.01 * s, "preemptions_total": 0,
                  "prompt_tokens_rate": 500.0, "generation_tokens_rate": 80.0, "prefix_cache_queries_total": 100.0 * s,
                  "prefix_cache_hits_total": 0.0} for s in range(30)]
        (path / "server.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def make_pages(tmp_path) -> list:
    """A sweep of three runs (2, 4, 8 users; 2 and 4 meet ttft.p99<=500ms) into sweep/, compare of its first and
    last into cmp/, and a tune of two configurations into tune/, as the commands write them; the sweep's runs."""
    from vllm_load.tune.probe import Probe
    from vllm_load.tune.report import write as write_tune

    runs = [make_run_dir(tmp_path / f"l{u}", users=u, base_ttft=0.1 * u) for u in (2, 4, 8)]
    assert cli_main(["report", *map(str, runs), "--slo", "ttft.p99<=500ms", "--out", str(tmp_path / "sweep")]) == 3
    assert cli_main(["compare", str(runs[0]), str(runs[2]), "--out", str(tmp_path / "cmp")]) == 0

    def tune_probe(level: float, passed: bool) -> dict:
        return Probe(level, passed, 0 if passed else 3, "run", request_rate=level / 2, output_token_rate=level * 10,
                     goodput=level / 2, ttft_p99=0.01 * level, tps_per_user=40.0 - level).to_json()
    (tmp_path / "tune").mkdir()
    write_tune(tmp_path / "tune", [{"params": {"max_num_seqs": str(k)}, "status": "ok", "reason": "", "capacity": k,
                                    "goodput": k / 2, "probes": [tune_probe(k, True), tune_probe(2 * k, False)]}
                                   for k in (4, 8)], "concurrency", ["ttft.p99<=1s"])
    return runs


def test_report_files_and_content(tmp_path):
    run = make_run_dir(tmp_path / "run-a")
    built = build(run, ["ttft.p99<=500ms", "server.prefix_cache_hit_rate<=0%", "server.kv_cache_usage.max<=10%"])
    code, html_path, checks = built.verdict.exit_code, built.report, built.verdict.checks
    assert code == 3  # KV usage reached 29%
    assert [c.passed for c in checks] == [True, True, False]
    page = html_path.read_text()
    charts = json.loads(re.search(r'<script type="application/json" id="chart-data">(.*?)</script>', page, re.S)[1])
    assert [c["id"] for c in charts["timeline"]] == ["latency", "throughput", "server-requests", "server-kv",
                                                     "server-tokens", "server-prefix"]
    assert [c["id"] for c in charts["distributions"]] == ["dist-ttft", "dist-itl", "dist-tpot", "dist-e2e"]
    ttft = charts["distributions"][0]["series"][0]["values"]
    assert ttft[0] == pytest.approx(50.0, abs=0.1) and ttft[-1] == pytest.approx(59.0, abs=0.1)  # p0 .. p99.9, ms
    # every chunk carried one token: ITL per chunk and per token are one row, and one line, and it is said
    assert len(charts["distributions"][1]["series"]) == 1 and "id='itl-note'" in page
    assert page.index("id='verdict-block'") < page.index("id='client-side'") < page.index("id='server-side'")
    assert "id='emulator-banner'" in page and "id='verdict'>FAIL" in page
    assert "server-missing" not in page
    summary = json.loads((run / "summary.json").read_text())
    assert summary["server"]["prefix_cache_hit_rate"] == 0.0 and summary["verdict"] == "fail"
    assert "| `ttft.p99<=500ms` | PASS |" in (run / "summary.md").read_text()
    assert "server side (sidecar): KV-cache usage max 29.0%" in (run / "summary.md").read_text()
    assert "id='server-side'" in page and "<td>KV-cache usage max</td><td>29.0%</td>" in page
    assert SECRET not in page


def test_report_says_when_the_server_side_is_missing(tmp_path):
    run = make_run_dir(tmp_path / "run-b", emulator=False, with_server=False)
    built = build(run)  # the run's own SLOs, from config.json
    code, html_path, checks = built.verdict.exit_code, built.report, built.verdict.checks
    assert code == 0 and [c.slo for c in checks] == ["ttft.p99<=500ms"]
    page = html_path.read_text()
    assert "server-missing" in page and "emulator-banner" not in page


def test_cli_sweep_and_bad_dir(tmp_path, capsys):
    runs = [make_run_dir(tmp_path / f"u{u}", users=u, slo=(f"request_rate>={5 - u / 4}",)) for u in (8, 2, 4)]
    # every fixture run has 60 requests in 31 s (1.94 req/s): u2 needs >= 4.5, u4 >= 4, u8 >= 3 -> all fail
    assert cli_main(["report", *map(str, runs), "--out", str(tmp_path / "sweep")]) == 3
    md = (tmp_path / "sweep" / "sweep.md").read_text().splitlines()
    assert md[0] == "**No run met every SLO**"
    head = next(i for i, line in enumerate(md) if line.startswith("| run |"))  # after the best and the curves' lines
    rows = md[head + 2:head + 5]  # the table's rows (its figures follow it)
    assert [row.split("|")[2].strip() for row in rows] == ["2", "4", "8"] and not md[head + 5].startswith("|")
    # latency grows with concurrency (TTFT 0.1 s per user): judged by one SLO, 2 and 4 pass, 8 misses
    levels = [make_run_dir(tmp_path / f"l{u}", users=u, base_ttft=0.1 * u) for u in (2, 4, 8)]
    assert cli_main(["report", *map(str, levels), "--slo", "ttft.p99<=500ms", "--out", str(tmp_path / "sweep2")]) == 3
    md2 = (tmp_path / "sweep2" / "sweep.md").read_text().splitlines()
    assert md2[0] == "**Largest concurrency meeting every SLO: 4**"
    head = next(i for i, line in enumerate(md2) if line.startswith("| run |"))
    rows2 = md2[head + 2:head + 5]
    assert [row.split("|")[-3].strip() for row in rows2] == ["PASS", "PASS", "FAIL"]
    assert [row.split("|")[-2].strip() for row in rows2] == ["trusted"] * 3  # each step's own trust
    assert cli_main(["report", str(tmp_path / "nope")]) == 2
    assert "is not a complete run directory" in capsys.readouterr().err


def test_report_and_compare_on_a_read_only_run_directory_are_one_line(tmp_path, capsys, monkeypatch):
    """A run directory on a read-only mount: `report` exited 1 with two tracebacks (summary.json.tmp), `compare`
    with one. Each is now one line naming the file and what to do, exit 6 (files not written), as a run's."""
    import errno
    from pathlib import Path

    a, b = make_run_dir(tmp_path / "a"), make_run_dir(tmp_path / "ro" / "b")
    write_text = Path.write_text

    def read_only(self, *args, **kw):  # the mount's refusal, for every file under ro/
        if str(self).startswith(str(tmp_path / "ro")):
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return write_text(self, *args, **kw)

    monkeypatch.setattr(Path, "write_text", read_only)
    assert cli_main(["report", str(b)]) == 6
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"vllm-load: error: cannot write the report {b}/"), err
    assert "Read-only file system: copy the run directory somewhere writable" in err[0]
    assert cli_main(["compare", str(a), str(b)]) == 6
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Read-only file system: give --out DIR somewhere writable" in err[0], err
    assert cli_main(["compare", str(a), str(b), "--out", str(tmp_path / "elsewhere")]) == 0
    assert (tmp_path / "elsewhere" / "compare.html").exists()


def chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_report_renders_its_verdict_and_interactive_charts_in_headless_chromium(tmp_path):
    """The page as a browser draws it: the verdict block on the first screen, above the client and server
    sections; every chart drawn by uPlot with its axis labels and legend (offline: nothing is fetched); a
    screenshot of the first screen is taken as a person would see it."""
    browser = chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install chromium (.ci/run does)")
        pytest.skip("chromium is not installed (CI installs it)")
    run = make_run_dir(tmp_path / "run-c")
    html_path = build(run, ["ttft.p99<=500ms", "server.kv_cache_usage.max<=10%"]).report
    probe = tmp_path / "probe.html"
    script = ("<script>window.addEventListener('load',()=>{const b=document.body,top=id=>Math.round("
              "document.getElementById(id).getBoundingClientRect().top);"
              "b.setAttribute('data-verdict-top',top('verdict-block'));b.setAttribute('data-client-top',top('client-side'));"
              "b.setAttribute('data-server-top',top('server-side'));"
              "b.setAttribute('data-canvases',document.querySelectorAll('.uplot canvas').length);"
              "b.setAttribute('data-axis-labels',window.vllmLoadCharts.map(p=>p.axes.map(a=>a.label).join('/')).join('|'));"
              "b.setAttribute('data-x-ranges',window.vllmLoadCharts.filter(p=>p.cursor.sync&&p.cursor.sync.key)"
              ".map(p=>p.scales.x.min+'/'+p.scales.x.max).join('|'));"
              "b.setAttribute('data-inked',[...document.querySelectorAll('.uplot canvas')].filter(c=>{"
              "const d=c.getContext('2d').getImageData(0,0,c.width,c.height).data;let n=0;"
              "for(let i=3;i<d.length;i+=4)if(d[i])n++;return n>1000}).length);"
              "b.setAttribute('data-legend',[...document.querySelectorAll('.u-legend .u-label')].map(e=>e.textContent).join('|'))})"
              "</script></body>")
    probe.write_text(html_path.read_text().replace("</body>", script))
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,900"]
    out = subprocess.run([*flags, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=90)
    dom = out.stdout
    attr = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', dom.split("<body", 1)[1].split(">", 1)[0]))
    assert attr, out.stderr[-2000:]
    assert int(attr["verdict-top"]) < 900 and int(attr["verdict-top"]) < int(attr["client-top"]) < int(attr["server-top"])
    assert 'id="timeline-charts" data-drawn="6"' in dom and 'id="distributions-charts" data-drawn="4"' in dom
    assert int(attr["canvases"]) == 10 and int(attr["inked"]) == 10  # ten charts, each with lines and axes drawn
    labels = attr["axis-labels"].split("|")
    assert labels.count("seconds since the run started/ms") == 1 and labels.count("percentile/ms") == 4, labels
    assert "seconds since the run started/%" in labels  # KV-cache usage and the prefix-cache hit rate
    assert "TTFT p99 (ms)" in attr["legend"] and "KV-cache usage %" in attr["legend"]
    # every timeline chart spans the run's time, whatever its series hold (latency's 10 s windows 5-25 s, the
    # throughput 0-29 s, the prefix-cache rate 1-29 s: each drew its own axis)
    assert attr["x-ranges"].split("|") == ["0/29"] * 6, attr["x-ranges"]
    assert ">FAIL</span>" in dom and "Exit code <b>3</b>" in dom
    shot = tmp_path / "first-screen.png"
    subprocess.run([*flags, f"--screenshot={shot}", html_path.as_uri()], capture_output=True, timeout=90)
    assert shot.exists() and shot.stat().st_size > 20_000  # a drawn page, not a blank one


def test_compare_flags_a_real_change_and_not_noise(tmp_path, capsys):
    from vllm_load.cli import main as cli_main
    from vllm_load.report.compare import compare
    from vllm_load.rundir.files import load_run

    a = make_run_dir(tmp_path / "a", base_ttft=0.05)
    same = make_run_dir(tmp_path / "same", base_ttft=0.05)
    slower = make_run_dir(tmp_path / "slower", base_ttft=0.08, slo=("ttft.p99<=70ms",))
    build(a)
    build(slower)
    c = compare(load_run(a), load_run(same))
    assert c["metrics"] and not any(r["significant"] for r in c["metrics"])
    c = compare(load_run(a), load_run(slower))
    ttft = {r["stat"]: r for r in c["metrics"] if r["metric"] == "ttft"}
    assert ttft["p50"]["significant"] and ttft["p50"]["delta"] == pytest.approx(30.0, abs=0.2)  # ms
    assert not any(r["significant"] for r in c["metrics"] if r["metric"] in ("itl", "itl_token"))  # gaps unchanged
    assert cli_main(["compare", str(a), str(slower), "--out", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    assert "changed: TTFT p50" in out and "ITL" not in out.split("changed:", 1)[1].split("\n")[0]
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| TTFT (ms) | p50 |" in md and "**changed**" in md
    page = (tmp_path / "cmp" / "compare.html").read_text()
    charts = json.loads(re.search(r'<script type="application/json" id="chart-data">(.*?)</script>', page, re.S)[1])
    assert [c["id"] for c in charts["distributions"]] == ["ab-ttft", "ab-itl", "ab-tpot", "ab-e2e"]
    assert "id='metrics'" in page
    assert cli_main(["compare", str(a), str(tmp_path / "missing")]) == 2


def test_compare_says_how_the_runs_differ_before_any_metric(tmp_path, capsys):
    """Two runs of 8 and 4 users, one against the emulator: that is said first, so a moved request rate is read
    with its cause; equal setups say nothing of the kind."""
    from vllm_load.cli import main as cli_main
    from vllm_load.report.compare import compare
    from vllm_load.rundir.files import load_run

    a = make_run_dir(tmp_path / "a", users=8)
    b = make_run_dir(tmp_path / "b", users=4, emulator=False)
    same = make_run_dir(tmp_path / "same", users=8)
    config = json.loads((b / "config.json").read_text())
    (b / "config.json").write_text(json.dumps({**config, "server_version": "0.32.1"}))
    assert compare(load_run(a), load_run(same))["differs"] == []
    differs = {d["what"]: (d["a"], d["b"]) for d in compare(load_run(a), load_run(b))["differs"]}
    assert differs["users"] == (8, 4) and differs["target"][0] == "the embedded EMULATOR"
    assert "--num-users" not in differs  # said once, as users
    assert differs["server version"] == ("unknown", "0.32.1")
    assert "--api-key" not in differs  # secrets and run names are no setup
    assert cli_main(["compare", str(a), str(b), "--out", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out.splitlines()
    # the servers, the one-line conclusion and the throughput first, then how the runs differ, before any metric
    assert out[1].startswith("  A: ") and out[2].startswith("  B: ") and out[3].startswith("  conclusion: B served ")
    assert "the runs were set up differently" in out[3] and out[4].startswith("  throughput: ")
    assert out[5].startswith("  the runs differ in") and any("users: A 8  B 4" in line for line in out)
    assert "## The runs differ in" in (tmp_path / "cmp" / "compare.md").read_text()
    page = (tmp_path / "cmp" / "compare.html").read_text()
    assert "id='differs'" in page
    # the page leads with what the console leads with: the conclusion and the throughput, before the setup
    assert page.index("id='conclusion'") < page.index("id='throughput'") < page.index("id='differs'")
    assert all(line.strip() in html.unescape(page) for line in out[3:5])


def test_a_plan_is_read_back_as_it_was_kept_and_from_older_or_newer_runs():
    """config.json's plan is the RunPlan the run decided: equal after the round trip; a field a newer version
    added is left out, one an older run lacks takes its default."""
    from vllm_load.rundir.plan import RunPlan

    plan = RunPlan(run_id="r", salt="s", run_dir="d", host="http://a:1,http://b:1", model="m", tokenizer="t",
                   is_emulator=False, slos=("ttft.p99<=1s",), sidecar_url="", total_users=8, backoff_max=2.0,
                   outage_after=2.0, stop_on_outage=0.0, hosts=("http://a:1", "http://b:1"), ramp=("linear", 1.0, 4.0, 60.0))
    wire = json.loads(json.dumps(plan.to_wire()))
    assert RunPlan.from_wire(wire) == plan and RunPlan.from_wire(wire).urls == ("http://a:1", "http://b:1")
    newer = {**wire, "a_field_of_a_later_version": 1}
    older = {k: v for k, v in wire.items() if k not in ("hosts", "sweep_levels", "percentiles")}
    assert RunPlan.from_wire(newer) == plan
    assert RunPlan.from_wire(older).hosts == () and RunPlan.from_wire(older).urls == ("http://a:1,http://b:1",)


def test_compare_flags_a_metric_without_noise_only_beyond_its_stated_threshold(tmp_path, capsys):
    """Output tokens/s per request has no 10 s windows, so no noise estimate: +2 % is not a change at the default
    5 %, and is one at --threshold 1%; the output says which threshold judged it."""
    from vllm_load.report.compare import compare
    from vllm_load.rundir.files import load_run

    a, b = load_run(make_run_dir(tmp_path / "a")), load_run(make_run_dir(tmp_path / "b"))
    for stat in ("mean", "p50", "p90", "p99", "p99.9"):
        b.summary["metrics"]["output_tps"][stat] *= 1.02
    flagged = lambda c: [r["stat"] for r in c["metrics"] if r["metric"] == "output_tps" and r["significant"]]  # noqa: E731
    assert flagged(compare(a, b)) == []
    # the percentiles moved in the summary alone, their histograms the same: within their sampling intervals
    assert flagged(compare(a, b, threshold=0.01)) == ["mean"]
    assert cli_main(["compare", str(a.path), str(b.path), "--threshold", "1%", "--out", str(tmp_path / "c")]) == 0
    assert "beyond 1% (--threshold)" in (tmp_path / "c" / "compare.md").read_text()
    assert cli_main(["compare", str(a.path), str(b.path), "--threshold", "lots"]) == 2
    assert "--threshold 'lots' is not a share" in capsys.readouterr().err


def test_the_sweep_and_compare_pages_draw_their_charts_in_headless_chromium(tmp_path):
    """The other pages, as a browser draws them: the sweep's throughput and latency against the level and its
    Pareto front (a step function: uPlot's stepped path), compare's distributions A against B, and the tune's curves per configuration, each chart drawn (inked canvas)
    with its legend."""
    browser = chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install chromium (.ci/run does)")
        pytest.skip("chromium is not installed (CI installs it)")
    runs = make_pages(tmp_path)
    # the sweep's throughput: req/s on an axis of its own (on the tok/s axis, 0-250, its 2-5 lay flat at 0)
    scales = ("const t=window.vllmLoadCharts.find(u=>u.root.parentNode.id==='chart-sweep-throughput');"
              "b.setAttribute('data-scales',t?['y',t.scales.y.max,'y2',t.scales.y2?t.scales.y2.max:'none',"
              "t.axes.length].join(' '):'none');")
    for page, charts, legend in ((tmp_path / "sweep" / "sweep.html", 3, "Pareto front (tok/s per user)"),
                                 (tmp_path / "cmp" / "compare.html", 4, "B TTFT (ms)"),
                                 (tmp_path / "tune" / "tune.html", 3, "Pareto front (SLOs met) (tok/s per request)")):
        _dom, attr = probe_page(browser, page, INKED_JS + scales, tmp_path / "profile")
        assert int(attr.get("inked", 0)) == charts and legend in attr["legend"], (page.name, attr)
        if page.name == "sweep.html":
            _, y_max, _, y2_max, axes = attr["scales"].split()
            rates = [json.loads((r / "summary.json").read_text())["summary"] for r in runs]
            # each axis as tall as its own unit's largest value (and 5 % more), three axes drawn
            assert float(y_max) >= max(s["output_token_rate"] for s in rates) > 3 * float(y2_max), attr["scales"]
            assert float(y2_max) >= max(s["request_rate"] for s in rates) and axes == "3", attr["scales"]
            assert "req/s (req/s)" not in attr["legend"] and "req/s" in attr["legend"]
    assert "Largest concurrency meeting every SLO: 4" in (tmp_path / "sweep" / "sweep.html").read_text()


def test_compare_says_each_number_once_and_leaves_out_what_measures_nothing(tmp_path):
    """TTFO without reasoning is TTFT, the per-token ITL of one-token chunks the per-chunk one: their rows would
    repeat the same numbers; options that only change what a run prints (--only-summary) are no setup difference."""
    from vllm_load.report.compare import compare
    from vllm_load.rundir.files import load_run

    a = make_run_dir(tmp_path / "a", users=4)
    b = make_run_dir(tmp_path / "b", users=4, base_ttft=0.08)
    for run, value in ((a, False), (b, True)):
        config = json.loads((run / "config.json").read_text())
        config["options"].update(only_summary=value, otlp_receiver="" if value else None)
        (run / "config.json").write_text(json.dumps(config))
    c = compare(load_run(a), load_run(b))
    assert c["differs"] == []
    keys = {r["metric"] for r in c["metrics"]}
    summary = load_run(a).summary["metrics"]
    assert "ttft" in keys and ("ttfo" not in keys or summary.get("ttfo", {}).get("p99") != summary["ttft"]["p99"])
    assert summary["itl_token"]["p99"] == summary["itl"]["p99"]  # one token a chunk: the twins agree
    assert "itl" in keys and "itl_token" not in keys


def _sampled_run(path, seed, shift=0.0, n=40):
    """A run of ``n`` requests whose TTFT are drawn from one lognormal distribution (``shift`` seconds added)."""
    import random

    rng = random.Random(seed)
    return make_run_dir(path, with_server=False, slo=(),
                        ttfts=[0.05 * rng.lognormvariate(0.0, 0.4) + shift for _ in range(n)])


def test_compare_flags_a_percentile_only_beyond_its_own_sampling_interval(tmp_path):
    """Two runs of one distribution, 40 requests each: their TTFT p99s differ by over 5 % by chance (the issue's two
    identical runs were flagged "TTFT p99 -13.2 % changed") and are not flagged; a real 40 ms shift is."""
    from vllm_load.report.compare import compare, percentile_interval
    from vllm_load.rundir.files import load_run

    a, b = load_run(_sampled_run(tmp_path / "a", 1)), load_run(_sampled_run(tmp_path / "b", 2))
    c = compare(a, b)
    p99 = next(r for r in c["metrics"] if r["metric"] == "ttft" and r["stat"] == "p99")
    assert abs(p99["pct"]) > 5 and not p99["significant"], p99
    lo, hi = percentile_interval(a.stats.hists["ttft"], 99.0)
    assert lo < a.stats.hists["ttft"].percentile(99.0) <= hi
    shifted = load_run(_sampled_run(tmp_path / "shifted", 2, shift=0.04))
    moved = {r["stat"]: r for r in compare(a, shifted)["metrics"] if r["metric"] == "ttft"}
    assert moved["p50"]["significant"] and not moved["p99"]["significant"]  # 40 requests cannot place a p99
    many, more = (load_run(_sampled_run(tmp_path / name, seed, shift, n=400))
                  for name, seed, shift in (("many", 3, 0.0), ("more", 4, 0.04)))
    assert {r["stat"] for r in compare(many, more)["metrics"] if r["metric"] == "ttft" and r["significant"]} >= {
        "mean", "p50", "p90"}


def test_compare_says_option_values_as_a_person_reads_them(tmp_path):
    """compare printed Python values: ``--host: A None``, ``--headless: A True B False``."""
    from vllm_load.report.compare import compare, shown
    from vllm_load.rundir.files import load_run

    a, b = make_run_dir(tmp_path / "a", users=8), make_run_dir(tmp_path / "b", users=8)
    for run, extra in ((a, {"headless": True, "host": None, "header": []}),
                       (b, {"headless": False, "host": "http://h:8000", "header": ["X-A: 1", "X-B: 2"]})):
        config = json.loads((run / "config.json").read_text())
        (run / "config.json").write_text(json.dumps({**config, "options": {**config.get("options", {}), **extra}}))
    differs = {d["what"]: (d["a"], d["b"]) for d in compare(load_run(a), load_run(b))["differs"]}
    assert differs["--headless"] == ("on", "off") and differs["--host"] == ("not set", "http://h:8000")
    assert differs["--header"] == ("not set", "X-A: 1, X-B: 2")
    assert [shown(v) for v in (None, "", 0, 1.5, "x")] == ["not set", "not set", "0", "1.5", "x"]


def _distrust(run):
    data = json.loads((run / "llm_stats.json").read_text())
    data["summary"]["client"] = {"saturated": True, "reasons": ["the client's CPU at its limit"], "cause": "cpu",
                                 "advice": "add workers"}
    (run / "llm_stats.json").write_text(json.dumps(data))


def test_a_sweep_never_crowns_an_untrustworthy_step_and_says_each_steps_trust(tmp_path):
    """`--recipe max-goodput:90%` answered "concurrency 4" on an UNTRUSTWORTHY step of a run that exited 5, and
    neither page showed a step's trust."""
    from vllm_load.report.sweep import build_sweep

    steps = [make_run_dir(tmp_path / f"step-{u}", users=u) for u in (2, 4, 8)]
    _distrust(steps[2])
    for d in steps:
        build(d)
    page, best, _ = build_sweep(steps, tmp_path / "out", exit_code=5)
    assert best.startswith("Largest concurrency meeting every SLO: 4 (the step at concurrency 8 met them too but is "
                           "untrustworthy)")
    assert "<p id='exit-code'>The run&#39;s exit code: 5</p>" in page.read_text()
    html_text = page.read_text()
    assert "UNTRUSTWORTHY" in html_text and html_text.count(">trusted<") == 2
    assert "| trust |" in (tmp_path / "out" / "sweep.md").read_text()
    for d in steps[:2]:
        _distrust(d)
        build(d)
    _, best, _ = build_sweep(steps, tmp_path / "out2")
    assert best.startswith("No answer: the step at concurrency 8 (step-8) met every SLO but is untrustworthy")


def test_the_report_changes_no_summary_field_its_analyses_are_kept_once(tmp_path):
    """The analyses of the request logs (the time breakdown, routing, the prefill curve, …) are written into the
    run's summary once, at the run's end (``report/analyses.complete``); every rebuild renders that summary and
    writes it no more."""
    from tests.helpers import ROOT, run_in_process

    res = run_in_process(["-f", str(ROOT / "locustfiles" / "chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "2s",
                          "--slo", "ttft.p99<=500ms", "--no-history"], tmp_path)
    run = tmp_path / res.run_dir
    stats = run / "llm_stats.json"
    kept = json.loads(stats.read_text())
    assert kept["analysed"] == {"slos": ["ttft.p99<=500ms"]}
    assert kept["summary"]["timing"]["parts"]  # where each request's time went: analysed at the end, and kept
    before = stats.stat().st_mtime_ns
    again = build(run)
    assert stats.stat().st_mtime_ns == before and json.loads(stats.read_text()) == kept  # not written again
    assert json.loads(json.dumps(again.summary.to_json(), default=str)) == kept["summary"]  # judged what is kept
    build(run, ["ttft.p99<=400ms"])  # other SLOs: the disruption is judged by their limits, so analysed again
    assert json.loads(stats.read_text())["analysed"] == {"slos": ["ttft.p99<=400ms"]}


def test_the_report_and_summary_md_say_what_load_they_measured(tmp_path):
    """The report named its target twice and said no users, rate, lengths or duration: one Load line now, from what
    the run kept, in report.html and summary.md; the emulator's target said once (its banner)."""
    from vllm_load.report.load import load_line

    run = make_run_dir(tmp_path / "run")
    config = json.loads((run / "config.json").read_text())
    config["options"].update(input_tokens="256", output_tokens="32", run_time=30, request_rate=0.0)
    (run / "config.json").write_text(json.dumps(config))
    built = build(run, ["ttft.p99<=500ms"])
    want = "4 users, closed loop · input 256 output 32 tokens · asked -t 30 s, ran 31.0 s · 1 load process"
    page = built.report.read_text()
    assert f"<p class='load' id='load'><b>Load:</b> {want}</p>" in page
    assert page.count("Target:") == 1 and "id='emulator-banner'" in page  # the emulator named once
    assert f"Load: {want}" in (run / "summary.md").read_text()
    # open loop, a trace, a sweep, a count, an interrupted run: each said as it was asked
    s = {"duration_s": 12.04, "workers": ["w0", "w1", "w2"]}
    assert load_line({"num_users": 8, "request_rate": 4.0, "burstiness": 1.0, "input_tokens": "1000-2000",
                      "num_requests": 200}, s) == (
        "Load: 4 req/s open loop, Poisson arrivals, over 8 users · input 1000-2000 output 64 tokens · "
        "asked --num-requests 200, ran 12.0 s · 3 load processes")
    assert load_line({"trace": "t.jsonl", "trace_speed": 2.0}, {"duration_s": 5.0}).startswith(
        "Load: a trace replayed at its timestamps (x2) · lengths from the trace · ran 5.0 s")
    assert load_line({"num_users": 1, "burstiness": float("inf"), "request_rate": 2.0}, {}).startswith(
        "Load: 2 req/s open loop, constant arrivals")
    assert load_line({}, {}, {"sweep_kind": "users", "sweep_levels": [1, 2, 4]}).startswith(
        "Load: a sweep over users: 1, 2, 4")
    assert load_line({"num_users": 2, "run_time": 40}, {"duration_s": 9.9, "features": {
        "interrupted": {"by": "SIGINT"}}}).endswith("asked -t 40 s, ran 9.9 s (interrupted) · 1 load process")


def test_every_latency_window_is_plotted_within_the_run_where_its_data_is():
    """Windows sit on the wall clock's 10 s grid: a run that began 3.4 s into one plotted its first window at its
    middle, -3.3 s on the run's clock. Each is plotted at the middle of its part within the run."""
    from vllm_load.report.charts import timeline_of

    stats = LLMStats()
    t0 = 1_800_000_003.4
    for i in range(40):  # a request every 0.5 s for 20 s: windows from t0 - 3.4 (to t0 + 6.6), ..., to t0 + 26.6
        stats.add(RequestRecord(api="chat", start=t0 + i * 0.5, e2e=0.2, ok=True, ttft=0.05, chunk_offsets=[0.05, 0.1],
                                chunk_tokens=[1, 1], output_tokens=2, input_tokens=8, input_tokens_asked=8,
                                tokens_from_usage=True))
    latency = next(c for c in timeline_of(stats, t0, []) if c["id"] == "latency")
    assert latency["x"][0] == pytest.approx(6.6 / 2) and latency["x"][1] == pytest.approx(6.6 + 5)
    assert all(x >= 0 for x in latency["x"])
    last_second = max(stats.tokens_per_second) + 1 - t0  # the last window ends with the run's last second
    assert latency["x"][-1] == pytest.approx((16.6 + min(26.6, last_second)) / 2, abs=1e-3)


def test_a_run_where_nothing_completed_prints_no_empty_table_nor_a_read_lag_of_nothing():
    """It printed the metric table's header over no row, and "each read as it landed, at most 0.0 ms after"."""
    from vllm_load.report.console import render_table

    client = {"readers": ["native"], "read_lag_max": 0.0021}
    empty = {**LLMStats().summary(duration=3.0).to_json(), "client": client}
    text = render_table(empty)
    assert "no request completed: no metric to show" in text and "requests 0  succeeded 0" in text
    assert not any(line.startswith("metric") for line in text.splitlines()) and "native reader" not in text
    stats = LLMStats()  # one that completed: its header and the reader's line, as before
    stats.add(RequestRecord(api="chat", start=1.0, e2e=0.3, ok=True, ttft=0.1, chunk_offsets=[0.1, 0.2],
                            chunk_tokens=[1, 1], output_tokens=2, input_tokens=8, input_tokens_asked=8,
                            tokens_from_usage=True))
    text = render_table({**stats.summary(duration=3.0).to_json(), "client": client})
    assert any(line.startswith("metric") for line in text.splitlines())
    assert "each read as it landed, at most 2.1 ms after" in text


def test_the_reports_configuration_says_values_as_a_person_reads_them(tmp_path):
    """The Configuration table printed JSON: ``"emulator/mistral"`` in quotes, ``null``, ``true``; the untrustworthy
    banner ran its reasons on after its own sentence ("accepts it. local: ...")."""
    run = make_run_dir(tmp_path / "run")
    config = json.loads((run / "config.json").read_text())
    extra = {"tokenizer": "emulator/mistral-7b-v0.1", "host": None, "headless": True, "header": ["X-A: 1", "X-B: 2"]}
    (run / "config.json").write_text(json.dumps({**config, "options": {**config.get("options", {}), **extra}}))
    _distrust(run)
    page = html.unescape(build(run).report.read_text())
    table = page.split("id='options-changed'")[1].split("</div>")[0]
    cells = dict(re.findall(r"<tr><td>([^<]*)</td><td>([^<]*)</td></tr>", table))
    assert cells["tokenizer"] == "emulator/mistral-7b-v0.1" and cells["headless"] == "on", cells
    assert cells["header"] == "X-A: 1, X-B: 2"
    every = page.split("id='options-default'")[1].split("</details>")[0]
    assert '"' not in table + every and "null" not in table + every and ">true<" not in table + every
    banner = page.split("id='run-untrustworthy'")[1].split("</div>")[0]
    assert "accepts it. What fell behind, by process: " in banner


def _gapped_run(path, stalls, base=0.010):
    """A run of 90 requests over 45 s, each of 20 chunks 10 ms apart (``base``) but for one stall per request: the
    i-th request's is ``stalls[i % len(stalls)]`` seconds, so a window's ITL tail is the stalls it holds."""
    stats, t0 = LLMStats(), 1_800_000_000.0
    for i in range(90):
        gaps = [base] * 18 + [stalls[i % len(stalls)]]
        offs = [0.02]
        for g in gaps:
            offs.append(offs[-1] + g)
        stats.add(RequestRecord(api="chat", start=t0 + i * 0.5, e2e=offs[-1], ok=True, ttft=0.02, chunk_offsets=offs,
                                chunk_tokens=[1] * 20, output_tokens=20, input_tokens=128, input_tokens_asked=128,
                                tokens_from_usage=True))
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"run_id": path.name, "host": "http://127.0.0.1:1",
                                                  "target_is_emulator": True, "model": "m", "options": {}}))
    (path / "llm_stats.json").write_text(json.dumps({
        "run_id": path.name, "start": t0, "end": t0 + 46, "summary": stats.summary(duration=46.0).to_json(),
        "stats": stats.to_wire()}))
    return path


def test_compare_judges_each_statistic_by_its_own_window_spread_and_the_per_chunk_itl_by_the_per_token_windows(
        tmp_path):
    """Two runs of one load differed by 10-19 % in their ITL tails: the per-chunk ITL had no windows (so a 5 %
    threshold judged it) and every statistic was judged by the spread of the windows' medians. Here each run's ITL
    p99 wanders from window to window (its stalls, 30-90 ms, come in runs of their own) while the medians do not:
    a second run whose p99 lies within that wander is no change; every gap 3 ms longer is."""
    from vllm_load.report.compare import compare
    from vllm_load.rundir.files import load_run

    wander = [0.03] * 20 + [0.09] * 20 + [0.05] * 20  # windows of 20 requests: their stalls differ by window
    a = load_run(_gapped_run(tmp_path / "a", wander))
    b = load_run(_gapped_run(tmp_path / "b", [0.035] * 20 + [0.08] * 20 + [0.06] * 20))
    rows = {(r["metric"], r["stat"]): r for r in compare(a, b)["metrics"]}
    assert ("itl_token", "p99") not in rows  # one token a chunk: the per-chunk row says it once
    p99 = rows[("itl", "p99")]
    assert abs(p99["pct"]) > 5 and p99["noise"] is not None and not p99["significant"], p99
    slower = load_run(_gapped_run(tmp_path / "slower", wander, base=0.013))
    moved = {(r["metric"], r["stat"]): r for r in compare(a, slower)["metrics"]}
    assert moved[("itl", "p50")]["significant"] and moved[("itl", "p50")]["delta"] == pytest.approx(3.0, abs=0.1)
