"""The emulator's continuous-batching model: queueing, KV blocks, preemption, saturation."""

import gevent
import pytest

from server.emulator.scheduler import PROFILES, BatchingEngine, CostModel, SchedulerConfig


def drive(engine, n_requests, prompt, out, watch=None):
    """Run n concurrent requests to the end; return the output token count of each."""
    counts = []

    def one():
        n = 0
        for em in engine.generate(prompt, out):
            n += em.tokens
            if watch:
                watch(engine)
        counts.append(n)

    gevent.joinall([gevent.spawn(one) for _ in range(n_requests)], raise_error=True)
    return counts


def test_max_num_seqs_queues_the_rest_and_every_request_completes():
    eng = BatchingEngine(SchedulerConfig(cost=PROFILES["cpu-tiny"], max_num_seqs=4, time_scale=0.01))
    seen = {"running": 0, "waiting": 0}

    def watch(e):
        seen["running"] = max(seen["running"], e.running)
        seen["waiting"] = max(seen["waiting"], e.waiting)

    assert drive(eng, 12, 50, 20, watch) == [20] * 12
    assert seen["running"] == 4 and seen["waiting"] >= 7
    assert eng.free_blocks == eng.cfg.num_gpu_blocks  # every block came back


def test_kv_pressure_preempts_and_recomputes_without_losing_tokens():
    # 24 blocks of 16 tokens; 6 requests of 64 + 64 tokens need 48 blocks at the end
    eng = BatchingEngine(SchedulerConfig(cost=PROFILES["cpu-tiny"], num_gpu_blocks=24, block_size=16, time_scale=0.01))
    peak = {"kv": 0.0}
    assert drive(eng, 6, 64, 64, lambda e: peak.__setitem__("kv", max(peak["kv"], e.kv_usage))) == [64] * 6
    assert eng.preemptions > 0 and peak["kv"] > 0.9
    assert eng.free_blocks == 24
    assert not eng.fits(24 * 16 + 1) and eng.fits(24 * 16)


def test_chunked_prefill_respects_the_token_budget():
    eng = BatchingEngine(SchedulerConfig(cost=CostModel(0.001, 0.00001, 0.0001), max_num_batched_tokens=256,
                                         time_scale=0.01))
    assert drive(eng, 3, 1000, 4) == [4] * 3
    # 3000 prompt tokens at most 256 per step take at least 12 steps, plus the decode steps
    assert eng.steps >= 12 + 3


@pytest.mark.parametrize("small, large", [(64, 512)])
def test_throughput_saturates_and_latency_grows_like_the_a100_measurement(small, large):
    """Published A100 sweep: max_num_seqs 64 -> 512 gave 9.9 -> 11.5 req/s (x1.16) while mean latency
    rose 6 -> 37 s (x6.2). On the engine's own clock the a100-llama8b profile gives the same shape."""
    results = {}
    for batch in (small, large):
        eng = BatchingEngine(SchedulerConfig(cost=PROFILES["a100-llama8b"], max_num_seqs=batch, time_scale=0.0005))
        drive(eng, batch, 32, 64)
        results[batch] = (eng.tokens_out / eng.model_time, eng.model_time)
    gain = results[large][0] / results[small][0]
    slower = results[large][1] / results[small][1]
    assert 1.05 < gain < 1.35, gain  # throughput barely grows
    assert slower > 5, slower  # while each request takes several times longer


def test_emulator_under_load_queues_like_vllm_and_the_sidecar_sees_it(tmp_path, emulator_factory, sidecar_factory):
    import json

    from tests.helpers import ROOT, run_in_process

    emu = emulator_factory("--profile", "cpu-tiny", "--max-num-seqs", "2", "--time-scale", "1")
    side = sidecar_factory("--vllm-url", emu.url, "--interval", "200ms", "--out", str(tmp_path / "series.jsonl"))
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "6", "-r", "6", "-t", "4s",
                          "--host", emu.url, "--sidecar-url", side.url, "--output-tokens", "30",
                          "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    series = [json.loads(x) for x in (run_dir / "server.jsonl").read_text().splitlines()]
    assert max(s["running"] for s in series) == 2  # never more than max_num_seqs
    assert max(s["waiting"] for s in series) >= 2  # the other users queue
    queue = [s["histogram_deltas"]["queue"] for s in series if "queue" in s.get("histogram_deltas", {})]
    assert sum(q["sum"] for q in queue) > 0  # and the server's queue-time histogram says how long
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    # 6 users share 2 slots: TTFT includes queueing, far above one step
    assert summary["metrics"]["ttft"]["p50"] > 0.01


def test_fixed_schedule_jitter_is_seeded_and_lockstep_shares_one_grid():
    """--jitter draws each gap within ITL*(1 +- j), the same for the same seed; --lockstep puts
    every stream's due times on one global ITL grid (like one batched decode step)."""
    import time

    from server.emulator.engine import EngineConfig, FixedScheduleEngine

    cfg = EngineConfig(ttft=0.002, itl=0.002, jitter=0.5, seed=7)
    dues = [[em.due for em in FixedScheduleEngine(cfg).generate(10, 20)] for _ in range(2)]
    assert dues[0] == pytest.approx(dues[1], abs=0.0)  # same seed, same request number: same schedule
    gaps = [b - a for a, b in zip(dues[0], dues[0][1:])]
    assert all(0.001 - 1e-9 <= g <= 0.003 + 1e-9 for g in gaps) and max(gaps) - min(gaps) > 0.001
    other = [em.due for em in FixedScheduleEngine(EngineConfig(ttft=0.002, itl=0.002, jitter=0.5, seed=8)).generate(10, 20)]
    assert other != dues[0]

    lock = FixedScheduleEngine(EngineConfig(ttft=0.003, itl=0.004, lockstep=True))
    on_grid = []
    for _ in range(2):
        gen = lock.generate(10, 5)
        for em in gen:
            arrival = time.perf_counter() - em.offset
            on_grid.append(((arrival + em.due) / 0.004) % 1.0)
    assert all(min(f, 1.0 - f) < 0.05 for f in on_grid)


def test_a_gpu_like_cycle_of_steps_per_stream_and_on_one_grid():
    """--itl-cycle: the token gaps cycle through the given steps; with --lockstep every stream emits at the
    same step ends of one global grid of those steps."""
    from server.emulator.engine import EngineConfig, FixedScheduleEngine

    cycle = (0.002, 0.006, 0.004, 0.001, 0.008)
    dues = [em.due for em in FixedScheduleEngine(EngineConfig(ttft=0.003, itl_cycle=cycle)).generate(10, 11)]
    gaps = [round(b - a, 9) for a, b in zip(dues, dues[1:])]
    assert gaps == [cycle[(i + 1) % 5] for i in range(10)]
    lock = FixedScheduleEngine(EngineConfig(ttft=0.003, itl_cycle=cycle, lockstep=True))
    ends = {round(sum(cycle[:i]), 9) for i in range(1, 6)}
    for _ in range(2):
        for em in lock.generate(10, 6):
            at = em.at - em.offset + em.due  # the absolute step end it was due at (arrival = at - offset)
            phase = round(at % sum(cycle), 6)
            assert any(abs(phase - e) < 2e-6 or abs(phase - e + sum(cycle)) < 2e-6 for e in ends | {0.0}), phase


@pytest.mark.parametrize("args, needle", [
    (["--itl-cycle", "0.01,-1"], "--itl-cycle '0.01,-1' must list positive seconds"),
    (["--jitter", "1.5"], "--jitter 1.5 is not between 0 and 1"),
    (["--jitter", "-0.1"], "--jitter -0.1 is not between 0 and 1"),
    (["--itl", "-1"], "--ttft/--itl must be >= 0"),
])
def test_emulator_bad_schedule_options_are_one_line_and_exit_2(capsys, args, needle):
    from server.emulator.app import main

    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("emulator: error:") and needle in err[0]


@pytest.mark.parametrize("policy, admitted", [("fcfs", ["a", "b", "c", "d"]), ("priority", ["a", "d", "c", "b"])])
def test_the_priority_policy_admits_the_waiting_by_priority_then_arrival(policy, admitted):
    """vLLM's --scheduling-policy: one sequence at a time; a runs, then b (10), c (5), d (0) arrive in that order:
    fcfs admits them as they came, priority by (priority, arrival)."""
    eng = BatchingEngine(SchedulerConfig(cost=PROFILES["cpu-tiny"], max_num_seqs=1, time_scale=0.01, policy=policy))
    order = []

    def one(name, priority):
        for i, _em in enumerate(eng.generate(32, 8, priority=priority)):
            if i == 0:
                order.append(name)

    first = gevent.spawn(one, "a", 20)
    while eng.running == 0:
        gevent.sleep(0)
    rest = [gevent.spawn(one, name, p) for name, p in (("b", 10), ("c", 5), ("d", 0))]
    gevent.joinall([first, *rest], raise_error=True)
    assert order == admitted


def test_the_priority_policy_preempts_the_last_by_priority_not_the_last_admitted():
    """KV for two sequences' prompts only: the one that must give its blocks back is the lowest priority's (largest
    value), though it was admitted first; fcfs takes the last admitted."""
    for policy, victim in (("priority", "low"), ("fcfs", "high")):
        eng = BatchingEngine(SchedulerConfig(cost=PROFILES["cpu-tiny"], max_num_seqs=2, num_gpu_blocks=9,
                                             block_size=16, time_scale=0.01, policy=policy))
        preempted = []
        seqs = {}

        def one(name, priority):
            for _em in eng.generate(64, 64, priority=priority):
                pass

        def watch():
            while len(preempted) < 1:
                for name, seq in seqs.items():
                    if seq.computed == 0 and seq.generated > 0 and name not in preempted:
                        preempted.append(name)
                gevent.sleep(0)

        low = gevent.spawn(one, "low", 10)
        while eng.running < 1:
            gevent.sleep(0)
        high = gevent.spawn(one, "high", 0)
        while len(eng.running_seqs) + len(eng.waiting_seqs) < 2:
            gevent.sleep(0)
        seqs.update({"low": eng.running_seqs[0], "high": next(s for s in eng.running_seqs + eng.waiting_seqs
                                                               if s is not eng.running_seqs[0])})
        watcher = gevent.spawn(watch)
        gevent.joinall([low, high], raise_error=True)
        watcher.kill()
        assert eng.preemptions >= 1 and preempted[:1] == [victim], (policy, preempted)
