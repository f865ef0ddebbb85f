"""Sweeps with a LoadTestShape: per-step exact metrics, the largest passing level, stop at the first miss."""

import json

import pytest

from tests.helpers import ROOT, run_in_process, run_locust
from vllm_load.rundir.reqlog import read_log


def test_users_sweep_keeps_steps_apart_and_finds_the_largest_passing_level(tmp_path, emulator_factory):
    # 2 batch slots: one user never queues, eight users queue for the slots
    emu = emulator_factory("--profile", "cpu-tiny", "--max-num-seqs", "2")
    run_dir = tmp_path / "run"
    res = run_locust(["-f", str(ROOT / "locustfiles/sweep.py"), "--headless", "--host", emu.url, "--sweep", "1,8",
                      "--step-duration", "4", "--output-tokens", "20", "--slo", "ttft.p50<=60ms",
                      "--run-dir", str(run_dir)], cwd=tmp_path, timeout=120)
    assert res.stdout.count("vllm-load: sweep step") == 2, res.stdout[-2000:]
    steps = sorted((run_dir / "steps").iterdir())
    assert [d.name for d in steps] == ["00-users-1", "01-users-8"]
    logs = read_log(run_dir / "requests.jsonl")
    per_step = [json.loads((d / "llm_stats.json").read_text())["summary"] for d in steps]
    # every request counted in exactly the step it started in
    assert [s["requests"] for s in per_step] == [sum(r["step"] == i for r in logs) for i in (0, 1)]
    assert sum(s["requests"] for s in per_step) == len(logs)
    assert per_step[1]["metrics"]["ttft"]["p50"] > 3 * per_step[0]["metrics"]["ttft"]["p50"]  # queueing at 8
    md = (run_dir / "sweep.md").read_text()
    assert md.startswith("**Largest concurrency meeting every SLO: 1**")
    assert "Largest concurrency meeting every SLO: 1" in res.stdout
    assert (run_dir / "sweep.html").exists() and (steps[0] / "report.html").exists()


def test_stop_on_slo_miss_ends_the_sweep_early(tmp_path, emulator_factory):
    emu = emulator_factory("--profile", "cpu-tiny", "--max-num-seqs", "2")
    run_dir = tmp_path / "run"
    res = run_locust(["-f", str(ROOT / "locustfiles/sweep.py"), "--headless", "--host", emu.url,
                      "--sweep", "1,8,16,32", "--step-duration", "4", "--output-tokens", "20",
                      "--slo", "ttft.p50<=60ms", "--stop-on-slo-miss", "--run-dir", str(run_dir)], cwd=tmp_path,
                     timeout=120)
    assert "missed ttft.p50<=60ms: stopping the sweep" in res.stdout, res.stdout[-2000:]
    names = [d.name for d in sorted((run_dir / "steps").iterdir())]
    # the next step waits for the last one's verdict: the miss at 8 users stops the sweep before 16 starts
    assert names == ["00-users-1", "01-users-8"], names


@pytest.mark.quiet_cores  # each step's achieved send rate is the subject (beside a parallel suite: 29.6 of 40)
def test_rate_sweep_changes_the_open_loop_rate_per_step(tmp_path, emulator_factory):
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002")
    run_dir = tmp_path / "run"
    # near-regular arrivals (gamma shape 20): the counts below are not at the mercy of Poisson noise
    res = run_locust(["-f", str(ROOT / "locustfiles/sweep.py"), "--headless", "--host", emu.url,
                      "--sweep-mode", "rate", "--sweep", "5,40", "--sweep-users", "4", "--step-duration", "4",
                      "--burstiness", "20", "--output-tokens", "8", "--run-dir", str(run_dir)], cwd=tmp_path,
                     timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    steps = sorted((run_dir / "steps").iterdir())
    assert [d.name for d in steps] == ["00-rate-5", "01-rate-40"]
    stats = [json.loads((d / "llm_stats.json").read_text()) for d in steps]
    rates = [s["summary"]["send_rate"] for s in stats]
    assert 3.5 <= rates[0] <= 7 and 34 <= rates[1] <= 46, rates
    # the new rate holds from the step's start: users waiting out a gap drawn at 5 req/s (0.8 s) redraw
    # at once, so the step's first second sends ~40 requests (~24 if they waited the old gaps out)
    logs = read_log(run_dir / "requests.jsonl")
    first_second = sum(r["step"] == 1 and r["start"] < stats[1]["start"] + 1.0 for r in logs)
    assert 32 <= first_second <= 48, first_second
    # the levels are request rates, and the sweep table says so (they were once called a concurrency)
    assert "| request rate |" in (run_dir / "sweep.md").read_text().splitlines()[2]


def test_the_private_locust_call_a_worker_flush_relies_on_is_there():
    """A worker's flush sends its final report with WorkerRunner._send_stats (private; checked against Locust
    2.40-2.47, setup.cfg's bounds): a Locust without it must fail here, not lose every worker's last numbers."""
    import inspect

    from locust.runners import WorkerRunner

    assert callable(getattr(WorkerRunner, "_send_stats", None))
    assert list(inspect.signature(WorkerRunner._send_stats).parameters) == ["self"]


def test_a_sweep_owns_its_steps_windows_stats_and_verdicts():
    from vllm_load.metrics.judge.slo import parse_slo_option
    from vllm_load.plugin.lifecycle.sweep import Sweep
    from vllm_load.client.record import RequestRecord

    sweep = Sweep("rate")
    assert sweep.begin(0, 4.0, now=100.0, warmup=2.0) and not sweep.begin(0, 4.0, now=101.0, warmup=2.0)
    assert sweep.begin(1, 8.0, now=110.0, warmup=2.0)
    assert (sweep.steps[0].start, sweep.steps[0].end, sweep.steps[1].start) == (102.0, 110.0, 112.0)
    assert sweep.current_level() == 8.0 and sweep.unit == "req/s"
    fast = RequestRecord(api="chat", start=103.0, ok=True, e2e=0.1, ttft=0.05, output_tokens=4, chunk_offsets=[0.05, 0.1],
                         chunk_tokens=[2, 2])
    slow = RequestRecord(api="chat", start=113.0, ok=True, e2e=2.0, ttft=1.5, output_tokens=4, chunk_offsets=[1.5, 2.0],
                         chunk_tokens=[2, 2])
    delta = type(sweep.steps[0].stats)()
    delta.add(fast)
    sweep.merge(0, delta)
    delta = type(sweep.steps[0].stats)()
    delta.add(slow)
    sweep.merge(1, delta)
    slos = parse_slo_option(["ttft.p99<=1s"])
    first, second = sweep.judge(0, slos, (50.0, 99.0)), sweep.judge(1, slos, (50.0, 99.0))
    assert first.slo_passed is True and second.slo_passed is False
    assert sweep.judge(1, [], (50.0,)) is second  # judged once: kept with the step


def test_a_repeated_level_gives_its_mean_and_confidence_interval_over_its_steps(tmp_path, emulator_factory):
    """--sweep 2x3,4: the level 2 runs three times (its steps are repeats), with the prefix cache emptied before
    each; the sweep gives each repeated level's mean ± half its 95 % interval over those steps, computed from the
    steps' own numbers."""
    from vllm_load.metrics.judge.repeats import spread

    emu = emulator_factory("--ttft", "0.02", "--itl", "0.004")
    run_dir = tmp_path / "run"
    res = run_locust(["-f", str(ROOT / "locustfiles/sweep.py"), "--headless", "--host", emu.url, "--sweep", "2x3,4",
                      "--step-duration", "2", "--output-tokens", "8", "--reset-prefix-cache", "--run-dir",
                      str(run_dir), "--allow-untrustworthy"], cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    steps = sorted((run_dir / "steps").iterdir())
    assert [d.name for d in steps] == ["00-users-2", "01-users-2", "02-users-2", "03-users-4"]
    rates = [json.loads((d / "llm_stats.json").read_text())["summary"]["request_rate"] for d in steps[:3]]
    expected = spread(rates)
    line = next(x for x in res.stdout.splitlines() if x.startswith("vllm-load: repeated level 2,"))
    assert f"steps 3, confidence 95%, req/s {expected['mean']:.2f} ± {expected['half']:.2f}" in line, line
    assert "Repeated levels" in (run_dir / "sweep.md").read_text() and "id='repeats'" in (run_dir / "sweep.html").read_text()
    assert res.stdout.count("prefix cache reset on 1 target(s) before") == 4  # before each step


def test_a_sweeps_first_step_starts_when_the_load_can_not_at_locusts_test_start(tmp_path, emulator_factory,
                                                                                monkeypatch):
    """A local run's generator fills its prompt pools after Locust's test start (on a busy host: over a 2 s step).
    Made 2.5 s late here on purpose, the sweep's clock still starts with the load: each step exists, each sent
    requests, and every request is in the step it started in (on the clock of Locust's test start, step 0 was gone
    before it sent one)."""
    import gevent

    from vllm_load.plugin.lifecycle import roles

    made = roles.Generator.create

    def late(*args, **kwargs):
        gevent.sleep(2.5)  # the pools' fill, slowed: a fault injected, not a wait for something
        return made(*args, **kwargs)

    monkeypatch.setattr(roles.Generator, "create", late)
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/sweep.py"), "--headless", "--host", emu.url, "--sweep", "2,3",
                          "--step-duration", "2", "--output-tokens", "4", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    steps = sorted((run_dir / "steps").iterdir())
    assert [d.name for d in steps] == ["00-users-2", "01-users-3"]
    logs = read_log(run_dir / "requests.jsonl")
    counts = [json.loads((d / "llm_stats.json").read_text())["summary"]["requests"] for d in steps]
    assert counts == [sum(r["step"] == i for r in logs) for i in (0, 1)] and min(counts) > 0, counts


def test_bad_repeats_and_confidence_are_one_line(tmp_path):
    for args, said in ((["--sweep", "2x0"], "must list positive levels"),
                       (["--sweep", "2", "--confidence", "1.5"], "--confidence 1.5 must be between 0 and 1")):
        res = run_locust(["-f", str(ROOT / "locustfiles/sweep.py"), "--headless", *args, "--run-dir",
                          str(tmp_path / "run")], cwd=tmp_path, timeout=60)
        assert res.returncode == 2 and said in res.stderr, res.stderr[-1000:]


@pytest.mark.quiet_cores
def test_compare_decides_from_repeated_runs_spread(tmp_path, emulator_factory, capsys):
    """Two runs of one load repeated three times each, against a server twice as slow per token for B: compare
    decides from both sides' spread (Welch's interval) that B's request rate is worse, beyond its runs' noise."""
    from vllm_load.cli import main as cli_main

    dirs = []
    for name, itl in (("a", "0.004"), ("b", "0.008")):
        emu = emulator_factory("--ttft", "0.01", "--itl", itl)
        dirs.append(tmp_path / name)
        res = run_locust(["-f", str(ROOT / "locustfiles/sweep.py"), "--headless", "--host", emu.url, "--sweep", "2x3",
                          "--step-duration", "2", "--output-tokens", "16", "--run-dir", str(dirs[-1]),
                          "--allow-untrustworthy"], cwd=tmp_path, timeout=120)
        assert res.returncode == 0, res.stdout[-2000:]
    assert cli_main(["compare", str(dirs[0]), str(dirs[1]), "--out", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "repeated: request rate B/A" in x)
    assert "(95%, 3 and 3 runs): worse" in line, out
    assert "over the repeated runs: request rate worse" in out
