"""The sidecar: the schema on real vLLM 0.32 /metrics text, V0 names, log lines; the process end to end."""

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from server.sidecar.vllm_schema import derive, parse_log_line, parse_metrics
from tests.helpers import ROOT, run_in_process, wait_for

REAL = (Path(__file__).parent / "data" / "vllm-0.32-cpu-metrics.txt").read_text()

V0_TEXT = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 7.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 3.0
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="m"} 1.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.42
# TYPE vllm:cpu_cache_usage_perc gauge
vllm:cpu_cache_usage_perc{model_name="m"} 0.05
# TYPE vllm:gpu_prefix_cache_hit_rate gauge
vllm:gpu_prefix_cache_hit_rate{model_name="m"} 0.25
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{model_name="m"} 4.0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="m"} 1000.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="m"} 500.0
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{le="0.01",model_name="m"} 10.0
vllm:time_per_output_token_seconds_bucket{le="0.025",model_name="m"} 30.0
vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 40.0
vllm:time_per_output_token_seconds_count{model_name="m"} 40.0
vllm:time_per_output_token_seconds_sum{model_name="m"} 0.8
"""


def test_real_vllm_0_32_metrics_map_to_the_schema():
    s = parse_metrics(REAL)
    assert s["running"] == 0 and s["waiting"] == 0 and s["kv_cache_usage"] == 0
    assert s["prompt_tokens_total"] == 1788 and s["generation_tokens_total"] == 5424
    assert s["prefix_cache_queries_total"] == 1788 and s["prefix_cache_hits_total"] == 0
    assert s["preemptions_total"] == 0
    assert s["request_success_total"]["length"] == 23
    h = s["histograms"]
    assert set(h) >= {"ttft", "itl", "e2e", "queue", "prefill", "decode", "tpot_request"}
    assert h["ttft"]["count"] == 23 and h["itl"]["count"] == 5401
    assert h["ttft"]["buckets"][-1] == [float("inf"), 23.0]
    assert [b[0] for b in h["ttft"]["buckets"]][:4] == [0.001, 0.005, 0.01, 0.02]


def test_the_kv_block_is_read_from_vllms_cache_config_info():
    """vLLM 0.32 on CPU, its line verbatim (../shared/notes/vllm-0.32-cpu-metrics.txt): its block of 128 tokens is
    what the routing verdict counts achievable hits in (16, vLLM's GPU default, counted hits it never makes)."""
    line = ('vllm:cache_config_info{_block_size_resolved="True",block_size="128",cache_dtype="auto",'
            'enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.92",num_gpu_blocks="512"} 1.0')
    text = "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n" \
           "# TYPE vllm:cache_config_info gauge\n" + line + "\n"
    assert parse_metrics(text)["block_size"] == 128
    assert "block_size" not in parse_metrics(REAL.replace("block_size", "x_block"))


def test_v0_names_map_to_the_same_schema():
    s = parse_metrics(V0_TEXT)
    assert (s["running"], s["waiting"], s["swapped"]) == (7, 3, 1)
    assert s["kv_cache_usage"] == 0.42 and s["cpu_cache_usage"] == 0.05
    assert s["prefix_cache_hit_rate_gauge"] == 0.25 and s["preemptions_total"] == 4
    assert s["histograms"]["itl"]["count"] == 40  # time_per_output_token -> itl


def test_derive_rates_and_histogram_deltas():
    a = parse_metrics(V0_TEXT)
    a["t"] = 100.0
    b = parse_metrics(V0_TEXT.replace("1000.0", "1600.0").replace("} 40.0", "} 50.0").replace("} 30.0", "} 36.0"))
    b["t"] = 102.0
    d = derive(b, a)
    assert d["prompt_tokens_rate"] == 300.0 and d["generation_tokens_rate"] == 0.0
    delta = d["histogram_deltas"]["itl"]
    assert delta["count"] == 10 and [c for _, c in delta["buckets"]] == [0.0, 6.0, 10.0]


@pytest.mark.parametrize("line, expect", [
    ("INFO 11-22 10:00:01 [loggers.py:123] Engine 000: Avg prompt throughput: 512.3 tokens/s, Avg generation "
     "throughput: 77.0 tokens/s, Running: 5 reqs, Waiting: 2 reqs, GPU KV cache usage: 12.5%, Prefix cache hit rate: 0.0%",
     {"running": 5, "waiting": 2, "kv_cache_usage": 0.125, "prompt_tokens_rate": 512.3, "prefix_cache_hit_rate_gauge": 0.0}),
    ("Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 10.0 tokens/s, Running: 1 reqs, "
     "Waiting: 0 reqs, Preemptions: 3, GPU KV cache usage: 1.0%, Prefix cache hit rate: 50.0%",
     {"preemptions_interval": 3, "prefix_cache_hit_rate_gauge": 0.5}),
    ("INFO 05-01 metrics.py:341] Avg prompt throughput: 10.5 tokens/s, Avg generation throughput: 200.1 tokens/s, "
     "Running: 8 reqs, Swapped: 1 reqs, Pending: 4 reqs, GPU KV cache usage: 93.2%, CPU KV cache usage: 2.0%.",
     {"running": 8, "swapped": 1, "waiting": 4, "kv_cache_usage": 0.932, "cpu_cache_usage": 0.02}),
])
def test_log_lines_v0_and_v1(line, expect):
    s = parse_log_line(line)
    for k, v in expect.items():
        assert s[k] == pytest.approx(v)
    assert parse_log_line("INFO: 127.0.0.1 - POST /v1/completions 200") is None


def get(url, token=""):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=5) as r:
        return r.read().decode()


def test_sidecar_log_mode_and_token(tmp_path, sidecar_factory):
    log = tmp_path / "vllm.log"
    log.write_text("noise\nEngine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, "
                   "Running: 3 reqs, Waiting: 1 reqs, GPU KV cache usage: 5.0%, Prefix cache hit rate: 0.0%\n")
    side = sidecar_factory("--log-file", str(log), "--token", "t0ken", "--out", str(tmp_path / "series.jsonl"))
    with pytest.raises(urllib.error.HTTPError) as err:
        get(side.url + "/health")
    assert err.value.code == 401
    # the follower thread may not have read the file yet: wait for the condition
    lines = wait_for(lambda: get(side.url + "/series", "t0ken").splitlines(), 20, "the sidecar to read the log line")
    assert len(lines) == 1 and json.loads(lines[0])["running"] == 3
    assert json.loads((tmp_path / "series.jsonl").read_text().splitlines()[0])["source"] == "log-v1"


def test_run_dir_holds_both_sides_on_one_clock(tmp_path, emulator_factory, sidecar_factory):
    emu = emulator_factory("--ttft", "0.02", "--itl", "0.01")
    side = sidecar_factory("--vllm-url", emu.url, "--interval", "250ms", "--out", str(tmp_path / "series.jsonl"))
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/completions.py"), "--headless", "-u", "6", "-r", "6", "-t", "4s",
                          "--host", emu.url, "--sidecar-url", side.url, "--output-tokens", "40",
                          "--slo", "server.prefix_cache_hit_rate<=0%", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    series = [json.loads(x) for x in (run_dir / "server.jsonl").read_text().splitlines()]
    stats = json.loads((run_dir / "llm_stats.json").read_text())
    assert series and all(stats["start"] - 3 <= s["t"] <= stats["end"] + 3 for s in series)
    assert max(s["running"] for s in series) >= 1  # the emulator's gauges moved under load
    assert max(s.get("generation_tokens_rate", 0) for s in series) > 0
    assert max(s["kv_cache_usage"] for s in series) > 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["server"]["prefix_cache_hit_rate"] == 0.0 and summary["verdict"] == "pass"
    # the server side is shown wherever the client side is: console, summary.md, the report's tables
    line = next(x for x in res.stdout.splitlines() if x.startswith("server side (sidecar): "))
    assert f"running max {summary['server']['running.max']:g}" in line and "prefix-cache hit rate 0.0%" in line
    assert line in (run_dir / "summary.md").read_text()
    page = (run_dir / "report.html").read_text()
    assert "id='server-side'" in page and "<td>preemptions</td>" in page and "server-missing" not in page
    assert {"config.json", "llm_stats.json", "requests.jsonl", "server.jsonl", "report.html"} <= {p.name for p in run_dir.iterdir()}


def test_shared_prefix_shows_up_as_prefix_cache_hits(tmp_path):
    # ended by its count (the hits are the subject): beside a busy suite 3 s once completed no request
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "4", "-r", "4", "-t", "120s",
                          "--num-requests", "24", "--shared-prefix-tokens", "64",
                          "--slo", "server.prefix_cache_hit_rate<=0%",
                          "--run-dir", str(tmp_path / "run")], cwd=tmp_path)
    assert res.returncode == 3, res.stdout[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["server"]["prefix_cache_hit_rate"] > 0.3


def test_unreachable_sidecar_does_not_stop_the_run(tmp_path, emulator_factory):
    emu = emulator_factory()
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "2s",
                          "--host", emu.url, "--sidecar-url", "http://127.0.0.1:9", "--run-dir", str(tmp_path / "run")],
                         cwd=tmp_path)
    assert res.returncode == 0
    assert "server side missing" in res.stderr
    assert "id='server-missing'" in (tmp_path / "run" / "report.html").read_text()
    assert "server side: missing" in res.stdout and "server side: missing" in (tmp_path / "run" / "summary.md").read_text()


def test_the_server_side_can_come_from_a_prometheus_that_scrapes_vllm(tmp_path, emulator_factory):
    """A Prometheus-compatible query_range endpoint served here stands for kube-prometheus."""
    from tests.helpers import ROOT, FakePrometheus

    def answer(query, start, end):
        value = {"running": 3, "waiting": 1, "kv_cache": 0.42, "preemptions": 0, "prefix_cache_hits": 50,
                 "prefix_cache_queries": 100}
        # speculative decoding: 10 drafts of 3 tokens, 20 accepted (8, 7 and 5 at positions 0-2), per second
        value.update({"spec_decode_num_drafts": 10, "spec_decode_num_draft_tokens": 30,
                      "spec_decode_num_accepted_tokens_total": 20})
        v = next((val for k, val in value.items() if k in query), 7)

        def points(v):
            return [[start + i, str(v * (i + 1) if "_total" in query and "rate(" not in query else v)]
                    for i in range(int(end - start) + 1)]

        if "by (position)" in query:
            return [{"metric": {"position": str(p)}, "values": points(n)} for p, n in enumerate((8, 7, 5))]
        return [{"metric": {}, "values": points(v)}]

    with FakePrometheus(answer) as prom:
        emu = emulator_factory("--ttft", "0.01", "--itl", "0.002")
        run_dir = tmp_path / "run"
        # 5 s: the live reads come every 2 s (a 2 s run on a busy host once made none before its end)
        res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "1", "-t", "5s", "--host", emu.url,
                              "--output-tokens", "4", "--prometheus-url", prom.url,
                              "--prometheus-selector", '{pod=~"vllm.*"}', "--slo", "server.kv_cache_usage.max<=50%",
                              "--run-dir", str(run_dir)], cwd=tmp_path)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        assert any('vllm:kv_cache_usage_perc{pod=~"vllm.*"}' in q for q in prom.seen)
        # read live during the run too (the web UI's server side, the saturation watch's queue), not only at its end
        run_end = json.loads((run_dir / "llm_stats.json").read_text())["end"]
        assert any(q.startswith("sum(vllm:num_requests_waiting") and end < run_end for q, end in prom.asked), prom.asked
        series = [json.loads(line) for line in (run_dir / "server.jsonl").read_text().splitlines()]
        assert series and all(s["source"] == "prometheus" and s["running"] == 3 for s in series)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["server"]["kv_cache_usage.max"] == 0.42 and summary["server"]["running.max"] == 3
        assert summary["server"]["prefix_cache_hit_rate"] == 0.5
        spec = summary["server"]["spec_decode"]
        assert spec["acceptance_rate"] == pytest.approx(200 / 3) and spec["acceptance_length"] == pytest.approx(3.0)
        assert spec["per_position_acceptance_rates"] == pytest.approx([0.8, 0.7, 0.5])
        result = json.loads((run_dir / "vllm-result.json").read_text())
        assert result["spec_decode_acceptance_length"] == pytest.approx(3.0)
        assert result["spec_decode_num_drafts"] == spec["num_drafts"] > 0
        assert "speculative decoding (server): acceptance rate 66.7%  acceptance length 3.00" in res.stdout


def test_two_sidecars_series_merge_into_the_fleets_on_one_clock():
    """--sidecar-url a,b: at every instant either sampled, each one's latest sample, summed (KV-cache usage: the
    larger); histogram buckets added by bound; a field one replica lacks is left out, not half-summed."""
    from vllm_load.plugin.sources.server_side import merge_series

    def sample(t, running, kv, prompt, ttft_buckets, extra=None):
        return {"t": t, "t_server": t + 100, "source": "metrics", "running": running, "kv_cache_usage": kv,
                "prompt_tokens_total": prompt, "request_success_total": {"length": prompt / 10},
                "histograms": {"ttft": {"buckets": ttft_buckets, "sum": 1.0, "count": ttft_buckets[-1][1]}},
                **(extra or {})}

    a = [sample(10.0, 2, 0.5, 100.0, [[0.1, 1.0], [1.0, 2.0]], {"spec_drafts_total": 5.0}),
         sample(11.0, 3, 0.6, 200.0, [[0.1, 2.0], [1.0, 4.0]], {"spec_drafts_total": 6.0})]
    b = [sample(10.5, 1, 0.2, 50.0, [[0.1, 0.0], [1.0, 1.0]]), sample(11.5, 4, 0.9, 70.0, [[0.1, 1.0], [1.0, 1.0]])]
    b[1]["request_success_total"]["abort"] = 1.0  # a reason only one replica has seen yet
    merged = merge_series([a, b])
    assert [m["t"] for m in merged] == [10.5, 11.0, 11.5]  # from the first instant both have a sample
    first, second, third = merged
    assert first["running"] == 3 and first["prompt_tokens_total"] == 150.0 and first["kv_cache_usage"] == 0.5
    assert second["running"] == 4 and second["prompt_tokens_total"] == 250.0 and second["kv_cache_usage"] == 0.6
    assert third["running"] == 7 and third["kv_cache_usage"] == 0.9 and third["request_success_total"] == {"length": 27.0, "abort": 1.0}
    assert third["histograms"]["ttft"] == {"buckets": [[0.1, 3.0], [1.0, 5.0]], "sum": 2.0, "count": 5.0}
    assert "spec_drafts_total" not in third and "t_server" not in third and third["source"] == "metrics"


def test_kv_connector_series_are_read_under_vllms_names():
    """vLLM 0.32's KV-connector series (only on a server that runs one), as its source names them and
    prometheus_client writes them: a connector's prefix-cache hits, NIXL's failures and transfer histograms, KV
    offload's byte counters."""
    from server.sidecar.vllm_schema import parse_metrics
    from vllm_load.metrics.fleet.server import server_summary
    text = """# TYPE vllm:external_prefix_cache_queries_total counter
vllm:external_prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
# TYPE vllm:external_prefix_cache_hits_total counter
vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 640.0
# TYPE vllm:nixl_num_failed_transfers_total counter
vllm:nixl_num_failed_transfers_total{engine="0",model_name="m"} 2.0
# TYPE vllm:kv_offload_load_bytes_total counter
vllm:kv_offload_load_bytes_total{engine="0",model_name="m"} 5e6
# TYPE vllm:nixl_xfer_time_seconds histogram
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.01",model_name="m"} 3.0
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:nixl_xfer_time_seconds_count{engine="0",model_name="m"} 4.0
vllm:nixl_xfer_time_seconds_sum{engine="0",model_name="m"} 0.06
"""
    s = parse_metrics(text)
    assert (s["external_prefix_cache_hits_total"], s["nixl_failed_transfers_total"],
            s["kv_offload_load_bytes_total"]) == (640.0, 2.0, 5e6)
    assert s["histograms"]["nixl_xfer_time"]["count"] == 4.0
    zero = parse_metrics(text.replace("640.0", "0.0").replace(" 2.0", " 0.0").replace("5e6", "0").replace(
        " 4.0", " 0.0").replace(" 3.0", " 0.0").replace(" 0.06", " 0.0").replace(" 1000.0", " 0.0"))
    kv = server_summary([zero, s])["kv_connector"]
    assert kv == {"nixl_transfers": 4.0, "nixl_seconds": 0.06, "nixl_failed_transfers": 2.0,
                  "external_prefix_cache_hits": 640.0, "external_prefix_cache_queries": 1000.0,
                  "kv_offload_load_bytes": 5e6}


def test_a_fresh_read_takes_a_sample_as_it_is_asked(emulator_factory, sidecar_factory):
    """A run's end asks for the series with fresh=1: the sidecar scrapes then, so the series ends after the ask
    (a 60 s interval would leave it a minute old), and the ask is answered at once, not after the next scrape."""
    emu = emulator_factory("--ttft", "0.02", "--itl", "0.01")
    side = sidecar_factory("--vllm-url", emu.url, "--interval", "60s")
    wait_for(lambda: get(side.url + "/series").strip(), 20, "the sidecar's first sample")
    asked = time.time()
    fresh = [json.loads(x) for x in get(side.url + "/series?fresh=1").splitlines()]
    took = time.time() - asked
    assert len(fresh) == 2 and fresh[-1]["t"] >= asked and took < 5.0
    stale = [json.loads(x) for x in get(side.url + "/series").splitlines()]
    assert len(stale) == 2  # a plain read takes none


def test_a_sidecar_url_with_credentials_is_read_with_them_as_basic_auth():
    """--sidecar-url http://user:pw@HOST was redacted in files, as it must be, but read as unreachable ("Name or
    service not known": urllib took the credentials for part of the host name). They go as Basic auth."""
    import base64

    from gevent.pywsgi import WSGIServer

    from vllm_load.plugin.sources.server_side import _get

    seen: list = []

    def app(environ, start_response):
        seen.append((environ.get("HTTP_AUTHORIZATION"), environ.get("HTTP_HOST"), environ["PATH_INFO"]))
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    server = WSGIServer(("127.0.0.1", 0), app, log=None)
    server.start()
    try:
        port = server.server_port
        assert _get(f"http://me:p%40ss@127.0.0.1:{port}/samples", "", 5) == b"ok"
        assert _get(f"http://127.0.0.1:{port}/plain", "tok", 5) == b"ok"
    finally:
        server.stop()
    assert seen[0] == ("Basic " + base64.b64encode(b"me:p@ss").decode(), f"127.0.0.1:{port}", "/samples")
    assert seen[1] == ("Bearer tok", f"127.0.0.1:{port}", "/plain")


def test_the_live_server_side_keeps_the_numbers_and_the_edges_whole_not_every_sample():
    """Every live sample was kept whole (a vLLM's histograms: the client grew ~0.07 MB a second beside a sidecar).
    The numbers of each are kept, the first and the latest whole: the summary is the whole series' own."""
    from vllm_load.metrics.fleet.server import server_summary
    from vllm_load.plugin.sources.server_side import LiveServer

    def sample(i: int) -> dict:
        return {"t": float(i), "running": i % 5, "waiting": i % 3, "kv_cache_usage": i / 1000,
                "prefix_cache_queries_total": 10.0 * i, "prefix_cache_hits_total": 4.0 * i,
                "preemptions_total": float(i // 7), "kv_offload_load_bytes_total": 100.0 * i,
                "histograms": {"nixl_xfer_time": {"count": float(i), "sum": 2.0 * i},
                               "nixl_bytes": {"count": float(i), "sum": 1e6 * i}}}

    series = [sample(i) for i in range(1, 601)]
    live = LiveServer(lambda since, until: ([], "no sample yet"), start=0.0, interval=3600)
    try:
        for i in range(0, 600, 7):  # as the polls bring them
            live.take(series[i:i + 7])
        assert live.summary() == server_summary(series)
        assert all("histograms" not in s for s in live.samples) and len(live.samples) == 600
        assert [s["waiting"] for s in live.samples] == [s["waiting"] for s in series]  # what the watches read
    finally:
        live.stop()


def test_the_sidecars_token_comes_from_the_masters_variable_when_not_given(monkeypatch):
    """On Kubernetes the token comes from a Secret as an environment variable, not a command line a pod spec shows:
    the sidecar reads VLLM_LOAD_SIDECAR_TOKEN, the name the master's --sidecar-token reads (one secret for both)."""
    from server.sidecar.app import build_parser

    monkeypatch.setenv("VLLM_LOAD_SIDECAR_TOKEN", "from-the-secret")
    assert build_parser().parse_args([]).token == "from-the-secret"
    assert build_parser().parse_args(["--token", "given"]).token == "given"
    monkeypatch.delenv("VLLM_LOAD_SIDECAR_TOKEN")
    assert build_parser().parse_args([]).token == ""


def test_a_foreign_host_or_a_browser_page_is_refused(tmp_path, sidecar_factory):
    """DNS rebinding: a page on evil.example that rebinds its name to this machine sends ``Host: evil.example``,
    and any page's fetch carries an ``Origin``: the sidecar serves no page, so it refuses both (403, the reason in
    one line), and answers its own names and each --allowed-host (the name a Kubernetes Service gives it)."""
    log = tmp_path / "vllm.log"
    log.write_text("")
    side = sidecar_factory("--log-file", str(log), "--allowed-host", "side.internal", "--out", "")
    port = side.url.rsplit(":", 1)[1]

    def status(**headers: str) -> tuple[int, str]:
        req = urllib.request.Request(side.url + "/health", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    assert status()[0] == 200
    assert status(Host=f"side.internal:{port}")[0] == 200 and status(Host=f"localhost:{port}")[0] == 200
    code, body = status(Host=f"evil.example:{port}")
    assert code == 403 and "not this sidecar's name" in json.loads(body)["error"]
    assert status(Host=f"127.0.0.1.evil.example:{port}")[0] == 403
    assert status(Origin="http://evil.example")[0] == 403
    assert status(**{"Sec-Fetch-Site": "cross-site"})[0] == 403
