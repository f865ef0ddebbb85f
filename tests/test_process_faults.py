"""Faults of whole processes: master stopped by a signal, server killed and restarted, worker killed.

Each waits for conditions it can observe (lines in the per-request logs), with deadlines, never for time.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.helpers import ROOT, Proc, free_port, swarm_port, wait_for
from vllm_load.rundir.reqlog import read_log


def _sigint_as_in_a_terminal() -> None:
    """In the child before exec: SIGINT back to its default. A shell's background job (``.ci/run &``) starts
    with SIGINT ignored, which Python and every child keep: Ctrl-C then did nothing, and the SIGINT tests
    failed only when the suite itself ran in the background."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def locust(args: list[str], cwd: Path, session: bool = False, **env_extra: str) -> subprocess.Popen:
    """``session``: in a session (and process group) of its own, as a terminal's foreground job is."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), **env_extra)
    return subprocess.Popen([sys.executable, "-m", "locust", *swarm_port(args)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_sigint_as_in_a_terminal, start_new_session=session)


def log_files(run_dir: Path, pattern: str = "requests*.jsonl") -> list[Path]:
    """The request logs so far. A run's pre-run write check makes its folder and removes it again (a run
    refused there leaves nothing behind), so the folder can go between glob's check and its scandir."""
    try:
        return sorted(run_dir.glob(pattern))
    except FileNotFoundError:
        return []


def logs(run_dir: Path) -> list[dict]:
    out = []
    for f in log_files(run_dir):
        try:
            out += read_log(f)
        except FileNotFoundError:
            return []
    return out



@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_master_stopped_by_a_signal_leaves_a_complete_run_dir(tmp_path, emulator_factory, sig):
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.005")
    run_dir = tmp_path / "run"
    p = locust(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "3", "-r", "3", "-t", "120s",
                "--host", emu.url, "--output-tokens", "16", "--run-dir", str(run_dir)], tmp_path)
    try:
        wait_for(lambda: len(logs(run_dir)) >= 10, what="10 finished requests")
        p.send_signal(sig)
        out, err = _ended(p, sig)
    finally:
        if p.poll() is None:
            p.kill()
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert summary["requests"] == len(logs(run_dir)) >= 10 and summary["failed"] == 0
    assert (run_dir / "report.html").exists() and "vllm-load LLM metrics" in out


@pytest.mark.parametrize("extra,sig", [([], signal.SIGINT), (["--processes", "2"], signal.SIGINT),
                                       (["--processes", "2"], signal.SIGTERM)],
                         ids=["embedded emulator, SIGINT", "two processes, SIGINT", "two processes, SIGTERM"])
def test_a_signal_to_the_whole_process_group_ends_the_run_as_one_to_locust_does(tmp_path, extra, sig):
    """Ctrl-C in a terminal signals its whole foreground group: the embedded emulator died with the client while it
    drained (2 requests failed mid-stream, exit 1), and --processes' workers quit without their final reports (a
    summary of 6 beside logs of 10). The group signalled (``kill -INT -- -PGID``): exit 0, nothing failed, the
    summary equal to the logs."""
    run_dir = tmp_path / "run"
    p = locust(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "4", "-r", "4", "-t", "120s",
                "--output-tokens", "16", "--run-dir", str(run_dir), "--allow-untrustworthy", *extra], tmp_path,
               session=True)
    try:
        wait_for(lambda: len(logs(run_dir)) >= 10, timeout=120, what="10 finished requests")
        os.killpg(p.pid, sig)
        out, err = _ended(p, sig)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    # cut short of its -t 120s: a gate reads "interrupted" (exit 7), in every output
    assert p.returncode == 7, out[-2000:] + err[-3000:]
    data = json.loads((run_dir / "summary.json").read_text())
    summary = data["summary"]
    assert summary["requests"] == len(logs(run_dir)) >= 10 and summary["failed"] == 0, (summary["requests"],
                                                                                        summary["failed"])
    assert data["interrupted"] is True and data["exit_code"] == 7
    assert summary["features"]["interrupted"]["by"] == sig.name and summary["features"]["interrupted"]["asked"] == "-t 120s"
    assert f"INTERRUPTED: {sig.name} ended the run at" in out and "(exit code 7)" in out
    assert "INTERRUPTED" in (run_dir / "summary.md").read_text() and "INTERRUPTED" in (run_dir / "report.html").read_text()
    assert "Traceback" not in err, err[-3000:]


@pytest.mark.parametrize("extra,sig", [([], signal.SIGINT), (["--processes", "2"], signal.SIGINT),
                                       (["--processes", "2"], signal.SIGTERM)],
                         ids=["one process, SIGINT", "two processes, SIGINT", "two processes, SIGTERM"])
def test_a_second_ctrl_c_cuts_the_drain_and_still_writes_the_summary(tmp_path, emulator_factory, extra, sig):
    """Ctrl-C twice while requests of 4 s are in flight: the second one raised out of the drain (a traceback, no
    summary.json). Now it cuts them: the run ends without waiting, they are counted as cancelled (failed, exit 1, as
    the drain's timeout counts them), and the summary equals the logs; a swarm's workers cut theirs too."""
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.01")
    run_dir = tmp_path / "run"
    p = locust(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "4", "-r", "4", "-t", "120s",
                "--host", emu.url, "--output-tokens", "400", "--run-dir", str(run_dir), "--allow-untrustworthy",
                *extra], tmp_path, session=True)
    try:
        said = []
        # a request done (the run measured something), and one in flight
        wait_for(lambda: len(logs(run_dir)) >= 1 and _running(emu.url) >= 1, timeout=50,
                 what="a request done and one in flight")
        os.killpg(p.pid, sig)
        for line in p.stdout:  # the first signal's drain has begun
            said.append(line)
            if "vllm-load: stopping: waiting for" in line:
                break
        os.killpg(p.pid, sig)
        out, err = _ended(p, sig)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert "Traceback" not in err and "the requests still in flight are cut" in err, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    cut = [r for r in logs(run_dir) if r.get("cancelled")]
    assert summary["requests"] == len(logs(run_dir)) and summary["failed"] == len(cut) >= 1, (summary["failed"],
                                                                                              len(cut))
    assert p.returncode == 7, "".join(said)[-2000:] + out[-2000:]  # interrupted comes first (its cut requests failed)


def _running(url: str) -> float:
    """vLLM's vllm:num_requests_running on the emulator's /metrics."""
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_running"))


def _ended(p: subprocess.Popen, sig: signal.Signals, timeout: float = 90) -> tuple[str, str]:
    """The process's output once it ended after ``sig``; a failure quoting its log if it did not."""
    try:
        return p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"still running {timeout:.0f} s after {sig.name}: {out[-1500:]}\n{err[-3000:]}")


BUSY = """
import os, time
import gevent
from locust import events
from vllm_load.locustfiles.chat import *  # noqa: F401,F403

def busy():  # a task's CPU-bound stretch: Ctrl-C must not cut it (nor a hub callback) mid-way
    mark = os.environ["BUSY_MARK"]
    try:
        open(mark, "w").write("busy\\n")
        end = time.perf_counter() + 2.0
        while time.perf_counter() < end:
            pass
        open(mark, "a").write("done\\n")
    except KeyboardInterrupt:
        open(mark, "a").write("interrupted\\n")
        raise

@events.test_start.add_listener
def _start(**_kw):
    gevent.spawn_later(1.0, busy)
"""


def test_ctrl_c_stops_the_run_where_the_main_greenlet_waits_not_in_the_middle_of_a_task(tmp_path, emulator_factory):
    # Python's own SIGINT handler raised KeyboardInterrupt in whatever ran next: a greenlet mid-task, or a hub
    # callback handing finished streams over (their requests then never woke, and the drain waited for them)
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.005")
    (tmp_path / "busy.py").write_text(BUSY)
    mark = tmp_path / "mark"
    run_dir = tmp_path / "run"
    p = locust(["-f", str(tmp_path / "busy.py"), "--headless", "-u", "2", "-r", "2", "-t", "120s", "--host", emu.url,
                "--output-tokens", "8", "--run-dir", str(run_dir), "--allow-untrustworthy",  # the busy stretch lags
                "--allow-interrupted"],  # the signal is how this run ends
               tmp_path, BUSY_MARK=str(mark))
    try:
        wait_for(lambda: mark.exists() and mark.read_text() == "busy\n", what="the busy stretch")
        p.send_signal(signal.SIGINT)  # lands while the busy greenlet holds the loop
        out, err = _ended(p, signal.SIGINT)
    finally:
        if p.poll() is None:
            p.kill()
    assert mark.read_text() == "busy\ndone\n"  # the stretch ran to its end; the stop came after it
    assert p.returncode == 0, err[-2000:]
    assert "Traceback" not in err and "vllm-load LLM metrics" in out
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert summary["requests"] == len(logs(run_dir)) and summary["failed"] == 0


def test_server_killed_and_restarted_mid_run(tmp_path):
    port = free_port()
    args = ["-m", "server.emulator", "--port", str(port), "--ttft", "0.01", "--itl", "0.01"]
    server = Proc(args)
    run_dir = tmp_path / "run"
    p = locust(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "3", "-r", "3", "-t", "120s",
                "--host", server.url, "--output-tokens", "30", "--csv", str(tmp_path / "locust"),
                "--run-dir", str(run_dir)], tmp_path)
    try:
        wait_for(lambda: len(logs(run_dir)) >= 6, what="requests before the kill")
        server.p.kill()
        server.p.wait(timeout=10)
        wait_for(lambda: sum(not r["ok"] for r in logs(run_dir)) >= 3, what="failures while the server is down")
        server = Proc(args)  # the same port again
        down = len(logs(run_dir))
        wait_for(lambda: sum(r["ok"] for r in logs(run_dir)[down:]) >= 6, what="successes after the restart")
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=90)
    finally:
        server.stop()
        if p.poll() is None:
            p.kill()
    all_logs = logs(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    with open(tmp_path / "locust_stats.csv") as fh:
        agg = [r for r in csv.DictReader(fh) if r["Name"] == "Aggregated"][0]
    assert summary["requests"] == len(all_logs) == int(agg["Request Count"])
    assert summary["failed"] == sum(not r["ok"] for r in all_logs) == int(agg["Failure Count"]) >= 3
    reasons = {r["error"] for r in all_logs if not r["ok"]}
    assert all(x.startswith(("connection failed", "connection closed mid-stream", "connection error")) for x in reasons), reasons


def _swarm(tmp_path: Path, emulator_factory: Any, run_dir: Path, expect: int, *extra: str
           ) -> tuple[subprocess.Popen, Callable[[], subprocess.Popen]]:
    """A master on 127.0.0.1 (4 users, -t 120s, against a fresh emulator) and how to start one of its workers."""
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.005")
    mport = free_port()
    master = locust(["-f", str(ROOT / "locustfiles/chat.py"), "--master", "--master-bind-host", "127.0.0.1",
                     "--master-bind-port", str(mport), "--headless", "--expect-workers", str(expect), "-u", "4",
                     "-r", "4", "-t", "120s", "--host", emu.url, "--output-tokens", "16", "--run-dir", str(run_dir),
                     *extra], tmp_path)
    return master, lambda: locust(["-f", str(ROOT / "locustfiles/chat.py"), "--worker", "--master-host", "127.0.0.1",
                                   "--master-port", str(mport)], tmp_path)


def test_worker_killed_mid_run_the_master_goes_on_and_says_so(tmp_path, emulator_factory):
    run_dir = tmp_path / "run"
    master, worker = _swarm(tmp_path, emulator_factory, run_dir, 2, "--drain-timeout", "60", "--allow-interrupted")
    workers = [worker(), worker()]
    try:
        wait_for(lambda: len(log_files(run_dir, "requests-*.jsonl")) == 2
                 and all(read_log(f) for f in log_files(run_dir, "requests-*.jsonl")), what="both workers sending")
        # a worker's client id does not name its process: kill one, and the log that stops growing is its
        workers[0].kill()
        workers[0].wait(timeout=10)
        logs_before = {f: len(read_log(f)) for f in run_dir.glob("requests-*.jsonl")}
        wait_for(lambda: any(len(read_log(f)) >= n + 10 for f, n in logs_before.items()), what="survivor goes on")
        master.send_signal(signal.SIGTERM)
        # the dead worker is marked missing by Locust's heartbeat within seconds: the master must not
        # wait the drain timeout (60 s) for its answer
        out, err = master.communicate(timeout=40)
    finally:
        for proc in [master, *workers]:
            if proc.poll() is None:
                proc.kill()
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    per_worker = {f: read_log(f) for f in run_dir.glob("requests-*.jsonl")}
    stopped = [f for f, rows in per_worker.items() if len(rows) == logs_before[f]]
    assert len(stopped) == 1, "exactly one worker stopped writing"
    lost_id = per_worker[stopped[0]][0]["worker"]
    assert summary["workers_lost"] == [lost_id]
    at = summary["workers_lost_at"][lost_id]  # when it went silent (None: killed before its first 3 s report)
    assert at is None or 0 < at < time.time() - summary_start(run_dir)
    assert "worker(s) lost mid-run" in out
    assert master.returncode == 5  # a gate does not pass on a run that lost a worker
    said = "(never reported)" if at is None else f"(last report {at:.1f} s into the run)"
    assert f"{lost_id} {said}" in json.loads((run_dir / "summary.json").read_text())["trust"]["detail"]
    assert "id='workers-lost'" in (run_dir / "report.html").read_text()
    survivor = [rows for f, rows in per_worker.items() if f not in stopped][0]
    # everything the survivor did is counted; the lost worker's unreported tail is not
    assert len(survivor) <= summary["requests"] <= len(survivor) + len(per_worker[stopped[0]])


def test_timing_a_killed_masters_worker_says_so_and_stops_at_the_silence_limit(tmp_path, emulator_factory):
    """The master killed -9 mid-run: its remote worker said nothing for 15 s while its users went on sending, then
    Locust's "Didn't get heartbeat". It now says, 5 s into the silence, how long its users go on and when it stops;
    and it stops there: no request starts past the limit (timing is the subject: bounds of seconds)."""
    from vllm_load.plugin.lifecycle.worker import MASTER_SILENCE_S, SILENCE_SAID_S

    run_dir = tmp_path / "run"
    master, worker = _swarm(tmp_path, emulator_factory, run_dir, 1)
    remote = worker()
    try:
        wait_for(lambda: any(read_log(f) for f in log_files(run_dir, "requests-*.jsonl")), what="the worker sending")
        master.kill()
        killed = time.time()
        master.wait(timeout=10)
        out, err = remote.communicate(timeout=MASTER_SILENCE_S + 30)
        gone = time.time()
    finally:
        for proc in (master, remote):
            if proc.poll() is None:
                proc.kill()
    text = out + err
    assert f"no word from the master for over {SILENCE_SAID_S:g} s (killed, or its host busy)" in text, text[-3000:]
    assert f"until {MASTER_SILENCE_S} s of silence, then this worker stops" in text
    assert "Didn't get heartbeat from master" in text and gone - killed < MASTER_SILENCE_S + 15
    rows = [r for f in log_files(run_dir, "requests-*.jsonl") for r in read_log(f)]
    assert rows and max(r["start"] for r in rows) < killed + MASTER_SILENCE_S + 2


def summary_start(run_dir):
    return json.loads((run_dir / "llm_stats.json").read_text())["start"]


def test_a_worker_joining_mid_run_gets_users_and_its_numbers_merge_exactly(tmp_path, emulator_factory):
    """Locust gives a worker that joins a running swarm its share of the users; it gets the run plan and the
    run's epoch like the first ones, and the master's totals equal both workers' logs (nothing counted twice,
    nothing lost)."""
    run_dir = tmp_path / "run"
    # the joiner starts (tokenizer, pools: CPU) on the 2 cores the running worker times its streams on; the verdict
    # may rightly call that untrustworthy (1 run in 8 here: a 79 ms loop lag). Joins in a real swarm come on
    # machines of their own; what this test checks is the merge
    master, worker = _swarm(tmp_path, emulator_factory, run_dir, 1, "--allow-untrustworthy", "--allow-interrupted")
    workers = [worker()]
    try:
        wait_for(lambda: [f for f in log_files(run_dir, "requests-*.jsonl") if read_log(f)], what="the first worker")
        workers.append(worker())  # joins the running swarm
        wait_for(lambda: len([f for f in log_files(run_dir, "requests-*.jsonl") if len(read_log(f)) >= 20]) == 2,
                 timeout=90, what="the joining worker sending its share")
        master.send_signal(signal.SIGTERM)
        out, err = master.communicate(timeout=60)
    finally:
        for proc in [master, *workers]:
            if proc.poll() is None:
                proc.kill()
    assert master.returncode == 0, out[-3000:] + err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    per_worker = [read_log(f) for f in run_dir.glob("requests-*.jsonl")]
    assert len(per_worker) == 2 and all(len(rows) >= 20 for rows in per_worker)
    # the join rebalances the users: one the first worker gives up mid-request is logged as removed, not measured
    measured = [r for rows in per_worker for r in rows if not r.get("warmup") and not r.get("removed")]
    assert summary["requests"] == len(measured) and summary["failed"] == 0
    assert summary["output_tokens"] == sum(r["output_tokens"] for r in measured)
    assert not summary.get("workers_lost") and len(summary["clock"]) == 2  # the joiner measured its offset too


def test_a_processes_master_gives_up_on_a_worker_that_never_joins(monkeypatch):
    """Once a --processes run waited at "1 of 2 connected" for ever; its master now waits PROCESSES_JOIN_S for its
    own workers (Locust's --expect-workers-max-wait, then its "Gave up waiting" and exit 1), and a wait the user
    gave is kept."""
    from argparse import Namespace

    from tests.helpers import free_port
    from vllm_load.plugin.prepare import ports

    for given, kept in ((0, ports.PROCESSES_JOIN_S), (300, 300)):
        monkeypatch.setattr(ports, "_settled", [])
        opts = Namespace(processes=2, worker=False, master=False, master_bind_port=free_port(),
                         master_port=ports.DEFAULT_PORT, master_bind_host="127.0.0.1", expect_workers_max_wait=given)
        ports.settle(opts)
        assert opts.expect_workers_max_wait == kept and opts.master_port == opts.master_bind_port
