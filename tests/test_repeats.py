"""The spread over repeated runs: Student's t quantiles against published tables, and an interval that covers."""

import random

import pytest

from vllm_load.metrics.judge.repeats import spread, spread_text, t_quantile


@pytest.mark.parametrize("p,df,table", [(0.975, 1, 12.706), (0.975, 2, 4.303), (0.975, 4, 2.776), (0.975, 9, 2.262),
                                        (0.975, 29, 2.045), (0.95, 9, 1.833), (0.995, 4, 4.604), (0.975, 10_000, 1.960)])
def test_t_quantiles_match_the_tables(p, df, table):
    assert round(t_quantile(p, df), 3) == table


def test_the_interval_covers_the_mean_as_often_as_it_says():
    rng = random.Random(1)
    hits = sum(abs(s["mean"] - 10.0) <= s["half"] for s in
               (spread([rng.gauss(10.0, 2.0) for _ in range(5)]) for _ in range(2000)))
    assert 0.93 <= hits / 2000 <= 0.97


def test_one_value_has_no_spread():
    assert spread([3.0]) is None and spread_text(None) == "-"
    s = spread([10, 12, 11, 13, 9])
    assert (s["mean"], round(s["std"], 4), s["n"]) == (11.0, 1.5811, 5) and spread_text(s) == "11.00 ± 1.96"


def test_welch_decides_from_the_spread_of_both_sides():
    from vllm_load.metrics.judge.repeats import welch
    a = [100.0, 102.0, 98.0, 101.0, 99.0]
    assert welch(a, [x * 1.10 for x in a])["verdict"] == "higher"  # 10 % up, runs within 2 %: decided
    assert welch(a, [x * 0.9 for x in a])["verdict"] == "lower"
    assert welch(a, [101.0, 97.0, 103.0, 99.0, 100.0])["verdict"] == "no difference"
    w = welch(a, [x + 4.0 for x in a])
    assert round(w["pct"], 3) == 4.0 and 0 < w["half_pct"] < 4.0
    assert welch([1.0], a) is None


def test_repeat_runs_any_locustfiles_load_n_times_with_its_spread(tmp_path, emulator_factory):
    """--repeat 3 on chat.py (no sweep of its own): three back-to-back repeats of -t each, the server's prefix cache
    emptied before each, each repeat a step directory, and the spread over them computed from their own numbers."""
    import json

    from tests.helpers import ROOT, run_in_process

    emu = emulator_factory("--ttft", "0.02", "--itl", "0.004")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "--host", emu.url, "-u", "2", "-r", "2",
                          "-t", "2s", "--repeat", "3", "--confidence", "0.9", "--output-tokens", "8",
                          "--reset-prefix-cache", "--run-dir", str(run_dir)], cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    steps = sorted((run_dir / "steps").iterdir())
    assert [d.name for d in steps] == ["00-users-2", "01-users-2", "02-users-2"]
    rates = [json.loads((d / "llm_stats.json").read_text())["summary"]["request_rate"] for d in steps]
    expected = spread(rates, 0.9)
    line = next(x for x in res.stdout.splitlines() if x.startswith("vllm-load: repeated level 2,"))
    assert f"steps 3, confidence 90%, req/s {expected['mean']:.2f} ± {expected['half']:.2f}" in line, line
    # said as repeats, not as a sweep's steps (it said "repeat 1 of 3 (0)" and "sweep of 3 steps")
    assert [x for x in res.stdout.splitlines() if x.startswith("vllm-load: repeat ")] == [
        f"vllm-load: repeat {i + 1} of 3: 2 users" for i in range(3)]
    assert "vllm-load: 3 repeats: " in res.stdout and "sweep of" not in res.stdout
    assert res.stdout.count("prefix cache reset on 1 target(s) before") == 3


def test_bad_repeats_are_one_line(tmp_path):
    from tests.helpers import ROOT, run_in_process

    chat, sweep = str(ROOT / "locustfiles/chat.py"), str(ROOT / "locustfiles/sweep.py")
    for args, said in (([chat, "-t", "2s", "--repeat", "0"], "--repeat must be >= 1, got 0"),
                       ([chat, "--repeat", "2"], "--repeat 2 needs each repeat's length: -t DURATION"),
                       ([sweep, "--sweep", "2", "--repeat", "2"], "a sweep repeats a level with --sweep LEVELxN"),
                       ([chat, "-t", "4s", "--repeat", "2", "--ramp-up-strategy", "linear", "--ramp-up-start-rps",
                         "1", "--ramp-up-end-rps", "4"], "--repeat repeats a steady load")):
        res = run_in_process(["-f", *args, "--headless", "--run-dir", str(tmp_path / "run")], cwd=tmp_path, timeout=60)
        assert res.returncode == 2 and said in res.stderr, (args, res.stderr[-1000:])


def test_a_step_the_shape_begins_before_a_local_runs_generator_exists_is_applied_once_it_does(capsys):
    """A local run's generator fills its prompt pools before it exists; the sweep shape's first tick can come
    meanwhile (on a busy host it did, and step 0's 51 requests were labelled no step). The step is kept until the
    generator exists, then begun on it; a master (its workers generate) begins it at once."""
    from types import SimpleNamespace

    from vllm_load.plugin.lifecycle.steps import SweepSteps
    from vllm_load.plugin.lifecycle.sweep import Sweep

    told = []
    col = SimpleNamespace(sweep=Sweep("users"), swarm=False, profiler=None,
                          plan=SimpleNamespace(warmup=0.0, total_users=1, floor_of=lambda users: 0.0,
                                               users_at=lambda level: level))
    run = SimpleNamespace(collector=col, generator=None)
    steps = SweepSteps()
    steps.begin(0, 1.0, run, SimpleNamespace(repeat=1), None, lambda *a: told.append(a))
    assert col.sweep.current is None and steps.last == (0, 1.0) and told == []
    run.generator = SimpleNamespace(set_step=lambda step, rate, floor: told.append(("generator", step, rate, floor)))
    steps.begin(*steps.last, run, SimpleNamespace(repeat=1), None, lambda *a: told.append(a))  # the run's start
    assert col.sweep.current == 0 and told == [("generator", 0, 0.0, 0.0), (0, 0.0, 0.0)]
    master = SimpleNamespace(collector=SimpleNamespace(sweep=Sweep("users"), swarm=True, plan=col.plan,
                                                       profiler=None), generator=None)
    SweepSteps().begin(0, 4.0, master, SimpleNamespace(repeat=1), None, lambda *a: None)
    assert master.collector.sweep.current == 0
