"""Outputs other tools read: vllm bench serve's result JSON, llm_stats.csv (and Locust's --csv), vLLM's names."""

from __future__ import annotations

import csv
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import ROOT, run_in_process

SAMPLE = ROOT / "tests" / "data" / "vllm-bench-serve-0.32-result.json"  # written by vllm bench serve 0.32


def test_the_vllm_result_has_every_key_vllm_writes_with_the_summarys_values_and_itl_is_per_chunk(
        emulator_factory, tmp_path):
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.005", "--tokens-per-chunk", "2")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles" / "chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "60s",
                          "--num-requests", "8", "--host", emu.url, "--output-tokens", "16", "--save-detailed", "--csv",
                          str(tmp_path / "lc"), "--slo", "e2el.p99<=30s", "--slo", "ttft.p99<=30s",
                          "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    ours = json.loads((run_dir / "vllm-result.json").read_text())
    theirs = json.loads(SAMPLE.read_text())
    assert set(theirs) - set(ours) == set()
    s = json.loads((run_dir / "summary.json").read_text())["summary"]
    m = s["metrics"]
    assert ours["completed"] == s["succeeded"] and ours["failed"] == s["failed"] == 0
    assert ours["total_output_tokens"] == s["output_tokens"] and ours["duration"] == pytest.approx(s["duration_s"])
    assert ours["request_throughput"] == pytest.approx(s["succeeded"] / s["duration_s"])
    for vname, key in (("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl"), ("e2el", "e2e")):
        assert ours[f"mean_{vname}_ms"] == pytest.approx(m[key]["mean"] * 1000)
        assert ours[f"median_{vname}_ms"] == pytest.approx(m[key]["p50"] * 1000)
        assert ours[f"p99_{vname}_ms"] == pytest.approx(m[key]["p99"] * 1000)
        assert ours[f"std_{vname}_ms"] > 0
    # vLLM's names: itl is the gap between chunks (2 tokens each here), itl_token the gap per token: each chunk's
    # gap spread over its two tokens (and the first chunk's second token, 0 after its first)
    assert m["itl_token"]["count"] == 15 * s["requests"] and m["itl"]["count"] == 7 * s["requests"]
    assert m["itl_token"]["max"] == pytest.approx(m["itl"]["max"] / 2, rel=1e-9)
    assert ours["request_rate"] == "inf" and ours["max_concurrency"] == 2
    assert ours["request_goodput"] == pytest.approx(s["goodput"])  # good requests/s: ttft and e2e SLOs given
    # the per-request arrays, as vLLM's --save-detailed: one entry per request, gaps per chunk
    assert len(ours["ttfts"]) == len(ours["itls"]) == s["requests"]
    assert all(len(gaps) == 7 for gaps in ours["itls"])  # 16 tokens in 8 chunks
    rows = list(csv.DictReader((tmp_path / "lc_llm_stats.csv").open()))
    ttft = next(r for r in rows if r["name"] == "total" and r["metric"] == "ttft")
    assert int(ttft["count"]) == m["ttft"]["count"] and float(ttft["p99"]) == pytest.approx(m["ttft"]["p99"] * 1000)
    assert (run_dir / "llm_stats.csv").read_text() == (tmp_path / "lc_llm_stats.csv").read_text()


def _scrape(url: str) -> dict:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


@pytest.mark.e2e
def test_prometheus_metrics_of_a_two_worker_run_equal_its_summary(emulator_factory, tmp_path):
    import os
    import subprocess
    import sys

    from tests.helpers import free_port, wait_for

    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002")
    port = free_port()
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "locust", "-f", str(ROOT / "tests" / "locustfiles" / "conversation.py"),
                             "--host", emu.url, "--web-host", "127.0.0.1", "--web-port", str(port), "--autostart",
                             "-u", "4", "-r", "4", "-t", "60s", "--num-requests", "8", "--autoquit", "20", "--processes", "2",
                             "--master-bind-port", str(free_port()), "--turns", "2",
                             "--input-tokens", "40", "--turn-input-tokens", "10", "--run-dir", str(run_dir)],
                            cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        # the run has ended (its summary is written) while the web UI stays up for --autoquit
        wait_for(lambda: (run_dir / "summary.json").exists(), timeout=90, what="the run's summary")
        fams = _scrape(f"http://127.0.0.1:{port}/metrics")
        s = json.loads((run_dir / "summary.json").read_text())["summary"]
        ttft = fams["vllm_load:time_to_first_token_seconds"]
        counts = {smp.labels["name"]: smp.value for smp in ttft.samples if smp.name.endswith("_count")}
        assert sum(counts.values()) == s["metrics"]["ttft"]["count"] == s["succeeded"] > 0
        assert counts["turn 1"] == s["names"]["turn 1"]["metrics"]["ttft"]["count"] and counts["(unnamed)"] == 0
        # vLLM's bucket boundaries, cumulative, +Inf equal to the count
        inf = {smp.labels["name"]: smp.value for smp in ttft.samples
               if smp.name.endswith("_bucket") and smp.labels["le"] == "+Inf"}
        assert inf == counts
        les = [smp.labels["le"] for smp in ttft.samples if smp.name.endswith("_bucket") and smp.labels["name"] == "turn 1"]
        assert les[:3] == ["0.001", "0.005", "0.01"]
        ok = sum(smp.value for smp in fams["vllm_load:requests"].samples
                 if smp.name.endswith("_total") and smp.labels["outcome"] == "ok")
        out = sum(smp.value for smp in fams["vllm_load:generation_tokens"].samples if smp.name.endswith("_total"))
        assert ok == s["succeeded"] and out == s["output_tokens"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.e2e
def test_a_headless_run_serves_prometheus_metrics_on_its_port(emulator_factory, tmp_path):
    import os
    import subprocess
    import sys

    from tests.helpers import free_port, wait_for

    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles" / "chat.py"), "--headless",
                             "--host", emu.url, "-u", "2", "-r", "2", "-t", "6s", "--output-tokens", "8",
                             "--metrics-port", str(port), "--run-dir", str(tmp_path / "run")],
                            cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)

    def scraped() -> float:
        try:
            fams = _scrape(f"http://127.0.0.1:{port}/metrics")
        except OSError:
            return 0.0
        return sum(smp.value for smp in fams["vllm_load:e2e_request_latency_seconds"].samples
                   if smp.name.endswith("_count"))

    try:
        assert wait_for(scraped, timeout=60, what="a scrape with finished requests") > 0
        # a page that rebound its name to this machine, and any browser page, read nothing (host_names.guard)
        for headers in ({"Host": f"evil.example:{port}"}, {"Origin": "http://evil.example"}):
            req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(req, timeout=5)
            assert err.value.code == 403, headers
    finally:
        proc.wait(timeout=60)


def test_the_request_log_writes_whole_lines_in_batches_and_everything_at_a_flush(tmp_path):
    from vllm_load.client.record import RequestRecord
    from vllm_load.rundir.reqlog import RequestLog, read_log

    path = tmp_path / "requests.jsonl"
    log = RequestLog(path)
    recs = [RequestRecord(api="chat", start=1.0 + i, e2e=0.5, ok=True, output_tokens=i) for i in range(RequestLog.BATCH + 3)]
    for rec in recs[:3]:
        log.write(rec)
    assert read_log(path) == []  # kept, not written yet
    log.flush()
    assert [r["output_tokens"] for r in read_log(path)] == [0, 1, 2]
    for rec in recs[3:]:
        log.write(rec)  # a full batch goes to the writer without a flush
    log.flush()  # nothing kept: waits for what the writer took
    assert len(read_log(path)) == RequestLog.BATCH + 3
    log.write(recs[0])
    log.close()  # the close writes what was kept
    assert len(read_log(path)) == RequestLog.BATCH + 4
    assert path.read_bytes().endswith(b"}\n")


def test_the_request_log_serialises_off_the_loop_thread_and_a_failed_write_is_raised_at_the_flush(tmp_path,
                                                                                                 monkeypatch):
    import threading

    from vllm_load.client.record import RequestRecord
    from vllm_load.rundir.reqlog import RequestLog, read_log

    threads = []
    real = RequestRecord.to_json
    monkeypatch.setattr(RequestRecord, "to_json", lambda self: threads.append(threading.get_ident()) or real(self))
    log = RequestLog(tmp_path / "requests.jsonl")
    for i in range(RequestLog.BATCH + 1):
        log.write(RequestRecord(api="chat", start=float(i), e2e=0.5, ok=True))
    log.close()
    assert len(read_log(tmp_path / "requests.jsonl")) == RequestLog.BATCH + 1
    assert len(threads) == RequestLog.BATCH + 1 and threading.get_ident() not in threads  # all in the writer

    full = RequestLog(Path("/dev/full"))  # every write fails: no space left on the device
    full.write(RequestRecord(api="chat", start=1.0, e2e=0.5, ok=True))
    from vllm_load.errors import OutputError

    with pytest.raises(OutputError, match="cannot write the request log /dev/full: No space left on device"):
        full.flush()
    full.write(RequestRecord(api="chat", start=2.0, e2e=0.5, ok=True))  # the log is closed: counted as lost
    assert full.lost == 2
    full.close()  # nothing kept: closes cleanly


def test_the_vllm_result_writes_latencies_and_queue_times_always_and_vllms_concurrency(emulator_factory, tmp_path):
    """vLLM writes latencies and queue_times without --save-detailed; its queue time is the client's own wait
    before the send (here the open loop's send lag); its max_concurrent_requests counts requests alive within
    each second: one request at a time, 0.6 s apart, already makes 3."""
    from vllm_load.report.exports.vllm_result import _alive_per_second, _peak

    emu = emulator_factory("--ttft", "0.01", "--itl", "0.005")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles" / "chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "3s",
                          "--host", emu.url, "--output-tokens", "8", "--request-rate", "10", "--run-dir", str(run_dir)],
                         cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    ours = json.loads((run_dir / "vllm-result.json").read_text())
    from vllm_load.rundir.reqlog import read_log
    logs = sorted(read_log(run_dir / "requests.jsonl"), key=lambda r: r["start"])
    assert ours["latencies"] == [r["e2e"] for r in logs] and ours["queue_times"] == [r["send_lag"] for r in logs]
    assert "ttfts" not in ours and ours["request_rate"] == 10.0
    assert ours["max_concurrent_requests"] >= ours["max_concurrent_streams"] >= 1
    one_at_a_time = [{"ok": True, "start": 100.0 + 0.6 * i, "e2e": 0.55} for i in range(5)]
    assert _alive_per_second(one_at_a_time) == 3 and _peak(one_at_a_time) == 1  # second 1 sees 3 of them


@pytest.mark.e2e
def test_the_console_ends_with_one_block_after_locusts_tables_and_says_each_thing_once(tmp_path):
    """A two-process run, stdout and stderr in one stream as a terminal shows them: the stop says what it waits
    for; Locust's early "not all reports received" alarm and its workers' own "Shutting down" lines are gone; the
    vllm-load block (table, report, next steps) comes after Locust's last table and ends the output."""
    import subprocess
    import sys

    from tests.helpers import ROOT as root, free_port

    try:
        out = subprocess.run([sys.executable, "-m", "locust", "-f", str(root / "locustfiles/chat.py"), "--headless",
                              # 10 s: two processes start before their first request (seconds on a busy 2-core host)
                              "-u", "4", "-r", "4", "-t", "10s", "--processes", "2", "--master-bind-port",
                              str(free_port()), "--output-tokens", "32",
                              "--allow-untrustworthy",  # the console's order, not the timing
                              "--run-dir", str(tmp_path / "run")], cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=120,
                             env={**__import__("os").environ, "PYTHONPATH": str(root)}).stdout
    except subprocess.TimeoutExpired as exc:  # what it said before it hung (a worker that never joined, once)
        raise AssertionError((exc.output or b"")[-4000:]) from None
    assert out.count("Shutting down (exit code 0)") == 1, out[-3000:]
    assert "not all reports received" not in out
    assert "vllm-load: stopping: waiting for 2 worker(s) to finish their requests in flight" in out
    assert out.index("Response time percentiles") < out.index("vllm-load LLM metrics, run")
    assert out.rstrip().splitlines()[-1].startswith("next: open ")
    assert "ITL (per chunk = per token) (ms)" in out and "ITL per token (ms)" not in out  # one token per chunk


def test_locusts_own_table_starts_over_when_the_warm_up_ends(tmp_path):
    """--warmup 2s: the LLM metrics leave out the requests started in the first 2 s, and Locust's table starts over
    then and counts by the same rule: the two counts are equal."""
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "6s",
                          "--warmup", "2s", "--output-tokens", "8", "--emulator-ttft", "0.01", "--emulator-itl", "0.002",
                          "--csv", str(tmp_path / "locust"), "--run-dir", str(tmp_path / "run")], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "vllm-load: warm-up over (2 s): Locust's table starts over now" in res.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())["summary"]
    rows = {r["Name"]: r for r in csv.DictReader(open(tmp_path / "locust_stats.csv"))}
    locust_count = int(rows["Aggregated"]["Request Count"])
    assert summary["warmup_excluded"] > 20  # the warm-up sent plenty, which Locust's table no longer counts
    assert locust_count == summary["requests"], (locust_count, summary["requests"])


def test_two_runs_into_one_run_dir_leave_two_complete_separate_runs(tmp_path):
    """A second run into a --run-dir that holds a run goes beside it under its run id (it appended its requests to
    the first's log, beside a summary of its own count) and says where."""
    run_dir = tmp_path / "out"
    args = ["-f", str(ROOT / "locustfiles" / "chat.py"), "--headless", "-u", "1", "-r", "1", "-t", "60s",
            "--output-tokens", "4", "--run-dir", str(run_dir)]
    first = run_in_process([*args, "--num-requests", "3"], cwd=tmp_path)
    second = run_in_process([*args, "--num-requests", "5"], cwd=tmp_path)
    assert first.returncode == second.returncode == 0, second.stdout[-2000:]
    assert first.run_dir == run_dir and second.run_dir != run_dir and second.run_dir.parent == tmp_path
    run_id = json.loads((second.run_dir / "config.json").read_text())["run_id"]
    assert second.run_dir.name == f"out-{run_id}"
    assert f"writes to {second.run_dir} " in second.stdout and f"{run_dir} holds an earlier run" in second.stdout
    for out, count in ((first, 3), (second, 5)):  # each whole: its log, its summary and its report agree
        assert len(out.requests()) == count and out.summary()["summary"]["requests"] == count
        assert (out.run_dir / "report.html").exists() and (out.run_dir / "config.json").exists()
        # junit.xml in every run, SLOs or not: the validity checks are its test cases
        assert 'name="requests succeeded &gt;= 1"' in (out.run_dir / "junit.xml").read_text()
