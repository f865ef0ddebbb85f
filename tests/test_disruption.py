"""A fault plan (--fault, --fault-plan) runs its actions on the run's clock, once, and the disruption verdict says
what each did to the requests: those in flight and what became of them, the requests lost, the time to recovery
within the run's SLOs, the sessions re-homed, the goodput meanwhile; SLOs on them gate the run."""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest

from tests.helpers import ROOT, Proc, counter, run_in_process
from vllm_load.errors import UsageError
from vllm_load.metrics.fleet import router_counters
from vllm_load.metrics.fleet.disruption import WINDOW_S, describe, disruption, limits_of, recovered_at
from vllm_load.metrics.judge.slo import parse_slo, parse_slo_option
from vllm_load.metrics.judge.verdict import judge
from vllm_load.plugin.watch.fault_plan import parse_action, parse_plan
from vllm_load.tune.server import free_port


def rec(start, e2e=0.5, ok=True, target="a", session=None, ttft=0.05, cancelled=False):
    return {"start": start, "e2e": e2e, "ok": ok, "target": target, "session": session, "ttft": ttft,
            "cancelled": cancelled, "good": None}


def fleet(kill_at=10.0, back_at=14.0, end=30.0):
    """Two replicas, a request every 0.25 s on each; b is dead from kill_at to back_at: its requests in flight at
    the kill fail, and those started while it is down fail at once."""
    logs = []
    t = 0.0
    while t < end:
        logs.append(rec(t, target="a", session=f"s{int(t) % 4}"))
        down = kill_at <= t < back_at
        in_flight = t < kill_at < t + 0.5
        logs.append(rec(t, e2e=0.01 if down else 0.5, ok=not (down or in_flight), target="b",
                        session=f"s{4 + int(t) % 4}"))
        t += 0.25
    return logs


def test_the_verdict_counts_what_a_kill_did():
    action = {"start": 10.0, "label": "kill at 10 s: kill -9 b", "ok": True}
    d = disruption(fleet(), [action], {})
    a = d["actions"][0]
    # in flight at 10.0: each replica's requests started at 9.75 (0.5 s each): a's finishes, b's fails
    assert a["in_flight"] == {"requests": 2, "finished": 1, "failed": 1, "cancelled": 0}
    assert a["lost_requests"] == 1 + 16  # and b's 16 requests started while it was down (4 s at 4 a second)
    # b's last failure (started 13.75 s, refused in 10 ms) ended 3.76 s after the kill: from then on nothing failed
    assert a["recovery_s"] == pytest.approx(3.76)
    assert a["recovery_evidence"].startswith("its last failure ended 3.8 s after it; ")
    assert d["recovery_s"] == a["recovery_s"] and d["lost_requests"] == 17
    assert a["goodput_during_fault"] == pytest.approx(16 / 32)  # a's half succeeded meanwhile
    assert a["rehomed_sessions"] == 0  # each session stayed on its replica


#: vllm-router 0.1.17's own counters (--prometheus-port), as it served two emulators before and after one was killed
ROUTER_BEFORE = """# TYPE vllm_router_processed_requests_total counter
vllm_router_processed_requests_total{worker="http://127.0.0.1:18802"} 6
vllm_router_processed_requests_total{worker="http://127.0.0.1:18801"} 4
vllm_router_requests_total{route="/v1/chat/completions"} 10
vllm_router_cb_outcomes_total{worker="http://127.0.0.1:18802",outcome="success"} 6
vllm_router_cb_outcomes_total{worker="http://127.0.0.1:18801",outcome="success"} 4
"""
ROUTER_AFTER = """# TYPE vllm_router_processed_requests_total counter
vllm_router_processed_requests_total{worker="http://127.0.0.1:18802"} 16
vllm_router_processed_requests_total{worker="http://127.0.0.1:18801"} 12
vllm_router_retries_total{route="/v1/chat/completions"} 8
vllm_router_requests_total{route="/v1/chat/completions"} 18
vllm_router_retries_exhausted_total{route="/v1/chat/completions"} 2
vllm_router_cb_state_transitions_total{worker="http://127.0.0.1:18802",from="closed",to="open"} 1
vllm_router_cb_outcomes_total{worker="http://127.0.0.1:18802",outcome="success"} 6
vllm_router_cb_outcomes_total{worker="http://127.0.0.1:18801",outcome="success"} 12
vllm_router_cb_outcomes_total{worker="http://127.0.0.1:18802",outcome="failure"} 10
vllm_router_worker_health{worker="http://127.0.0.1:18802"} 1
"""


def test_the_router_counters_say_what_it_did_about_each_action():
    before, after = router_counters.parse(ROUTER_BEFORE), router_counters.parse(ROUTER_AFTER)
    dead = "http://127.0.0.1:18802"
    grew = router_counters.increase(before, after)
    assert grew["retries"] == 8 and grew["gave_up"] == 2 and grew["failures"] == {dead: 10}
    # served: the breaker's successes (the dead worker's 10 processed requests all failed); attempts: processed
    assert grew["opened"] == {dead: 1} and grew["served"] == {"http://127.0.0.1:18801": 8}
    assert grew["attempts"] == {dead: 10, "http://127.0.0.1:18801": 8}
    # each action: from its start to the next one's start, the last one to the run's end; a failed read is said
    faults = [{"start": 10.0, "label": "kill at 10 s: kill -9 b", "ok": True, "router_at": before},
              {"start": 12.0, "label": "start at 12 s: ./b", "ok": True, "router_at": after},
              {"start": 14.0, "label": "exec at 14 s: true", "ok": True, "router_at": "--router-metrics x cannot "
                                                                                        "be read (refused)"}]
    kept = router_counters.per_action(faults, after)
    assert kept[0]["router"] == grew and "router_at" not in kept[0]
    assert kept[1]["router_error"] == "--router-metrics x cannot be read (refused)"
    assert kept[2]["router_error"] == "--router-metrics x cannot be read (refused)"
    assert router_counters.per_action(faults[:1], None)[0]["router_error"] == "not read at the run's end"
    line = describe(disruption(fleet(), kept[:1], {}))[0]
    assert line.endswith(f"; the router: 8 retries, 2 given up, 10 failures on {dead}, its breaker opened"), line
    secret = router_counters.parse('vllm_router_cb_outcomes_total{worker="http://u:pw@r2:8000",outcome="failure"} 3\n')
    assert secret["failures"] == {"http://r2:8000": 3.0}  # a worker URL's credentials reach no summary or line
    with pytest.raises(ValueError, match="no vllm_router_"):
        router_counters.parse("vllm:num_requests_running 0\n")  # a vLLM's /metrics, not the router's


def test_a_latency_slo_holds_the_recovery_until_the_tail_is_back():
    logs = fleet()
    for r in logs:  # after b's return its answers are slow for 6 s (a cold cache)
        if 14.0 <= r["start"] < 20.0 and r["target"] == "b":
            r["ttft"] = 2.0
    assert recovered_at(logs, 10.0, {}) == pytest.approx(13.76)
    # the last slow answer (started 19.75 s, 0.5 s long) ended at 20.25 s
    assert recovered_at(logs, 10.0, limits_of(parse_slo_option(["ttft.p99<=500ms"]))) == pytest.approx(20.25)


def test_recovery_rests_on_failures_and_breaches_not_on_lulls_in_starts():
    """A drain-restart-undrain with 0 failures was "recovered in 57.5 s"; a kill whose last failure was 0.83 s after
    it, "recovered in 37.0 s"; a kill after which all 12 later requests succeeded, "not recovered"."""
    from vllm_load.metrics.fleet.disruption import recovery

    long = [rec(float(t), e2e=20.0) for t in range(0, 10)]  # 20 s requests, none started from 10 s to 40 s
    back, why = recovery(long + [rec(40.0, e2e=20.0)], 10.0, {})
    assert back == 10.0 and why.startswith("no failure or answer past the limits ended after the action")
    # without a latency SLO, slow answers are not judged, and the evidence says so (a server frozen 4 s by SIGSTOP,
    # every answer late and whole, "recovered in 0.0 s" as if nothing had happened)
    assert why.endswith("; failures only: slow answers are judged with --slo ttft.p99<=... or e2e.p99<=...")
    slow = [rec(10.0 + 0.1 * k, e2e=4.0) for k in range(10)] + [rec(15.0 + k, e2e=0.1) for k in range(10)]
    back, why = recovery(slow, 10.0, limits_of(parse_slo_option(["e2e.p99<=1s"])))
    assert back == pytest.approx(14.9) and "its last answer past the limits ended 4.9 s after it" in why
    assert "failures only" not in why
    kill = [rec(9.5, e2e=0.5, ok=False), rec(10.3, e2e=0.53, ok=False)]  # the last ends 10.83 s
    after = [rec(t, e2e=15.0) for t in (11.0, 12.0, 30.0)]  # then long ones, a lull in starts, all succeeded
    back, why = recovery(kill + after, 10.0, {})
    assert back == pytest.approx(10.83) and "its last failure ended 0.8 s after it; 3 requests succeeded" in why
    twelve = [rec(9.9, e2e=0.2, ok=False)] + [rec(10.5 + 3 * k, e2e=8.0) for k in range(12)]
    assert recovery(twelve, 10.0, {})[0] == pytest.approx(10.1)
    assert recovery([rec(1.0)], 10.0, {}) == (None, "cannot judge: no request ended after the action")
    never = [rec(9.0, e2e=2.0), rec(11.0, e2e=0.1, ok=False)]
    assert recovery(never, 10.0, {})[0] is None and "no request succeeded after its last failure" in \
        recovery(never, 10.0, {})[1]


def test_sessions_that_move_to_another_replica_are_rehomed():
    logs = [rec(1.0, session="x", target="a"), rec(1.0, session="y", target="b"),
            rec(5.0, session="x", target="b"), rec(5.0, session="y", target="b")]
    assert disruption(logs, [{"start": 3.0}], {})["rehomed_sessions"] == 1


def test_a_session_sent_back_to_a_restarted_replica_is_rehomed_by_the_action_whose_window_it_moved_in():
    """Behind a router, a kill at 3 s and a start at 4 s: session z ran on a before the kill, on b after it (moved
    in the kill's window); w ran only after both, on b and then, 20 s on, on the restarted a: the start's re-homing,
    which "one replica before t0 and another after" never counted (all of w's turns were after 4 s)."""
    logs = [rec(1.0, session="z", target="a"), rec(3.5, session="z", target="b"),
            rec(6.0, session="w", target="b"), rec(24.0, session="w", target="a"),
            rec(25.0, session="v", target="b"), rec(26.0, session="v", target="b"),
            rec(27.0, session="u", target=None), rec(28.0, session="u", target="a")]  # no known home, then one
    d = disruption(logs, [{"start": 3.0, "label": "kill"}, {"start": 4.0, "label": "start"}], {})
    assert [a["rehomed_sessions"] for a in d["actions"]] == [1, 1] and d["rehomed_sessions"] == 1


def test_a_fleet_that_never_recovers_fails_its_recovery_slo():
    logs = fleet(back_at=99.0)
    d = disruption(logs, [{"start": 10.0, "label": "kill"}], {})
    assert d["recovery_s"] is None
    summary = {"requests": len(logs), "succeeded": 1, "failed": 0, "usage_missing": 0, "input_drift_requests": 0,
               "disruption": d}
    verdict = judge(summary, [parse_slo("recovery.seconds<=30s"), parse_slo("lost_requests<=1000")])
    assert verdict.exit_code == 3 and [c.passed for c in verdict.checks] == [False, True]
    assert "had not recovered when the run ended" in verdict.checks[0].detail
    with pytest.raises(UsageError, match="belongs to the whole run"):
        parse_slo("lost_requests[turn 2]<=0")


@pytest.mark.parametrize("text,said", [
    ("30s kill pkill vllm", "is not an action: write 'AT: KIND: WHAT'"),
    ("30s: nuke: x", "'nuke' is no action"),
    ("soon: kill: x", "its time 'soon' is not a duration"),
])
def test_a_bad_action_is_one_line(text, said):
    with pytest.raises(UsageError, match=said):
        parse_action(text)


def test_a_plan_file_reads_its_lines_in_time_order(tmp_path):
    plan = tmp_path / "plan.txt"
    plan.write_text("# a rollout\n20s: start: true\n\n5s: kill: true\n")
    assert [(a.at, a.kind) for a in parse_plan(["1m: exec: echo done"], str(plan))] == [
        (5.0, "kill"), (20.0, "start"), (60.0, "exec")]
    with pytest.raises(UsageError, match="line 1:"):
        plan.write_text("later: kill: x\n")
        parse_plan([], str(plan))


@pytest.mark.slow  # processes killed and started on the run's clock: 20 s of a real fleet's life
def test_a_kill_and_restart_of_a_replica_mid_run(tmp_path):
    """Two emulators behind --host a,b; the plan kills b at 3 s and starts it again on its port at 5 s. Every request
    is in one bucket: served by a (= a's own success counter), served by b before the kill or by the restarted b
    (= its counter), failed, or cancelled by the run's end; the verdict names both actions, the requests lost and the
    recovery, and an SLO on the recovery gates it."""
    a = Proc(["-m", "server.emulator", "--port", "0", "--ttft", "0.05", "--itl", "0.02"])
    port = free_port()
    b = Proc(["-m", "server.emulator", "--port", str(port), "--ttft", "0.05", "--itl", "0.02"])
    pidfile = tmp_path / "b2.pid"
    restart = (f"cd {ROOT} && PYTHONPATH={ROOT} {sys.executable} -m server.emulator --port {port} --ttft 0.05 "
               f"--itl 0.02 >/dev/null 2>&1 & echo $! > {pidfile}")
    run_dir = tmp_path / "run"
    try:
        res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "4", "-r", "4", "-t", "20s",
                              "--host", f"{a.url},{b.url}", "--input-tokens", "32", "--output-tokens", "24",
                              "--retry-backoff-max", "0.5s", "--fault", f"3s: kill: kill -9 {b.p.pid}",
                              "--fault", f"5s: start: {restart}", "--run-dir", str(run_dir)], cwd=tmp_path)
        assert pidfile.read_text().strip()  # the restart ran (at 5 s of the 20 s run)
        b2_served = counter(b.url, "vllm:request_success_total")
        a_served = counter(a.url, "vllm:request_success_total")
    finally:
        a.stop()
        b.p.wait(timeout=10)
        if pidfile.exists():
            os.kill(int(pidfile.read_text()), signal.SIGTERM)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]  # b's requests failed (no error SLO)
    assert "fault plan: kill at 3 s" in res.stdout and "fault plan: start at 5 s" in res.stdout
    logs = [json.loads(line) for f in run_dir.glob("requests*.jsonl") for line in f.read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    kill = summary["faults"][0]
    ok_a = [r for r in logs if r["ok"] and r["target"] == a.url]
    ok_b = [r for r in logs if r["ok"] and r["target"] == b.url]
    failed = [r for r in logs if not r["ok"] and not r["cancelled"]]
    cancelled = [r for r in logs if r["cancelled"]]
    assert len(ok_a) + len(ok_b) + len(failed) + len(cancelled) == len(logs) == summary["requests"]
    assert a_served == len(ok_a)  # the replica that stayed: its own count, exactly
    assert b2_served == len([r for r in ok_b if r["start"] > kill["start"]])  # the restarted one's
    assert failed and all(r["target"] == b.url for r in failed)  # only the killed replica's requests failed
    d = summary["disruption"]
    assert [x["label"].split(":")[0] for x in d["actions"]] == ["kill at 3 s", "start at 5 s"]
    first = d["actions"][0]
    assert first["lost_requests"] == len([r for r in failed if r["start"] + r["e2e"] > kill["start"]])
    flight = first["in_flight"]  # each request in flight as the kill began is in one bucket
    assert flight["requests"] == flight["finished"] + flight["failed"] + flight["cancelled"]
    # a request of b's was cut by the kill: in flight while it ran (a busy host's `sh -c` can land the signal well
    # after the action began, when those in flight at its start had finished)
    assert any(r["start"] < kill["end"] and r["start"] + r["e2e"] > kill["start"] for r in failed)
    assert d["recovery_s"] is not None and 0 < d["recovery_s"] < 20 - 3
    assert any(line.startswith("fault: kill at 3 s") for line in res.stdout.splitlines())
    from vllm_load.report.charts import markers
    from vllm_load.rundir.files import load_run
    marks = markers(load_run(run_dir))["faults"]  # every timeline chart marks both actions where they ran
    assert [round(m["from"]) for m in marks] == [3, 5] and all(m["to"] >= m["from"] for m in marks)
    from vllm_load.report.html import build  # re-judged with SLOs on the disruption
    assert build(run_dir, ["recovery.seconds<=60s", "lost_requests<=1000"]).verdict.exit_code == 1
    assert build(run_dir, ["recovery.seconds<=0.01s"]).verdict.exit_code == 3
    assert WINDOW_S == 5.0


@pytest.mark.slow  # actions on the run's clock: 7 s of a fleet's life, in this process
@pytest.mark.parametrize("processes", [0, 2])
def test_a_drained_replica_gets_no_new_request_and_its_users_go_to_the_other(emulator_factory, tmp_path, processes):
    """--host a,b; the plan drains a at 1.5 s and brings it back at 5 s. Meanwhile no request starts on a (a
    swarm's workers hear it from the master: 1 s allowed for the message), a's users send to b (4 users' requests in
    flight at once on b, not b's own 2), and after the undrain a serves again; each replica's own counter equals the
    requests the run logged for it (the records name where each went)."""
    a = emulator_factory("--ttft", "0.05", "--itl", "0.02")
    b = emulator_factory("--ttft", "0.05", "--itl", "0.02")
    run_dir = tmp_path / "run"
    # 3.5 s drained: beside the full suite the swarm's actions came so late that 2.5 s left under a second of window
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "4", "-r", "4", "-t", "8s",
                          "--host", f"{a.url},{b.url}/", "--input-tokens", "32", "--output-tokens", "8",
                          "--fault", f"1.5s: drain: {a.url}/", "--fault", f"5s: undrain: {a.url}",
                          "--run-dir", str(run_dir), *(["--processes", str(processes)] if processes else [])],
                         cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "fault plan: drain at 1.5 s" in res.stdout and "fault plan: undrain at 5 s" in res.stdout
    logs = [json.loads(line) for f in run_dir.glob("requests*.jsonl") for line in f.read_text().splitlines()]
    drain, undrain = (f["start"] for f in json.loads((run_dir / "summary.json").read_text())["summary"]["faults"])
    margin = 1.0 if processes else 0.2
    on_a = [r for r in logs if r["target"] == a.url]
    on_b = [r for r in logs if r["target"] == f"{b.url}/"]
    assert len(on_a) + len(on_b) == len(logs) and all(r["ok"] for r in logs)
    assert not [r for r in on_a if drain + margin < r["start"] < undrain]  # none started on a while drained
    assert [r for r in on_a if r["start"] > undrain + margin]  # and it serves again once back
    middle = [drain + margin + k * 0.05 for k in range(int((undrain - drain - margin) / 0.05))]
    assert middle, (drain, undrain)  # the plan's actions at their times, give or take its margin
    assert max(sum(r["start"] <= t <= r["start"] + r["e2e"] for r in on_b) for t in middle) > 2
    assert counter(a.url, "vllm:request_success_total") == len(on_a)
    assert counter(b.url, "vllm:request_success_total") == len(on_b)


def test_a_drain_names_a_replica_of_the_runs_hosts():
    from vllm_load.plugin.watch.fault_plan import check_targets

    hosts = ("http://127.0.0.1:8001", "http://127.0.0.1:8002")
    (action,) = check_targets([parse_action("2s: drain: http://127.0.0.1:8002/")], hosts)
    assert action.what == hosts[1]  # spelled as --host spells it
    with pytest.raises(UsageError, match="drain takes one of --host's replicas .* give one of http://127.0.0.1:8001"):
        check_targets([parse_action("2s: drain: http://127.0.0.1:9")], hosts)
    with pytest.raises(UsageError, match="undrain takes one of --host's replicas"):
        check_targets([parse_action("2s: undrain: http://127.0.0.1:8001")], hosts[:1])


def test_a_worker_that_gets_ready_after_a_drain_hears_the_drains_in_force():
    """The master keeps what a fault plan drained: a worker joining mid-run (its READY) hears each drain still in
    force, and nothing undrained; the live workers heard each change as it came."""
    from types import SimpleNamespace

    from vllm_load.plugin.swarm import wire

    sent = []
    runner = SimpleNamespace(clients=SimpleNamespace(all=[SimpleNamespace(id="w1", state="running"),
                                                          SimpleNamespace(id="gone", state="missing")]),
                             send_message=lambda kind, data, client_id: sent.append((kind, data, client_id)))
    run = SimpleNamespace(drained=set(), generator=None)
    a, b = "http://127.0.0.1:8001", "http://127.0.0.1:8002"
    for target, drained in ((a, True), (b, True), (b, False)):
        wire.route(run, runner, target, drained)
    assert [(d["target"], d["drained"], cid) for _, d, cid in sent] == [(a, True, "w1"), (b, True, "w1"),
                                                                        (b, False, "w1")]
    sent.clear()
    wire.tell_drained(run, runner, "w2")
    assert sent == [(wire.DRAIN, {"target": a, "drained": True}, "w2")]
