"""Where each request's time went (metrics/shape/breakdown.py): the server's own times of each request (vLLM's per-request
metrics; the emulator sends the same) joined to the client's timeline, the tails split into queue, prefill, decode
and the client's rest, SLOs on the parts; against the emulator here, against a real vLLM in
test_real_vllm.py (test_every_request_of_a_real_vllm_carries_its_server_parts)."""

from __future__ import annotations

import json
import statistics

import pytest

from tests.helpers import ROOT, run_in_process
from vllm_load.rundir.reqlog import read_log

CHAT = str(ROOT / "locustfiles" / "chat.py")


def _run(tmp_path, *args):
    run_dir = tmp_path / "run"
    # --allow-untrustworthy: what is checked is the server's times and their split, not the client's timekeeping
    # the server's parts against the client's: the emulator on its own loop (sharing the client's, its write delays
    # were the client's overhead)
    res = run_in_process(["-f", CHAT, "--headless", "-r", "16", "--allow-untrustworthy", "--run-dir", str(run_dir), *args],
                         tmp_path, timeout=180, emulator_process=True)
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    return res, read_log(run_dir / "requests.jsonl"), summary


def test_the_default_target_gives_every_request_its_server_parts(tmp_path):
    res, logs, summary = _run(tmp_path, "-u", "4", "-t", "5s", "--output-tokens", "16")
    assert res.returncode == 0, res.stdout[-2000:]
    ok = [r for r in logs if r["ok"]]
    assert ok and all(r["server_queue"] is not None and r["server_prefill"] is not None for r in ok)
    # the server's TTFT is inside the client's: what is left is the network, the API server (here: loopback)
    assert all(r["client_overhead"] >= -0.0005 and r["server_ttft"] <= r["ttft"] + 0.0005 for r in ok)
    # the decode the server says took place between its first and last token is what the client saw between them
    gaps = [abs((r["chunk_offsets"][-1] - r["chunk_offsets"][0]) - r["server_decode"]) for r in ok]
    assert statistics.median(gaps) <= 0.001, statistics.median(gaps)
    assert summary["timing"]["requests"] == len(ok)
    assert "where TTFT p99" in res.stdout


def test_a_small_server_s_tail_is_its_queue_and_an_slo_on_the_queue_fails(tmp_path):
    res, _logs, summary = _run(tmp_path, "-u", "16", "-t", "6s", "--emulator-profile", "cpu-tiny",
                               "--emulator-max-num-seqs", "2", "--output-tokens", "16", "--slo",
                               "server_queue.p99<=10ms")
    split = summary["timing"]["tails"]["ttft"]["p99"]["split"]
    assert split["server_queue"] > 0.5 * sum(split.values()), split  # 16 users, 2 sequences at a time: a queue
    assert res.returncode == 3 and "FAIL  server_queue.p99<=10ms" in res.stdout, res.stdout[-2000:]


@pytest.mark.slow  # a quiet test of seconds: the full suite's (the fast selection's quiet tail is serial)
@pytest.mark.quiet_cores  # which part of the time is the largest: a starved client's overhead can outgrow a prefill
def test_long_prompts_tail_is_the_prefill(tmp_path):
    res, _logs, summary = _run(tmp_path, "-u", "1", "-t", "6s", "--emulator-profile", "cpu-tiny", "--input-tokens",
                               "3000", "--output-tokens", "4", "--slo", "server_prefill.p50>=1ms")
    split = summary["timing"]["tails"]["ttft"]["p99"]["split"]
    assert split["server_prefill"] > split["server_queue"] and split["server_prefill"] > split["client_overhead"], split
    assert res.returncode == 0, res.stdout[-2000:]


def test_tails_are_split_per_replica_and_per_name_where_there_are_several():
    from vllm_load.metrics.shape.breakdown import breakdown, tail_lines
    records = []
    for i in range(200):  # replica b queues, replica a does not; names alternate
        slow = i % 2 == 1
        queue = 0.3 if slow else 0.001
        records.append({"ok": True, "ttft": queue + 0.06, "e2e": queue + 0.5, "server_queue": queue,
                        "server_prefill": 0.05, "server_decode": 0.44, "server_ttft": queue + 0.05,
                        "client_overhead": 0.01, "replica": "b" if slow else "a", "name": f"turn {i % 4}"})
    b = breakdown(records)
    assert set(b["by_replica"]) == {"a", "b"} and set(b["by_name"]) == {"turn 0", "turn 1", "turn 2", "turn 3"}
    split_b = b["by_replica"]["b"]["tails"]["ttft"]["p99"]["split"]
    split_a = b["by_replica"]["a"]["tails"]["ttft"]["p99"]["split"]
    assert abs(split_b["server_queue"] - 0.3) < 1e-9 and abs(split_a["server_queue"] - 0.001) < 1e-9
    assert b["by_replica"]["a"]["requests"] == b["by_replica"]["b"]["requests"] == 100
    lines = tail_lines(b)
    assert any(line.startswith("TTFT p99 per replica: a 61.0 ms (1.0 queue") for line in lines), lines
    one = breakdown([{**r, "replica": "a", "name": None} for r in records])
    assert "by_replica" not in one and "by_name" not in one  # one group is the run itself


def test_the_spans_split_the_api_servers_share_from_what_lies_outside_the_server():
    """A span's TTFT runs from the request's arrival at the API server: beyond the engine's queue and prefill it is
    the API server's (input processing, the engine busy between steps), the rest of the client's TTFT the client's,
    the network's and the router's. Without spans the rest keeps one name that says all it holds."""
    from vllm_load.metrics.shape.breakdown import breakdown, tail_lines

    def rec(ttft: float, span_ttft: float | None) -> dict:
        r = {"ok": True, "ttft": ttft, "e2e": ttft + 0.2, "server_queue": 0.01, "server_prefill": 0.03,
             "server_decode": 0.2, "server_ttft": 0.04, "client_overhead": ttft - 0.04}
        return {**r, "span_ttft": span_ttft} if span_ttft is not None else r

    starved = breakdown([rec(0.5, 0.05)] * 20)["tails"]["ttft"]["p99"]["split"]  # a client late to read
    assert starved["outside"] == pytest.approx(0.45) and starved["api_server"] == pytest.approx(0.01)
    busy = breakdown([rec(0.4, 0.38)] * 20)  # an API server that held each request 340 ms before the engine
    split = busy["tails"]["ttft"]["p99"]["split"]
    assert split["api_server"] == pytest.approx(0.34) and split["outside"] == pytest.approx(0.02)
    assert max(split, key=split.get) == "api_server"
    e2e = busy["tails"]["e2e"]["p99"]["split"]
    assert sum(e2e.values()) == pytest.approx(0.6) and e2e["api_server"] == pytest.approx(0.34)
    assert "340.0 API server, 20.0 client/network/router ms" in "\n".join(tail_lines(busy))
    plain = breakdown([rec(0.4, None)] * 20)  # no spans: one remainder, named for all it holds
    assert "360.0 client/network/router/API server ms" in "\n".join(tail_lines(plain))


def test_a_spans_start_splits_the_way_to_the_server_from_the_clients_side():
    """The span starts at the request's arrival at the API server: its start less the request's send (intended
    start and send lag) is the network's and a router's; the rest outside the server is the client's (its send lag,
    the answer's way back, the read). A router that holds each request 150 ms shows there, not in the client's part;
    a client late to send shows in its own."""
    from vllm_load.metrics.shape.breakdown import breakdown, tail_lines
    from vllm_load.metrics.fleet.spans import join

    def rec(i: int, send_lag: float) -> dict:
        return {"ok": True, "trace_id": f"t{i}", "start": 100.0 + i, "send_lag": send_lag, "ttft": 0.4 + send_lag,
                "e2e": 0.6 + send_lag}

    def span(i: int, arrival: float) -> dict:
        return {"trace_id": f"t{i}", "start": 100.0 + i + arrival, "ttft": 0.2, "e2e": 0.4, "queue": 0.01,
                "prefill": 0.03, "decode": 0.2}

    routed = [rec(i, 0.0) for i in range(20)]
    join(routed, [span(i, 0.15) for i in range(20)])  # a router held each 150 ms on the way
    split = breakdown(routed)["tails"]["ttft"]["p99"]["split"]
    assert split["before_server"] == pytest.approx(0.15) and split["client_side"] == pytest.approx(0.05)
    assert split["api_server"] == pytest.approx(0.16) and sum(split.values()) == pytest.approx(0.4)
    assert "150.0 network/router to the server" in "\n".join(tail_lines(breakdown(routed)))
    late = [rec(i, 0.3) for i in range(20)]  # a client that sent each 300 ms late: its own part, not the network's
    join(late, [span(i, 0.3 + 0.005) for i in range(20)])
    split = breakdown(late)["tails"]["ttft"]["p99"]["split"]
    assert split["before_server"] == pytest.approx(0.005) and split["client_side"] == pytest.approx(0.495)
    e2e = breakdown(late)["tails"]["e2e"]["p99"]["split"]
    assert sum(e2e.values()) == pytest.approx(0.9) and e2e["before_server"] == pytest.approx(0.005)


def test_a_tail_whose_server_parts_exceed_the_clients_time_prints_no_negative_share():
    """A breakdown printed "-10.0 client": the server's parts were longer than the client's own E2E."""
    from vllm_load.metrics.shape.breakdown import breakdown, tail_lines

    records = [{"ok": True, "ttft": 0.05, "e2e": 0.40, "server_queue": 0.01, "server_prefill": 0.04,
                "server_decode": 0.36, "server_ttft": 0.05, "client_overhead": 0.0} for _ in range(50)]
    lines = [line for line in tail_lines(breakdown(records)) if line.startswith("where E2E")]
    assert lines and all(" -" not in line for line in lines), lines
    assert "exceed the client's time by 10.0 ms" in lines[0] and "0.0 client" in lines[0]
