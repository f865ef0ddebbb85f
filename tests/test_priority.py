"""Priority classes against the emulator's vLLM scheduling (``--scheduling-policy``): an interactive class beside a
batch class on a server that runs one sequence at a time. Under ``priority`` the interactive requests wait for the
sequence running when they arrive and no more; under ``fcfs`` they queue behind the batch class too. The body's
``priority`` is the request's own (``self.llm.chat(..., priority=N)``), so the same run measures both policies."""

from __future__ import annotations

import json
import statistics

import pytest

from tests.helpers import ROOT, run_in_process, waited_behind
from vllm_load.features.protection import describe
from vllm_load.metrics.judge.protection import MIN_REQUESTS, protection
from vllm_load.metrics.judge.slo import evaluate, parse_slo_option
from vllm_load.rundir.reqlog import read_log


def _queues(tmp_path, emulator_factory, policy: str) -> dict[str, list[float]]:
    """Each class's server-side queue times (the emulator's per-request metrics) in a count-ended run."""
    emu = emulator_factory("--profile", "cpu-tiny", "--max-num-seqs", "1", "--scheduling-policy", policy,
                           "--enable-per-request-metrics")
    run_dir = tmp_path / policy
    res = run_in_process(["-f", str(ROOT / "tests/locustfiles/priority.py"), "--headless", "-u", "4", "-r", "4",
                          "-t", "60s", "--num-requests", "40", "--host", emu.url, "--run-dir", str(run_dir)],
                         cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out: dict[str, list[float]] = {"interactive": [], "batch": []}
    for r in read_log(run_dir / "requests.jsonl"):
        if r["ok"]:
            out[r["name"]].append(r["server_queue"])
    return out


@pytest.mark.slow  # two runs against emulator processes (7 s): the order itself is tested in test_scheduler.py
@pytest.mark.quiet_cores  # the emulator's own queue times are the subject: a busy host made fcfs and priority alike
def test_the_priority_policy_keeps_the_interactive_class_out_of_the_batch_queue(tmp_path, emulator_factory):
    fcfs = _queues(tmp_path, emulator_factory, "fcfs")
    prio = _queues(tmp_path, emulator_factory, "priority")
    for q in (fcfs, prio):
        assert len(q["interactive"]) >= 5 and len(q["batch"]) >= 10, {k: len(v) for k, v in q.items()}
    # three batch users keep a queue of two behind the running one: under fcfs an interactive request waits for
    # them too, under priority only for the one running (one batch request's time at most). Measured: 26 ms against
    # 176 ms (batch 158 ms); beside two busy loops 17 and 53 ms against 165 and 163 ms
    fcfs_i, prio_i = statistics.mean(fcfs["interactive"]), statistics.mean(prio["interactive"])
    assert prio_i < 0.6 * fcfs_i, (prio_i, fcfs_i)
    assert prio_i < statistics.mean(prio["batch"]), (prio_i, statistics.mean(prio["batch"]))


def _req(name, start, ttft, gaps=(0.01, 0.01), ok=True):
    offsets = [ttft]
    for g in gaps:
        offsets.append(offsets[-1] + g)
    return {"name": name, "start": start, "ttft": ttft, "e2e": offsets[-1], "chunk_offsets": offsets, "ok": ok}


def test_the_protected_class_alone_against_beside_the_others():
    # 20 interactive requests alone (ttft 20 ms), a batch from 10 s, then 20 beside it (ttft 50 ms, gaps 12 ms);
    # one that began alone and ended after the batch began is on neither side
    logs = [_req("interactive", 0.5 * i, 0.02) for i in range(20)]
    logs += [_req("interactive", 9.99, 0.02), _req("batch", 10.0, 0.5, (0.05,) * 8)]
    logs += [_req("interactive", 10.0 + 0.5 * i, 0.05, (0.012, 0.012)) for i in range(20)]
    p = protection(logs, "interactive")
    assert p["alone"]["requests"] == 20 and p["beside"]["requests"] == 20
    assert p["ttft_penalty"] == pytest.approx(0.05 / 0.02 - 1) and p["itl_penalty"] == pytest.approx(0.2)
    assert describe(p).startswith("interactive beside the other classes: TTFT p99 +150% (20.0 ms alone, 50.0 ms "
                                  "beside), ITL p99 +20% (10.0 ms alone, 12.0 ms beside)")
    checks = evaluate(parse_slo_option(["ttft_penalty<=100%", "itl_penalty<=50%"]), {"features": {"protection": p}})
    assert [c.passed for c in checks] == [False, True] and checks[0].detail == "measured 150.00%"


def test_a_side_too_small_or_no_other_class_is_not_judged():
    few = [_req("interactive", 0.5 * i, 0.02) for i in range(MIN_REQUESTS - 1)] + [_req("batch", 10.0, 0.5)]
    few += [_req("interactive", 10.0 + i, 0.05) for i in range(MIN_REQUESTS)]
    p = protection(few, "interactive")
    assert p["ttft_penalty"] is None and p["why"].startswith("alone: fewer than 10")
    check, = evaluate(parse_slo_option(["ttft_penalty<=50%"]), {"features": {"protection": p}})
    assert not check.passed and check.detail.startswith("cannot judge: alone: fewer than 10")
    alone = protection([_req("interactive", i, 0.02) for i in range(30)], "interactive")
    assert alone["why"] == "no request but interactive's ran: nothing to compare against"
    check, = evaluate(parse_slo_option(["ttft_penalty<=50%"]), {})
    assert check.detail == "cannot judge: no class protected (--protect NAME)"
    # a name no request carries (a typo) says so, with the names the run gave (it said "fewer than 10 of nobody's")
    typo = protection(few, "interactiv")
    assert typo["why"] == "no request was named 'interactiv': --protect takes a request name the run gave (batch, interactive)"
    check, = evaluate(parse_slo_option(["ttft_penalty<=50%"]), {"features": {"protection": typo}})
    assert not check.passed and "no request was named 'interactiv'" in check.detail


def _mixed(tmp_path, emulator_factory, policy: str) -> tuple[dict, list[dict]]:
    """mixed.py against an emulator that runs one sequence at a time under ``policy``: the verdict of its run, and
    its requests."""
    emu = emulator_factory("--profile", "cpu-tiny", "--max-num-seqs", "1", "--scheduling-policy", policy)
    run_dir = tmp_path / policy
    res = run_in_process(["-f", str(ROOT / "locustfiles/mixed.py"), "--headless", "-u", "4", "-r", "4", "-t", "11s",
                          "--batch-after", "5s", "--input-tokens", "32", "--output-tokens", "8",
                          "--batch-input-tokens", "256", "--batch-output-tokens", "32", "--protect", "interactive",
                          "--host", emu.url, "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "protection: interactive beside the other classes: TTFT p99 " in res.stdout
    return (json.loads((run_dir / "summary.json").read_text())["summary"]["features"]["protection"],
            read_log(run_dir / "requests.jsonl"))


@pytest.mark.slow  # two 11 s runs against emulator processes: the verdict's arithmetic is the test above
def test_mixed_py_shows_what_the_priority_policy_protects(tmp_path, emulator_factory):
    """mixed.py's verdict is judged on both sides under both policies, and the order the emulator kept is the
    policy's: under fcfs an interactive request queued behind the batch's waiting requests (three batch users, one
    sequence at a time: up to three ahead), under priority behind the running one only. The penalty's size is the
    latencies' (beside the full suite, on 2 cores, the two policies' p99 penalties came out equal once: +1,319 % and
    +1,337 %): the real-vLLM test (test_real_vllm_scheduler.py) compares the verdicts."""
    (fcfs, fcfs_logs), (prio, prio_logs) = (_mixed(tmp_path, emulator_factory, p) for p in ("fcfs", "priority"))
    for p in (fcfs, prio):
        assert p["alone"]["requests"] >= MIN_REQUESTS and p["beside"]["requests"] >= MIN_REQUESTS, p
    prio_waits, fcfs_waits = waited_behind(prio_logs), waited_behind(fcfs_logs)
    # priority: behind the running batch request (1), or two where the client saw a batch end after its send that
    # the server had finished before the request reached it (a busy host's loopback: 3 of 46 once in CI); never the
    # queue behind it. fcfs: behind the queue, up to three
    assert max(prio_waits) <= 2 and sum(w >= 3 for w in fcfs_waits) >= 3, (prio_waits, fcfs_waits)
    assert statistics.mean(prio_waits) < statistics.mean(fcfs_waits), (prio_waits, fcfs_waits)


def test_each_class_carries_its_own_headers_for_an_slo_aware_router(tmp_path, emulator_factory):
    """--class-header NAME:HEADER=VALUE: the requests named NAME carry that header (as the server received them,
    its request log), the other class's do not; a malformed one, or a class setting credentials, is one line."""
    log = tmp_path / "requests-seen.jsonl"
    emu = emulator_factory("--request-log", str(log), "--ttft", "0.005", "--itl", "0.001")
    res = run_in_process(["-f", str(ROOT / "tests/locustfiles/priority.py"), "--headless", "-u", "4", "-r", "4",
                          "-t", "60s", "--num-requests", "24", "--host", emu.url, "--run-dir", str(tmp_path / "run"),
                          "--class-header", "interactive:x-slo-ttft-ms=200",
                          "--class-header", "batch:x-slo-tier=batch", "--class-header", "batch:x-slo-ttft-ms=5000"],
                         cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    by_class = {0: [], 10: []}  # the locustfile's priorities: interactive 0, batch 10
    for r in seen:
        by_class[r["body"]["priority"]].append({k.lower(): v for k, v in r["headers"].items()})
    assert by_class[0] and by_class[10] and len(seen) >= 24
    assert all(h["x-slo-ttft-ms"] == "200" and "x-slo-tier" not in h for h in by_class[0])
    assert all(h["x-slo-ttft-ms"] == "5000" and h["x-slo-tier"] == "batch" for h in by_class[10])
    for bad, said in (("interactive", "is not NAME:HEADER=VALUE"),
                      ("interactive:Authorization=Bearer x", "a class does not set Authorization")):
        res = run_in_process(["-f", str(ROOT / "tests/locustfiles/priority.py"), "--headless", "-u", "1", "-t", "2s",
                              "--class-header", bad, "--run-dir", str(tmp_path / "bad")], cwd=tmp_path, timeout=60)
        assert res.returncode == 2 and said in res.stderr and "Bearer x" not in res.stderr + res.stdout, res.stderr


def test_an_older_run_directorys_protection_is_read_where_its_feature_keeps_it():
    """Run directories written before the feature had a module kept ``summary.protection``: read back, it is under
    the features, so its SLOs and lines judge it as a new run's."""
    from vllm_load.metrics.summary import RunSummary

    logs = [_req("interactive", 0.5 * i, 0.02) for i in range(20)] + [_req("batch", 10.0, 0.5, (0.05,) * 8)]
    logs += [_req("interactive", 10.0 + 0.5 * i, 0.05) for i in range(20)]
    old = RunSummary.from_json({"requests": 41, "succeeded": 41, "failed": 0, "usage_missing": 0,
                                "input_drift_requests": 0, "metrics": {}, "good_request_fraction": None,
                                "protection": protection(logs, "interactive")})
    assert old.features["protection"]["ttft_penalty"] == pytest.approx(1.5)
    check, = evaluate(parse_slo_option(["ttft_penalty<=100%"]), old)
    assert not check.passed and check.detail == "measured 150.00%"
