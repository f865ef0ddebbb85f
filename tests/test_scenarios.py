"""--scenario agentx-mvp / agentx: AIPerf's inferencex-agentx-mvp spec and its inferencex-agentx preset as one option
(the spec's locks, the preset's defaults), a public Weka set found by its published name in a local Hugging Face
cache, the idle time capped system-wide, the traces recycled until -t, the run stamped valid or not (every override
named), and aborted past the preset's 10 % failed requests."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.helpers import ROOT, run_in_process
from vllm_load.errors import UsageError

SESSIONS = str(ROOT / "locustfiles" / "sessions.py")
BLOCK = 16


def published(hub: Path, repo: str, traces: int, turns: int = 6) -> list[dict]:
    """A public set in the layout ``huggingface-cli download --repo-type dataset`` leaves: refs/main naming a
    snapshot that holds traces.jsonl, a Weka trace per line (calls whose hash ids grow, short think times)."""
    rows = []
    for s in range(traces):
        ids, t, calls = [10 * s], 0.0, []
        for k in range(turns):
            ids = ids + [10 * s + len(ids)]
            calls.append({"t": round(t, 3), "type": "n", "model": "m", "in": BLOCK * len(ids) + 8, "out": 3,
                          "hash_ids": list(ids), "api_time": 0.02, "think_time": 0.02 if k else None})
            t += 0.04
        rows.append({"id": f"trace_{s:03d}", "models": ["m"], "block_size": BLOCK, "hash_id_scope": "local",
                     "requests": calls})
    root = hub / f"datasets--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text("8fecd2fc")
    (root / "snapshots" / "8fecd2fc").mkdir(parents=True)
    (root / "snapshots" / "8fecd2fc" / "traces.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_a_published_name_is_found_in_the_local_cache_or_said_where_it_was_looked_for(tmp_path, monkeypatch):
    from vllm_load.workload.inputs.public_sets import resolve
    from vllm_load.workload.inputs.sessions import read_sessions

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("VLLM_LOAD_DATASETS", raising=False)
    with pytest.raises(UsageError) as missing:
        resolve("semianalysis_cc_traces_weka_062126")
    said = str(missing.value)
    assert "semianalysisai/cc-traces-weka-062126 is not on this machine" in said and "\n" not in said
    assert "huggingface-cli download --repo-type dataset semianalysisai/cc-traces-weka-062126" in said
    published(tmp_path / "hub", "semianalysisai/cc-traces-weka-062126", 3)
    # the loader's name and its alias reach the same snapshot; the dataset id works too
    for name in ("semianalysis_cc_traces_weka_062126", "semianalysis_cc_traces_weka_with_subagents",
                 "semianalysisai/cc-traces-weka-062126"):
        assert [s.id for s in read_sessions(name)] == ["trace_000", "trace_001", "trace_002"]
    # a folder of one's own comes first
    own = tmp_path / "mine" / "semianalysis_cc_traces_weka_062126"
    own.mkdir(parents=True)
    (own / "traces.jsonl").write_text((tmp_path / "hub").joinpath(
        "datasets--semianalysisai--cc-traces-weka-062126/snapshots/8fecd2fc/traces.jsonl").read_text().splitlines()[0])
    monkeypatch.setenv("VLLM_LOAD_DATASETS", str(tmp_path / "mine"))
    assert [s.id for s in read_sessions("semianalysis_cc_traces_weka_062126")] == ["trace_000"]


def test_the_scenario_fixes_its_rules_names_overrides_and_stamps_the_run():
    from argparse import Namespace

    from vllm_load.options import OPTIONS
    from vllm_load.workload.scenarios import apply, describe, overflows, stamp, untrusted

    defaults = {o.dest: o.default for o in OPTIONS}
    opts = Namespace(**defaults)
    opts.sessions = "set"
    kept = apply("agentx", opts, defaults)
    assert kept == () and (opts.session_start, opts.session_align, opts.seed) == ("0.25,0.75", "instant", 42)
    assert (opts.cache_bust, opts.system_idle_cap, opts.max_idle, opts.recycle) == ("trajectory", 10.0, math.inf, True)
    assert apply("agentx", opts, defaults) == ()  # idempotent: the web UI's every start applies it again
    # a lock given another value is an override, named; a default given another value is the user's (AIPerf
    # honours an explicit --random-seed), and the run stays valid for it
    opts = Namespace(**{**defaults, "sessions": "set", "max_idle": 5.0, "seed": 7})
    changed = apply("agentx", opts, defaults)
    assert [o.split(" (")[0] for o in changed] == ["--max-idle 5.0"]
    assert opts.max_idle == 5.0 and opts.seed == 7 and opts.session_start == "0.25,0.75"
    # the spec alone: the same locks, t* anywhere in a trace, no alignment, the seed left as given
    mvp = Namespace(**{**defaults, "sessions": "set"})
    assert apply("agentx-mvp", mvp, defaults) == ()
    assert (mvp.session_start, mvp.session_align, mvp.seed, mvp.recycle) == ("0,1", defaults["session_align"],
                                                                             defaults["seed"], True)
    # a replay that recycles its traces runs for a duration: without -t it would never end
    with pytest.raises(UsageError, match=r"--scenario agentx-mvp replays its traces for a duration: give -t 1800s"):
        apply("agentx-mvp", Namespace(**{**defaults, "sessions": "set"}), defaults, 0.0)
    published = "semianalysis_cc_traces_weka_062126"
    ok = stamp("agentx", (), 100, 10, seconds=1800.0, corpus=published, overflowed=1)
    assert ok["valid"] is True and ok["kept"] == [  # 10 % is within; the stamp lists the rules it kept
        "5 options as the rules fix them", "1800 s, at least 900 s", f"the published corpus {published}",
        "failed share 10.0% within 10%", "context overflows 1.0% within 1%"]
    assert describe(ok).endswith("VALID (every rule kept: 5 options as the rules fix them; 1800 s, at least 900 s; "
                                 f"the published corpus {published}; failed share 10.0% within 10%; context overflows "
                                 "1.0% within 1%)")
    # the spec has no failure threshold of its own (the preset's command adds one): any share is within it
    assert stamp("agentx-mvp", (), 100, 40, seconds=900.0, corpus=published)["valid"] is True
    # above 1 % of requests refused for the model's context length: the referee invalidates the run
    errors = {"HTTP 400: This model's maximum context length is N tokens. However, you requested N tokens": 2,
              "HTTP 500: engine died": 3}
    assert overflows(errors) == 2
    over = stamp("agentx", (), 100, 5, seconds=1800.0, corpus=published, overflowed=overflows(errors))
    assert over["invalid_reasons"] == ["context overflow: 2 of 100 requests (2.0%) refused for the model's "
                                       "context length, over the rules' 1%"]
    late = stamp("agentx", (), 100, 11, seconds=1800.0, corpus=published)
    assert late["valid"] is False and late["invalid_reasons"] == [
        "failed share 11.0% (11 of 100) over the scenario's 10%"]
    assert stamp("agentx", changed, 10, 0)["invalid_reasons"][0].startswith("override: --max-idle 5.0 (")
    # what the referee refuses: a 30 s run, a local unpinned folder, a run that could not be trusted
    short = stamp("agentx", (), 100, 0, seconds=29.9, corpus=published)
    assert short["invalid_reasons"] == ["30 s, under the 900 s the rules ask (-t 900s or more)"]
    local = stamp("agentx", (), 100, 0, seconds=1800.0, corpus="/data/my-traces")
    assert local["invalid_reasons"][0].startswith("an unpinned local corpus (/data/my-traces): the rules pin")
    distrusted = untrusted(ok, "local: its CPU at 100 %")
    assert distrusted["valid"] is False and distrusted["invalid_reasons"] == [
        "the run is untrustworthy (local: its CPU at 100 %)"]
    assert untrusted(distrusted, "local: its CPU at 100 %") == distrusted  # judged once
    with pytest.raises(UsageError, match="give --sessions"):
        apply("agentx", Namespace(**defaults), defaults)


def test_the_trajectory_cache_bust_keeps_each_trees_blocks_its_own(tmp_path):
    """AIPerf's first-turn cache bust (a marker per trajectory before its first user turn) as vllm-load's blocks: with
    --cache-bust trajectory (AgentX's), two traces whose global hash ids are equal share no block; within a trace, and
    with its subagent, the blocks repeat as the ids do."""
    from vllm_load.workload.inputs.sessions import Fork, read_sessions

    def trace(name: str) -> dict:
        sub = {"t": 0.1, "type": "subagent", "agent_id": "a1", "status": "completed",
               "requests": [{"t": 0.1, "type": "n", "in": 64, "out": 2, "hash_ids": [1, 2, 9]}]}
        return {"id": name, "block_size": BLOCK, "hash_id_scope": "global", "requests": [
            {"t": 0.0, "type": "n", "in": 40, "out": 2, "hash_ids": [1, 2]}, sub,
            {"t": 0.5, "type": "n", "in": 56, "out": 2, "hash_ids": [1, 2, 3]}]}

    for name in ("t1", "t2"):  # a folder of two traces
        (tmp_path / f"{name}.json").write_text(json.dumps(trace(name)))
    shared, own = read_sessions(tmp_path), read_sessions(tmp_path, cache_bust=True)

    def ids(session) -> list[tuple[int, ...]]:
        return [s.hash_ids if not isinstance(s, Fork) else s.session.steps[0].hash_ids for s in session.steps]

    assert ids(shared[0]) == ids(shared[1])  # global ids: the two traces' prompts share their blocks
    a, b = ids(own[0]), ids(own[1])
    assert not set(a[0]) & set(b[0]) and not set(a[2]) & set(b[2])  # busted: nothing across trajectories
    assert a[2][:2] == a[0] and a[1][:2] == a[0]  # within one: the turn after, and its subagent, share its blocks
    assert [len(x) for x in a] == [len(x) for x in ids(shared[0])]  # the same shape: only the namespace moved


def test_six_percent_failed_aborts_a_run_at_once_and_five_does_not():
    """The abort rule by itself, on records in a known order: failed > 5 % of 20 or more measured requests."""
    from types import SimpleNamespace

    from vllm_load.errors import EXIT_INVALID
    from vllm_load.plugin.load.failed_share import FailedShare

    def records(failed_every: int, n: int) -> list:
        return [SimpleNamespace(ok=(i + 1) % failed_every != 0, warmup=False, cancelled=False, abandoned=False,
                                removed=False, name="turn", session="s") for i in range(n)]

    told: list = []
    watch = FailedShare(0.05, "agentx", lambda message, code: told.append((message, code)))
    for rec in records(16, 200):  # 6.25 %: the 16th is the first failure; 2 of 32 passes 5 %
        watch.add(rec)
    assert len(told) == 1 and told[0][1] == EXIT_INVALID
    assert told[0][0].startswith("--scenario agentx: 2 of 32 requests failed (6.2%), over the scenario's 5%")
    told.clear()
    watch = FailedShare(0.05, "agentx", lambda message, code: told.append((message, code)))
    for rec in records(20, 400):  # 5 % exactly: never over
        watch.add(rec)
    assert told == []


def test_a_root_sessions_failed_warm_up_aborts_the_run_and_a_subagents_does_not():
    """AIPerf's trajectory_warmup_failed: the cache the measured turns stand on was never primed."""
    from types import SimpleNamespace

    from vllm_load.errors import EXIT_INVALID
    from vllm_load.plugin.load.failed_share import FailedShare

    def warm_up(session: str, ok: bool, cancelled: bool = False, status: int | None = 500):
        return SimpleNamespace(ok=ok, warmup=True, cancelled=cancelled, abandoned=False, removed=False,
                               name="warm-up", session=session, status=status)

    told: list = []
    watch = FailedShare(0.10, "agentx", lambda message, code: told.append((message, code)))
    for rec in (warm_up("t1", True), warm_up("t1::sa:a", False), warm_up("t2", False, cancelled=True),
                SimpleNamespace(**{**vars(warm_up("t3", False)), "name": "turn"})):
        watch.add(rec)  # a whole one, a subagent's, one the run's end cut, and a --warmup request: none aborts
    assert told == []
    watch.add(warm_up("t4", False, status=None))
    watch.add(warm_up("t5", False))
    assert told == [("--scenario agentx: session t4's warm-up failed (no answer): the run is aborted before it "
                     "measures and not valid for the scenario (AIPerf's trajectory_warmup_failed)", EXIT_INVALID)]


@pytest.mark.slow  # two replays (the fast selection keeps the rules', the names' and the abort's own tests)
def test_an_agentx_run_over_a_published_set_keeps_the_rules_at_one_instant(tmp_path, emulator_factory):
    """A public set by its name, the scenario's rules applied: each user's first session from a t* in 25-75 % of its
    turns after its warm-up, every one of them going on at one instant (none before the last warm-up ended), seed 42,
    the set replayed again (ids ~2, ~3...) until -t, and a short run never VALID; an override (--max-idle 5) stamps
    another run not valid, naming it."""
    published(tmp_path / "hub", "semianalysisai/cc-traces-weka-062126", 8)
    emu = emulator_factory("--ttft", "0.005", "--itl", "0.002")
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "VLLM_LOAD_DATASETS": None}
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", SESSIONS, "--headless", "-u", "4", "-r", "4", "-t", "6s", "--host", emu.url,
                          "--scenario", "agentx", "--sessions", "semianalysis_cc_traces_weka_062126",
                          "--run-dir", str(run_dir)], tmp_path, env_extra=env, timeout=180)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = [json.loads(x) for x in (run_dir / "requests.jsonl").read_text().splitlines()]
    warm = [r for r in logs if r["warmup"]]
    # 6 turns, t* in [0.25, 0.75): turn 1 to 4, so each of the 4 users' first session warms the turn before it
    assert len(warm) == 4 and len({r["session"] for r in warm}) == 4
    instant = max(r["start"] + r["e2e"] for r in warm)
    firsts = [min((r for r in logs if r["session"] == w["session"] and not r["warmup"]), key=lambda r: r["start"])
              for w in warm]
    assert all(r["start"] >= instant for r in firsts), (instant, [r["start"] for r in firsts])
    # recycled: every trace's first play replayed (its t* session from t*), then again from turn 0 as its own
    plays = {r["session"] for r in logs if not r["warmup"]}
    assert {f"trace_{s:03d}" for s in range(8)} <= plays and {f"trace_{s:03d}~2" for s in range(8)} <= plays, plays
    config = json.loads((run_dir / "config.json").read_text())
    assert config["plan"]["seed"] == 42 and config["plan"]["scenario"] == "agentx"
    data = json.loads((run_dir / "summary.json").read_text())
    scenario = data["summary"]["scenario"]
    # a 6 s run: every other rule kept, and not valid for that alone (the referee asks 900 s);
    # on a busy host the run's distrust is a second reason, never a VALID
    seconds = data["summary"]["duration_s"]
    assert scenario["valid"] is False and scenario["invalid_reasons"][0] == (
        f"{seconds:.0f} s, under the 900 s the rules ask (-t 900s or more)")
    detail = data["trust"]["detail"]  # the tests accept an untrustworthy run (--allow-untrustworthy): said here
    assert scenario["invalid_reasons"][1:] == ([] if not detail.startswith("UNTRUSTWORTHY: ") else [
        "the run is untrustworthy ("
        f"{detail.removeprefix('UNTRUSTWORTHY: ').removesuffix(' (accepted with --allow-untrustworthy)')})"])
    assert "the published corpus semianalysis_cc_traces_weka_062126" in scenario["kept"]
    assert "scenario: agentx (AIPerf 0.14's inferencex-agentx preset (InferenceX AgentX)): NOT VALID: " in res.stdout
    # the same set with one rule overridden: measured, and stamped not valid with the override named
    other = tmp_path / "other"
    res = run_in_process(["-f", SESSIONS, "--headless", "-u", "2", "-r", "2", "-t", "3s", "--host", emu.url,
                          "--scenario", "agentx", "--sessions", "semianalysis_cc_traces_weka_062126",
                          "--max-idle", "5", "--run-dir", str(other)], tmp_path, env_extra=env, timeout=180)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    scenario = json.loads((other / "summary.json").read_text())["summary"]["scenario"]
    assert scenario["valid"] is False and scenario["overrides"][0].startswith("--max-idle 5.0 (the scenario's inf")
    assert "NOT VALID: override: --max-idle 5.0" in res.stdout


@pytest.mark.parametrize("swarm", [[], pytest.param(["--processes", "2"], marks=pytest.mark.slow)],
                         ids=["local", "swarm"])
def test_injected_failures_past_the_threshold_abort_the_run_and_stamp_it(tmp_path, emulator_factory, swarm):
    """The emulator fails 14 % of requests (its draws seeded): the run stops with the scenario's one line, exit 4,
    before every session was replayed, and its stamp says why; in a swarm, a worker's abort stops the master's run
    (the options the scenario set reached the workers)."""
    published(tmp_path / "hub", "semianalysisai/cc-traces-weka-062126", 40)
    emu = emulator_factory("--ttft", "0.003", "--itl", "0.001", "--fault", "500:0.14")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", SESSIONS, "--headless", "-u", "4", "-r", "4", "-t", "90s", "--host", emu.url,
                          "--scenario", "agentx", "--sessions", "semianalysis_cc_traces_weka_062126",
                          "--run-dir", str(run_dir), *swarm], tmp_path,
                         env_extra={"HF_HUB_CACHE": str(tmp_path / "hub"), "VLLM_LOAD_DATASETS": None}, timeout=180)
    assert res.returncode == 4, res.stdout[-3000:] + res.stderr[-3000:]
    assert "over the scenario's 10%: the run is aborted and not valid for the scenario" in res.stderr
    assert "every session was replayed" not in res.stdout
    scenario = json.loads((run_dir / "summary.json").read_text())["summary"]["scenario"]
    assert scenario["valid"] is False and any(r.startswith("stopped: --scenario agentx:")
                                              for r in scenario["invalid_reasons"])


def test_a_scenario_without_what_it_needs_is_one_line(tmp_path):
    for locustfile, scenario, said in ((ROOT / "locustfiles" / "chat.py", "agentx", "replays a set: give --sessions"),
                                       (SESSIONS, "agentx", "replays a set: give --sessions"),
                                       (ROOT / "locustfiles" / "chat.py", "mlperf-endpoints",
                                        "whole passes of the dataset: give --num-requests N")):
        res = run_in_process(["-f", str(locustfile), "--headless", "-u", "1", "-t", "2s", "--scenario", scenario,
                              "--run-dir", str(tmp_path / "run")], tmp_path, timeout=60)
        errors = [x for x in res.stderr.splitlines() if x.startswith("vllm-load: error:")]
        assert res.returncode == 2 and len(errors) == 1 and said in errors[0], res.stderr[-1500:]
    res = run_in_process(["-f", str(ROOT / "locustfiles" / "chat.py"), "--headless", "-u", "1", "-t", "2s",
                          "--min-duration", "5", "--run-dir", str(tmp_path / "run")], tmp_path, timeout=60)
    assert res.returncode == 2 and "--min-duration 5 needs --num-requests N" in res.stderr


def test_a_floored_share_is_taken_in_whole_passes_until_the_floor_then_ends():
    from vllm_load.plugin.load.tickets import Tickets

    t = Tickets(3)
    t.restart(floor_s=100.0, now=0.0)  # a floor that passed long ago: one pass, as without one
    assert [t.take() for _ in range(4)] == [True, True, True, False] and t.last_taken()
    assert [t.finished() for _ in range(3)] == [False, False, True]
    t.restart(floor_s=3600.0)  # the floor lasts: a share taken whole is taken again, and again
    assert all(t.take() for _ in range(9)) and (t.passes, t.quota, t.held) == (3, 9, 9)
    assert not t.last_taken() and not any(t.finished() for _ in range(9))  # all done, but the floor lasts
    t.floor_until = 1.0  # the floor passes while every ticket of the third pass is held: no fourth pass
    assert t.take() is False and t.quota == 9
    assert t.finished_share() and not t.finished_share()  # said once, when a waiting user asks
    t.restart()
    t.take()
    t.give_back()  # a warm-up request's ticket comes back: the share is still 3 counted requests
    assert t.held == 0 and t.take() and t.take() and t.take() and not t.take()


def test_the_mlperf_stamp_judges_each_point_and_the_curve():
    from vllm_load.workload.scenarios import MLPERF_ENDPOINTS, Point, stamp

    assert [MLPERF_ENDPOINTS.floor(u) for u in (1, 32, 33, 4096)] == [600.0, 600.0, 1200.0, 1200.0]
    kept = [Point(u, seconds, n, 1000, MLPERF_ENDPOINTS.floor(u))
            for u, seconds, n in ((8, 601.0, 3000), (64, 1250.0, 2000), (256, 1300.0, 4000), (1024, 1201.0, 7000))]
    s = stamp("mlperf-endpoints", (), 16000, 10, points=kept)
    assert s["valid"] and [p["passes"] for p in s["points"]] == [3.0, 2.0, 4.0, 7.0]
    short = [Point(64, 900.0, 2500, 1000, 1200.0), Point(128, 1300.0, 2000, 1000, 1200.0)]
    s = stamp("mlperf-endpoints", ("--min-duration 30.0 (the scenario's 0.0: ...)",), 4500, 0, points=short)
    assert not s["valid"] and s["invalid_reasons"] == [
        "override: --min-duration 30.0 (the scenario's 0.0: ...)",
        "point 0 (64 users): 900 s, under the 1200 s floor",
        "point 0 (64 users): 2500 requests, not a whole multiple of 1000",
        "2 point(s): the rules ask for 4 concurrency regions (--sweep e.g. 8,64,256,1024)",
        "no Ultra Low point (1-32 users): the first is 64"]


def test_an_mlperf_sweep_point_ends_on_whole_passes_after_its_floor(tmp_path, emulator_factory):
    """Each step lasts its floor (--min-duration here: the rules' 600 s would be the test's length), then ends on a
    whole pass of its --num-requests; the stamp names the override and judges every point."""
    emu = emulator_factory("--ttft", "0.02", "--itl", "0.005")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles" / "sweep.py"), "--headless", "--sweep", "1,4",
                          "--num-requests", "4", "--min-duration", "1.5", "--scenario", "mlperf-endpoints",
                          "--output-tokens", "8", "--host", emu.url, "--run-dir", str(run_dir)], tmp_path, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    scenario = json.loads((run_dir / "summary.json").read_text())["summary"]["scenario"]
    points = scenario["points"]
    assert [p["users"] for p in points] == [1, 4] and all(p["floor_s"] == 1.5 for p in points)
    for p in points:  # a whole number of passes, more than one (a pass of 4 takes far less than 1.5 s), the floor kept
        assert p["whole_passes"] and p["requests"] % 4 == 0 and p["requests"] > 4 and p["seconds"] >= 1.5, p
    logs = [json.loads(x) for f in run_dir.glob("requests*.jsonl") for x in f.read_text().splitlines()]
    assert [sum(r["step"] == k and not r["warmup"] for r in logs) for k in (0, 1)] == [p["requests"] for p in points]
    reasons = [r for r in scenario["invalid_reasons"] if not r.startswith("the run is untrustworthy (")]
    assert not scenario["valid"] and reasons == [
        "override: --min-duration 1.5 (the scenario's 0.0: each point at least 600 s (1-32 users) or 1,200 s "
        "(above): the rules' minimum)",
        "2 point(s): the rules ask for 4 concurrency regions (--sweep e.g. 8,64,256,1024)"]
    trusted = not json.loads((run_dir / "summary.json").read_text())["trust"]["detail"].startswith("UNTRUSTWORTHY")
    assert trusted == (reasons == scenario["invalid_reasons"])  # a busy host's distrust is one more reason
    assert "mlperf-endpoints (MLPerf Endpoints v1.0 draft rules): NOT VALID" in res.stdout
    for step in sorted((run_dir / "steps").iterdir()):  # each point in the benchmark's result shape
        result = json.loads((step / "performance" / "result_summary.json").read_text())
        assert result["n_samples_completed"] % 4 == 0 and result["tps_per_user"] and result["system_tps"]


def test_an_idle_shift_moves_every_pending_turn_by_one_amount_and_only_while_idle():
    """AIPerf's system idle cap: with nothing in flight, the earliest pending turn comes cap_s from now and the
    others keep their spacing; a request in flight, an imminent turn (due not yet known) or a turn already due
    moves none; a parent waiting on its subagents (due never) moves with them untouched."""
    import time

    from vllm_load.plugin.load.idle_shift import IdleShift

    flight = [0]
    shift = IdleShift(0.5, lambda: flight[0])
    now = time.time()
    a, b, parent = shift.timer(now + 60.0), shift.timer(now + 75.0), shift.timer(math.inf)
    flight[0] = 1
    shift.shift_if_idle()
    assert (a.at, b.at, shift.shifts) == (now + 60.0, now + 75.0, 0)  # busy: nothing moves
    flight[0] = 0
    imminent = shift.timer()
    shift.shift_if_idle()
    assert (a.at, shift.shifts) == (now + 60.0, 0)  # a turn about to be built: not idle
    shift.cancel(imminent)
    shift.shift_if_idle()
    assert shift.shifts == 1 and b.at - a.at == 15.0 and parent.at == math.inf
    assert 0 < a.at - time.time() <= 0.5 and shift.shifted_s > 59.0
    shift.shift_if_idle()
    assert shift.shifts == 1  # within the cap now: moved once
    shift.cancel(b)
    shift.cancel(parent)
    assert shift.wait(a) == a.at and time.time() >= a.at  # the wait ends at the shifted time, not 60 s on


def test_a_recycled_play_is_its_own_session_with_its_own_blocks():
    from vllm_load.workload.inputs.sessions import Fork, Session, Turn, own_blocks, replayed

    sub = Session("t::a1", (Turn(32, 2, 0.0, (1, 2, 9)),), 16)
    first = own_blocks(Session("t", (Turn(32, 2, 0.0, (1, 2)), Fork(sub, True), Turn(48, 2, 1.0, (1, 2, 3))), 16))
    assert replayed(first, 1, True) is not first and replayed(first, 1) is first
    again = replayed(first, 2)
    assert again.id == "t~2" and again.steps[1].session.id == "t::a1~2"  # a subagent stays one ("::")
    assert [s.hash_ids for s in again.steps if isinstance(s, Turn)] == [(s.hash_ids) for s in first.steps
                                                                         if isinstance(s, Turn)]
    busted = replayed(first, 2, cache_bust=True)
    blocks = {h for s in first.steps if isinstance(s, Turn) for h in s.hash_ids}
    new = [s.hash_ids for s in busted.steps if isinstance(s, Turn)]
    assert not blocks & {h for ids in new for h in ids} and new[1][:2] == new[0]  # shared within, not across plays
    assert busted.steps[1].session.steps[0].hash_ids[:2] == new[0]  # its subagent shares the play's blocks


def test_timing_the_system_idle_cap_sends_a_long_wait_after_the_cap_not_its_recorded_delay(tmp_path, emulator_factory):
    """Two sessions whose second turns wait 30 s and 33 s: with --max-idle inf --system-idle-cap 1 both go out within
    a 6 s run (without the cap, neither would); the first of them no sooner than 1 s after the last request before
    it ended (the system idle), and not many seconds later."""
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps({"session_id": f"s{i}", "turns": [
        {"input_tokens": 20, "output_tokens": 4}, {"input_tokens": 30, "output_tokens": 4, "delay": 30.0 + 3 * i}]})
        + "\n" for i in range(2)))
    emu = emulator_factory("--ttft", "0.005", "--itl", "0.002")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", SESSIONS, "--headless", "-u", "2", "-r", "2", "-t", "6s", "--host", emu.url,
                          "--sessions", str(path), "--sessions-format", "jsonl", "--max-idle", "inf",
                          "--system-idle-cap", "1", "--run-dir", str(run_dir), "--allow-untrustworthy"], tmp_path,
                         timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = sorted((json.loads(x) for x in (run_dir / "requests.jsonl").read_text().splitlines()),
                  key=lambda r: r["start"])
    assert [r["session"] for r in logs][2:] == ["s0", "s1"] and len(logs) == 4, [(r["session"], r["start"])
                                                                                  for r in logs]
    idle_from = max(r["start"] + r["e2e"] for r in logs[:2])
    assert 0.95 <= logs[2]["start"] - idle_from < 3.0, logs[2]["start"] - idle_from
