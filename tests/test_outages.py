"""A server outage is reported as an outage: bounded retries, a window on the run's clock, no blame on the client."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest

from tests.helpers import ROOT, Proc, free_port, run_in_process, start_in_process, wait_for
from tests.test_process_faults import logs
from vllm_load.metrics.fleet.outages import LiveOutage, bucket, find_windows
from vllm_load.rundir.reqlog import read_log

CHAT = str(ROOT / "locustfiles/chat.py")


def the_one_outage(run_dir) -> tuple[dict, dict]:
    """(the run's summary, its single outage window): a stopped and restarted server is one outage."""
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    outages = [w for w in summary["outages"] if w["outage"]]
    assert len(outages) == 1, summary["outages"]
    return summary, outages[0]


def test_windows_from_buckets():
    ok, conn, other = Counter(), Counter(), Counter()
    for t in (1.0, 1.5, 2.0):
        ok[bucket(t)] += 1
    for t in (3.0, 3.2, 4.0, 6.0):  # refused for 3 s and more
        conn[bucket(t)] += 1
    ok[bucket(6.5)] += 1
    other[bucket(8.0)] += 1  # one HTTP error: too short to be a storm
    ok[bucket(8.5)] += 1
    wins = find_windows(ok, conn, other, min_seconds=2.0)
    assert len(wins) == 1 and abs(wins[0].start - 3.0) < 1e-9 and abs(wins[0].end - 6.5) < 1e-9
    assert wins[0].attempts == 4 and wins[0].is_outage and not wins[0].ongoing
    conn[bucket(9.0)] += 1  # down again, and still down at the end
    wins = find_windows(ok, conn, other, min_seconds=2.0, now=12.0)
    assert wins[-1].ongoing and abs(wins[-1].seconds - 3.0) < 1e-9
    assert len(find_windows(ok, conn, other, min_seconds=2.0, now=10.0)) == 1  # 1 s: not yet an outage


def test_the_live_check_follows_the_span_the_whole_run_scan_finds_at_a_fixed_cost():
    """Checked every second through a 70 s outage (longer than its 30 s horizon) and a recovery, the live
    span has the start, length and attempts the whole-run scan gives, and reads at most ~300 buckets a check."""
    ok, conn, other = Counter(), Counter(), Counter()
    # requests by start time: 10 s up (every 0.1 s), then refused every 0.2 s; each is counted once its second comes
    starts = [(t / 10, ok) for t in range(100)] + [(t / 10, conn) for t in range(100, 800, 2)]
    pending = iter(starts)
    upcoming = next(pending)

    def happen(until: float) -> None:
        nonlocal upcoming
        while upcoming is not None and upcoming[0] < until:
            upcoming[1][bucket(upcoming[0])] += 1
            upcoming = next(pending, None)

    live = LiveOutage(min_seconds=2.0, horizon=30.0)
    for now in range(11, 81):
        happen(float(now))
        if now == 50:
            other[bucket(49.5)] += 1  # an HTTP error inside the outage
        span = live.check(ok, conn, other, float(now))
        full = [w for w in find_windows(ok, conn, other, 2.0, float(now)) if w.ongoing]
        if now < 12:
            assert span is None and not full, now
            continue
        assert span is not None and full, now
        assert abs(span.start - full[0].start) < 1e-9 and span.attempts == full[0].attempts, (now, span, full[0])
        assert span.connection == full[0].connection and span.is_outage
    ok[bucket(81.0)] += 1  # back
    assert live.check(ok, conn, other, 82.0) is None
    conn[bucket(83.0)] += 1  # one refusal after the recovery: a new span, too short to report yet
    assert live.check(ok, conn, other, 84.0) is None

    class Reads(Counter):
        reads = 0

        def get(self, *args):  # type: ignore[override]
            Reads.reads += 1
            return super().get(*args)

    hour = Reads({bucket(t / 10): 1 for t in range(36_000)})  # an hour of successes
    Reads.reads = 0
    assert LiveOutage(2.0, horizon=30.0).check(hour, Reads(), Reads(), 3600.0) is None
    assert Reads.reads <= 4 * (300 + 1), Reads.reads  # the horizon's buckets, not the hour's 36,000


@pytest.mark.slow  # a server process killed and started again (12 s): the full suite's; the fast selection keeps the
# outage logic's own tests (the cancelled requests, the windows)
def test_a_server_killed_and_restarted_is_one_outage_with_bounded_retries(tmp_path):
    port = free_port()
    args = ["-m", "server.emulator", "--port", str(port), "--ttft", "0.01", "--itl", "0.01"]
    server = Proc(args)
    run_dir = tmp_path / "run"
    users, cap = 4, 0.5
    run = start_in_process(["-f", CHAT, "--headless", "-u", str(users), "-r", str(users), "-t", "120s", "--host",
                            server.url, "--output-tokens", "20", "--retry-backoff-max", f"{cap}s", "--slo",
                            "outage.seconds<=0", "--run-dir", str(run_dir)], tmp_path, timeout=150)
    try:
        wait_for(lambda: sum(r["ok"] for r in logs(run_dir)) >= 8, what="successes before the kill")
        server.p.kill()
        server.p.wait(timeout=10)
        killed = time.time()
        wait_for(lambda: time.time() - killed >= 5 and any(r["error"].startswith("connection failed")
                                                          for r in logs(run_dir) if not r["ok"]),
                 what="5 s of outage with refused connections", poll=0.2)
        server = Proc(args)  # the same port again; it listens once Proc returns
        back = time.time()
        # successes after it, and time for the live watcher (1 s polls) to have said so
        wait_for(lambda: sum(r["ok"] and r["start"] > back for r in logs(run_dir)) >= 8 and time.time() - back > 3,
                 what="successes after the restart", poll=0.2)
        res = run.stop()
        out, err = res.stdout, res.stderr
    finally:
        server.stop()
        if not run.greenlet.dead:
            run.stop()
    summary, w = the_one_outage(run_dir)
    # the window is where the server was gone: from the kill to its restart, to the backoff's precision
    assert abs(w["start"] - killed) < 1.0 and abs(w["end"] - back) < 1.0, (w, killed, back)
    # attempts stay within the backoff bound: each user waits >= cap/2 once its doublings reach the cap
    doublings = 4  # 50, 100, 200, 400 ms before the 0.5 s cap
    assert w["attempts"] <= users * (w["seconds"] / (cap / 2) + doublings + 1), w
    refused = [r for r in logs(run_dir) if not r["ok"] and r["error"].startswith("connection failed")]
    assert len(refused) <= w["attempts"]
    # the run says what happened, live and at the end, and the SLO on it fails
    assert "vllm-load: OUTAGE: server unreachable since" in out and "the server answers again" in out, out[-3000:] + err[-3000:]
    assert "OUTAGE: server unreachable from" in out and "connection refused" in w["text"]
    # the retries during the outage are not the client's lateness (beside busy loops the cause is their contention)
    # (or the host's: once beside the full suite at a load average of 15, a late read with the process's CPU low and
    # no wait in its own report; what would be the retries' is the client's own CPU or its loop blocked)
    assert not summary["client"]["saturated"] or summary["client"]["cause"] in ("contention", "host"), summary["client"]
    assert res.code == 3 and "FAIL  outage.seconds<=0" in out
    assert "id='outages'" in (run_dir / "report.html").read_text()
    assert "server unreachable from" in (run_dir / "summary.md").read_text()


def test_stop_on_outage_ends_the_run_with_the_reason(tmp_path):
    port = free_port()
    server = Proc(["-m", "server.emulator", "--port", str(port), "--ttft", "0.01", "--itl", "0.005"])
    run_dir = tmp_path / "run"
    run = start_in_process(["-f", CHAT, "--headless", "-u", "2", "-r", "2", "-t", "120s", "--host", server.url,
                            "--output-tokens", "8", "--stop-on-outage", "3s", "--run-dir", str(run_dir)], tmp_path,
                           timeout=150)
    try:
        wait_for(lambda: sum(r["ok"] for r in logs(run_dir)) >= 4, what="successes before the kill")
        server.stop()
        killed = time.time()
        res = run.wait(timeout=60)
        out, err = res.stdout, res.stderr
        took = time.time() - killed
    finally:
        server.stop()
        if not run.greenlet.dead:
            run.stop()
    assert res.code == 1, out[-2000:]
    assert "stopping the run (--stop-on-outage 3s)" in err and "the run was stopped: server unreachable" in out
    assert took < 20  # stopped 3 s into the outage (+ reports every 3 s, drain, report), not at -t 120 s


def test_a_503_with_retry_after_makes_the_user_wait(tmp_path, emulator_factory):
    emu = emulator_factory("--fault", "503:1", "--retry-after", "1")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", CHAT, "--headless", "-u", "1", "-r", "1", "-t", "60s", "--num-requests", "4", "--host",
                          emu.url,
                          "--min-requests", "0", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 1, res.stdout[-2000:]
    starts = sorted(r["start"] for r in logs(run_dir))
    assert len(starts) == 4, starts
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert min(gaps) >= 0.95, gaps
    assert all(r["retry_after"] == 1.0 and r["status"] == 503 for r in logs(run_dir))


def test_without_retry_after_a_5xx_is_backed_off_too(tmp_path, emulator_factory):
    """Each failure doubles the user's wait from 50 ms, with jitter (x0.5-1.0): the gaps between its attempts are
    at least that (the issue's 503 storm was ~625 a second per user). Ended by its count: a 2 s run once made one
    attempt on a busy host, and a lower bound on the gaps holds however busy it is."""
    from vllm_load.plugin.requests.llm import BACKOFF_START

    emu = emulator_factory("--fault", "500:1")
    res = run_in_process(["-f", CHAT, "--headless", "-u", "1", "-r", "1", "-t", "60s", "--num-requests", "6",
                          "--host", emu.url, "--min-requests", "0", "--run-dir", str(tmp_path / "run")], cwd=tmp_path)
    assert res.returncode == 1
    starts = sorted(r["start"] for r in logs(tmp_path / "run"))
    assert len(starts) == 6
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert all(gap >= BACKOFF_START * 2 ** k * 0.5 for k, gap in enumerate(gaps)), gaps


def test_refusals_through_a_span_make_it_an_outage_however_many_answered_failures_come_beside_them():
    """A vLLM shutting down refused new connections (backed off: few attempts) while answering 500 in ~1 ms on a
    kept-alive one (not backed off: thousands): unreachable all the same. One refusal in a 500 storm is not."""
    ok, conn, other = Counter(), Counter(), Counter()
    ok[bucket(1.0)] += 1
    for i in range(19):  # refused every 0.5 s from 1.1 s to 10.1 s
        conn[bucket(1.1 + 0.5 * i)] += 1
    for i in range(30):  # 20 answered 500s in each bucket from 1.1 s to 4.0 s
        other[bucket(1.1 + 0.1 * i)] += 20
    ok[bucket(10.5)] += 1
    (w,) = find_windows(ok, conn, other, min_seconds=2.0)
    assert w.connection == 19 and w.attempts == 619 and w.is_outage
    assert abs(w.conn_seconds - 9.1) < 0.15 and w.to_json()["outage"]  # to the bucket
    live = LiveOutage(2.0).check(ok, conn, other, now=9.0)  # the live notice says the same
    assert live is not None and live.is_outage
    storm = Counter({bucket(1.1 + 0.1 * i): 20 for i in range(90)})
    (w,) = find_windows(ok, Counter({bucket(1.1): 1}), storm, min_seconds=2.0)
    assert not w.is_outage  # a failure storm with one refused connection in it


def test_requests_the_runs_end_cancels_are_failures_in_no_outage_or_storm(tmp_path):
    """A saturated server queues requests: their answer's head has not come when the drain times out and the run
    stops them. They fail (the server did not finish them in time), but they say nothing of the server's being
    reachable or erring. They once counted as connection failures, and a ramp's end read "OUTAGE: server
    unreachable ... cancelled after 0 tokens"."""
    run_dir = tmp_path / "run"
    # 3 users 2 s apart, each with one request whose first token (and head) would come after 30 s; the run's
    # end cancels all three 1 s into its drain: their starts span 4 s, over --outage-after's 2 s (-t 8s: the last
    # user starts 4 s in, with room for a busy host's late spawn)
    res = run_in_process(["-f", CHAT, "--headless", "-u", "3", "-r", "0.5", "-t", "8s", "--emulator-ttft", "30",
                          "--drain-timeout", "1", "--run-dir", str(run_dir)], cwd=tmp_path, timeout=90)
    assert res.returncode == 4, res.stdout[-3000:] + res.stderr[-3000:]  # nothing succeeded: the run is invalid
    records = list(read_log(run_dir / "requests.jsonl"))
    assert len(records) == 3 and all(r["cancelled"] and r["status"] is None and not r["ok"] for r in records)
    assert max(r["start"] for r in records) - min(r["start"] for r in records) > 2.5
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert summary["failed"] == 3 and summary["outages"] == [], summary["outages"]
    assert "OUTAGE" not in res.stdout and "FAILURE STORM" not in res.stdout
    assert "cancelled after N tokens: the test stopped mid-request" in res.stdout


def test_an_answer_and_a_failure_in_one_bucket_may_begin_the_outage():
    """A request answered (its first token) and was cut 10 ms later, in one 100 ms bucket: the answer's bucket
    reset the span and its failure was dropped, so a 33 s outage that began there was found 33 s late."""
    from collections import Counter

    from vllm_load.metrics.fleet.outages import LiveOutage, bucket, find_windows

    ok, conn, other = Counter({bucket(9.3): 2, bucket(9.876): 1}), Counter(), Counter({bucket(9.73): 1,
                                                                                         bucket(9.88): 1})
    for t in range(427, 600, 3):
        conn[bucket(t / 10)] += 1
    windows = find_windows(ok, conn, other, 2.0, now=60.0)
    assert len(windows) == 1 and abs(windows[0].start - 9.8) < 1e-9 and windows[0].is_outage, windows
    live = LiveOutage(2.0, horizon=60.0).check(ok, conn, other, 60.0)
    assert live is not None and abs(live.start - 9.8) < 1e-9


def test_a_first_answer_the_runs_end_cancelled_ends_the_outage_it_came_in():
    """A restarted replica's first answers again streamed 137 s on a busy host and were cut by the run's end: the
    outage ran to the run's end (238 s after the kill, its first token 101.9 s after it). The answer is evidence the
    server was there again; the cancel says nothing of it."""
    from vllm_load.client.record import RequestRecord
    from vllm_load.metrics.fleet.outages import find_windows
    from vllm_load.metrics.stats import LLMStats

    stats = LLMStats()
    for k in range(40):  # refused every 0.25 s for 10 s
        stats.add(RequestRecord("chat", 1000.0 + k * 0.25, 0.0, False, error="connection failed: refused"))
    cut = RequestRecord("chat", 1010.2, 50.0, False, error="cancelled after 870 tokens", ttft=0.25,
                        chunk_offsets=[0.25, 49.9], chunk_tokens=[1, 869], cancelled=True)
    stats.add(cut)
    windows = find_windows(stats.ok_buckets, stats.conn_buckets, stats.fail_buckets, 2.0, now=1100.0)
    assert len(windows) == 1 and not windows[0].ongoing
    assert windows[0].start == pytest.approx(1000.0) and windows[0].end == pytest.approx(1010.4)


def test_a_storm_on_one_replica_is_its_own_not_every_targets():
    """--host r1,r2, r2 killed: its two cut streams fail and it refuses; r1 streams long answers whose first tokens
    leave 2.4 s without one. The run's window was "every target: every request failed" (a failure storm) though r1
    never failed: a run-level window is every target's only when each target failed in it too."""
    from vllm_load.client.record import RequestRecord
    from vllm_load.metrics.stats import LLMStats

    stats = LLMStats()

    def add(target: str, rec: RequestRecord) -> None:
        stats.add(rec)
        stats.targeted(target).add(rec)

    add("r1", RequestRecord("chat", 999.0, 20.0, True, ttft=0.5, chunk_offsets=[0.5, 20.0], chunk_tokens=[1, 999]))
    for k in range(2):  # r2's two streams the kill cut, then its refusals
        add("r2", RequestRecord("chat", 995.0, 8.9, False, error="connection closed mid-stream", status=200, ttft=0.2,
                                chunk_offsets=[0.2, 8.9], chunk_tokens=[1, 100]))
    for k in range(8):
        add("r2", RequestRecord("chat", 1006.5 + k * 0.5, 0.0, False, error="connection failed: refused"))
    add("r1", RequestRecord("chat", 1006.2, 20.0, True, ttft=0.1, chunk_offsets=[0.1, 20.0], chunk_tokens=[1, 999]))
    summary = stats.summary(30.0, now=1030.0)
    assert [w.get("target") for w in summary.outages] == ["r2"], summary.outages
    assert not any(w["text"].startswith("every target") for w in summary.outages)
