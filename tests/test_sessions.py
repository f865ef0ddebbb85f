"""Agent sessions replayed as they ran (locustfiles/sessions.py): every turn once, each sent when its predecessor
completed plus its delay, subagents forked and joined, exact prompt lengths, and the server's cached tokens equal
to what the shared blocks predict; from a generic sessions JSONL and from Weka/AgentX trace files."""

from __future__ import annotations

import json
import os
from collections import defaultdict

import pytest

from tests.helpers import ROOT, run_in_process
from tests.make_sessions import BLOCK, sessions_jsonl, weka_traces
from vllm_load.rundir.reqlog import read_log
from vllm_load.errors import UsageError
from vllm_load.workload.inputs.sessions import Fork, read_sessions

SESSIONS = str(ROOT / "locustfiles" / "sessions.py")
#: how close a turn leaves to its predecessor's completion plus its delay (the issue's bound)
PACE_S = 0.005


def _replay(tmp_path, emulator_factory, source, *extra):
    emu = emulator_factory("--enable-prompt-tokens-details", "--ttft", "0.005", "--itl", "0.002")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", SESSIONS, "--headless", "-u", "5", "-r", "5", "-t", "90s", "--host", emu.url,
                          "--sessions", str(source), *extra, "--run-dir", str(run_dir)], tmp_path, timeout=180)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "every session was replayed: stopping the run" in res.stdout  # it ended by itself, not by -t
    return read_log(run_dir / "requests.jsonl"), res


def _flatten(session, out):
    """session id -> its turns and forks, in order (the file's view)."""
    out[session.id] = session.steps
    for step in session.steps:
        if isinstance(step, Fork):
            _flatten(step.session, out)
    return out


def _check(logs, sessions):
    steps = {}
    for s in sessions:
        _flatten(s, steps)
    by_session = defaultdict(list)
    for r in logs:
        assert r["ok"], r["error"]
        by_session[r["session"]].append(r)
    # every turn once, in every session, subagents included
    assert {sid: len(rs) for sid, rs in by_session.items()} == {
        sid: sum(1 for x in st if not isinstance(x, Fork)) for sid, st in steps.items()}
    ends = {sid: max(r["start"] + r["e2e"] for r in rs) for sid, rs in by_session.items()}
    late, lags = [], []
    for sid, rs in by_session.items():
        rs.sort(key=lambda r: r["start"])
        turns = [x for x in steps[sid] if not isinstance(x, Fork)]
        for k, (r, turn) in enumerate(zip(rs, turns)):
            assert r["input_tokens"] == r["input_tokens_asked"] == turn.input_tokens  # exact, the server's count
            assert r["output_tokens"] == turn.output_tokens
            if k == 0:
                continue
            ready = rs[k - 1]["start"] + rs[k - 1]["e2e"]
            # a joined subagent between them: the turn waits for it too, its delay counted from the later end
            i = steps[sid].index(turn)
            joined = [x.session.id for x in steps[sid][:i] if isinstance(x, Fork) and x.join
                      and steps[sid].index(x) > steps[sid].index(turns[k - 1])]
            if joined:
                ready = max(ready, *(ends[j] for j in joined))
            # due then, and timed from then (the record's start is the due time), however late the send was
            late.append(r["start"] - (ready + turn.delay))
            lags.append(r["send_lag"])
    assert late and all(abs(d) <= 0.001 for d in late), sorted(late)[-5:]
    # and sent then: the median turn within PACE_S of it, none 10 times later (on a quiet machine the slowest
    # was 2-4 ms; beside a running test suite on these 2 cores, single turns 6 ms: every send's lag is in its
    # record, and the run's trust verdict judges the client's lateness, which is not what this test is about)
    lags.sort()
    assert lags[len(lags) // 2] <= PACE_S and lags[-1] <= 10 * PACE_S, lags[-5:]
    # the prefix cache saw the reuse the blocks record: each turn hits the blocks an earlier prompt had, whole
    seen: list[tuple[int, ...]] = []
    offsets = set()
    for r in sorted(logs, key=lambda r: r["start"]):
        sid = r["session"]
        k = sorted(by_session[sid], key=lambda x: x["start"]).index(r)
        ids = [x for x in steps[sid] if not isinstance(x, Fork)][k].hash_ids
        shared = max((next((i for i, (a, b) in enumerate(zip(ids, p)) if a != b), min(len(ids), len(p)))
                      for p in seen), default=0)
        offsets.add(r["cached_tokens"] - BLOCK * shared)
        seen.append(ids)
    assert len(offsets) == 1, offsets  # one constant: the template's shared leading tokens, whole blocks of them


@pytest.mark.quiet_cores
def test_a_sessions_jsonl_replays_every_turn_paced_by_completions(tmp_path, emulator_factory):
    made = sessions_jsonl(tmp_path / "sessions.jsonl")
    sessions = read_sessions(tmp_path / "sessions.jsonl")
    assert len(sessions) == len(made) == 20 and any(isinstance(s, Fork) for x in sessions for s in x.steps)
    logs, res = _replay(tmp_path, emulator_factory, tmp_path / "sessions.jsonl")
    _check(logs, sessions)
    assert len(logs) == sum(s.turns() for s in sessions)


@pytest.mark.quiet_cores
def test_weka_agentx_traces_replay_with_their_subagents(tmp_path, emulator_factory):
    weka_traces(tmp_path / "traces")
    sessions = read_sessions(tmp_path / "traces")
    assert len(sessions) == 20 and sum(isinstance(s, Fork) for x in sessions for s in x.steps) == 10
    logs, _res = _replay(tmp_path, emulator_factory, tmp_path / "traces")
    _check(logs, sessions)


def test_bad_sessions_files_are_one_line(tmp_path):
    for name, text, said in (("bad.jsonl", '{"session_id": "a", "turns": [{"input_tokens": -1, "output_tokens": 2}]}\n',
                              "line 1 is not a session"),
                             ("bad.json", json.dumps({"id": "t", "block_size": 16, "hash_id_scope": "other",
                                                      "requests": []}), "is not a Weka trace")):
        (tmp_path / name).write_text(text)
        res = run_in_process(["-f", SESSIONS, "--headless", "-u", "1", "-t", "5s", "--sessions", str(tmp_path / name),
                              "--run-dir", str(tmp_path / "run")], tmp_path, timeout=60)
        errors = [x for x in res.stderr.splitlines() if x.startswith("vllm-load: error:")]
        assert res.returncode == 2 and len(errors) == 1 and said in errors[0], res.stderr[-1500:]


@pytest.mark.parametrize("text,said", [
    ('{"session_id": "a", "turns": [{"input_tokens": 0, "output_tokens": 2}]}',
     "line 1 is not a session (ValueError: turn 1: input_tokens 0 must be 1 or more and 16777216 or less)"),
    ('{"session_id": "a", "block_size": -16, "turns": [{"input_tokens": 9, "output_tokens": 2}]}',
     "block_size -16 must be 1 or more and 1048576 or less"),
    ('{"session_id": "a", "turns": [{"input_tokens": 9, "output_tokens": 2}, {"input_tokens": 9.5, '
     '"output_tokens": 2}]}', "turn 2: input_tokens 9.5 is not a count"),
    ('{"session_id": "a", "turns": [{"input_tokens": 9, "output_tokens": 2, "hash_ids": [1, -2]}]}',
     "turn 1: a hash id -2 must be 0 or more"),
    (json.dumps({"id": "t", "block_size": 0, "requests": []}), "block_size 0 must be 1 or more"),
    (json.dumps({"id": "t", "block_size": 16, "requests": [{"type": "n", "t": 0, "in": 5, "out": 1},
                                                          {"type": "n", "t": 1, "in": 0, "out": 1}]}),
     "t call 2: in 0 must be 1 or more"),
    (json.dumps({"id": "t", "block_size": 16, "requests": [{"type": "n", "t": 0, "in": 1e400, "out": 1}]}),
     "t call 1: in inf is not a count"),
    (json.dumps({"id": "t", "block_size": 16, "requests": [{"type": "n", "t": 0, "in": 1e30, "out": 1}]}),
     "t call 1: in 1e+30 must be 1 or more and 16777216 or less"),  # was an OverflowError: exit 4, 0 requests
    (json.dumps({"id": "t", "block_size": 16, "requests": [{"type": "n", "t": 0, "in": 5, "out": 1,
                                                          "think_time": 1e308}]}),
     "think_time 1e+308 is not a time (0 to 1e+06 s)"),
    ("[" * 300 + "]" * 300, "JSON nested over 200 levels deep"),
], ids=["no input", "negative block", "fractional input", "negative hash id", "weka block 0", "weka in 0",
        "weka infinite", "weka in 10^30", "a wait of 1e308", "nested 300 deep"])
def test_every_sessions_field_is_checked_before_anything_native_runs(tmp_path, text, said):
    """A turn of 0 input tokens raised in the user task; a block_size of 0 or -16 reached the C code (SystemError:
    negative size). Each is one line naming the file, the line or call, and the field, at load."""
    path = tmp_path / ("s.jsonl" if text.startswith('{"session_id"') else "t.json")
    path.write_text(text + "\n")
    with pytest.raises(UsageError) as err:
        read_sessions(path)
    assert str(err.value).startswith(f"sessions {path}") and said in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("option", ["--sessions"])
def test_sessions_options_belong_to_sessions_py(tmp_path, option):
    res = run_in_process(["-f", str(ROOT / "locustfiles" / "chat.py"), "--headless", "-u", "1", "-t", "3s", option, "x",
                          "--run-dir", str(tmp_path / "run")], tmp_path, timeout=60)
    assert res.returncode == 2 and "read by locustfiles/sessions.py only" in res.stderr


def test_agentx_start_point_warms_the_turn_before_it_and_measures_from_it(tmp_path, emulator_factory):
    """--session-start 0.5,0.5: each user's first session begins at its middle turn, after a warm-up turn (the one
    before it, the whole history so far: left out of the numbers) that leaves the server's cache as the recording's
    session had it; the turns before are never sent; the user's later sessions start from their first turn."""
    made = sessions_jsonl(tmp_path / "sessions.jsonl", count=8)
    sessions = {s.id: s for s in read_sessions(tmp_path / "sessions.jsonl")}
    logs, res = _replay(tmp_path, emulator_factory, tmp_path / "sessions.jsonl", "--session-start", "0.5,0.5")
    by_session = defaultdict(list)
    for r in logs:
        by_session[r["session"]].append(r)
    warmed = [sid for sid, rs in by_session.items() if any(r["warmup"] for r in rs)]
    assert len(warmed) == 5  # the 5 users' first sessions (each has at least 2 turns: k >= 1)
    for sid in warmed:
        turns = [x for x in sessions[sid].steps if not isinstance(x, Fork)]
        k = len(turns) // 2
        rs = sorted(by_session[sid], key=lambda r: r["start"])
        assert [r["warmup"] for r in rs] == [True] + [False] * (len(turns) - k)
        assert [r["input_tokens"] for r in rs] == [t.input_tokens for t in turns[k - 1:]]
        # the measured first turn found the warm-up's blocks in the cache: every block the two share, whole
        shared = sum(1 for a, b in zip(turns[k - 1].hash_ids, turns[k].hash_ids) if a == b)
        assert rs[1]["cached_tokens"] >= BLOCK * shared > 0
    others = [sid for sid in by_session if sid not in warmed and "::" not in sid]
    assert all(len(by_session[sid]) == len([x for x in sessions[sid].steps if not isinstance(x, Fork)])
               for sid in others)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())["summary"]
    assert summary["warmup_excluded"] == 5 and summary["requests"] == len(logs) - 5
    assert len(made) == 8
    # said as what they are, with no --warmup given ("started during --warmup" was not so)
    assert ("warm-up: 5 requests sent as warm-up (started during --warmup, or sent as warm-up by the locustfile)"
            in res.stdout) and "requests started during --warmup" not in res.stdout
    # the start-up line and the report's Load line say where the lengths came from (it said "input 128 output 64")
    assert "max_model_len 32768 lengths from the sessions" in res.stdout and "output 64 tokens" not in res.stdout
    assert "lengths from the sessions" in (tmp_path / "run" / "summary.md").read_text()
    # a replay's users wait as the recording did: no "delivered load ... NOT as asked" verdict on them
    assert summary.get("delivered") is None and "delivered load" not in res.stdout


def test_a_bad_session_start_is_one_line(tmp_path):
    sessions_jsonl(tmp_path / "s.jsonl", count=2)
    res = run_in_process(["-f", SESSIONS, "--headless", "-u", "1", "-t", "5s", "--sessions", str(tmp_path / "s.jsonl"),
                          "--session-start", "0.8,0.2", "--run-dir", str(tmp_path / "run")], tmp_path, timeout=60)
    assert res.returncode == 2 and "--session-start '0.8,0.2': need 0 <= MIN <= MAX <= 1" in res.stderr


@pytest.mark.slow
def test_a_replay_whose_last_turns_wait_past_minus_t_ends_at_minus_t(tmp_path):
    """sessions.py -t 4s whose traces' last turns wait out an 8 s think time never exited (5 of 5, no summary): the
    user stopped mid-wait parked in its session's ``finally``, in the greenlet Locust was killing."""
    import subprocess
    import sys
    import time

    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps({"session_id": f"s{i}", "turns": [
        {"input_tokens": 20, "output_tokens": 4}, {"input_tokens": 30, "output_tokens": 4, "delay": 8.0}]}) + "\n"
        for i in range(2)))
    began = time.time()
    res = subprocess.run([sys.executable, "-m", "locust", "-f", SESSIONS, "--headless", "-u", "2", "-r", "2", "-t",
                          "3s", "--sessions", str(path), "--sessions-format", "jsonl", "--max-idle", "30",
                          "--only-summary", "--run-dir", str(tmp_path / "run"), "--allow-untrustworthy"],
                         cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                         timeout=120)
    took = time.time() - began
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert took < 8 + 3 + 20, took  # ended by -t, not by the 8 s wait (nor hung until a timeout)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())["summary"]
    assert summary["requests"] == 2  # the first turns; the second ones were due after -t and never sent


def _agent_sessions(path, count: int = 6) -> None:
    """Sessions whose subagent opens with its parent's first-turn blocks (an agent's system prompt and task), then
    its own: a hit on the parent's prefix that no turn of its own session made achievable."""
    rows = []
    for s in range(count):
        base = 1000 * (s + 1)
        ids = [base, base + 1]
        turns = []
        for k in range(4):
            ids = ids + [base + 10 + 2 * k, base + 11 + 2 * k]
            turns.append({"input_tokens": BLOCK * len(ids) + 24, "output_tokens": 3, "delay": 0.02,
                          "hash_ids": list(ids)})
        sub = [{"input_tokens": BLOCK * (3 + j) + 24, "output_tokens": 3, "delay": 0.02,
                "hash_ids": [base, base + 1, *range(base + 500, base + 501 + j)]} for j in range(2)]
        turns.insert(1, {"subagent": {"session_id": f"s{s}::sa:1", "turns": sub}, "join": True})
        rows.append({"session_id": f"s{s}", "block_size": BLOCK, "turns": turns})
    path.write_text("".join(json.dumps(x) + "\n" for x in rows))


def test_the_cache_verdict_counts_every_hit_the_blocks_allow_as_the_server_counted_them(tmp_path, emulator_factory,
                                                                                         sidecar_factory):
    """AgentX's cache line left out the hits its warm-up exists to make and the subagents' on their parents' prefix
    (14 % of them, issue 73): each turn was paired with its session's previous one. Now a replayed turn's achievable
    hits are the blocks an earlier prompt sent ahead of it, in the server's own blocks (32 tokens here: its
    vllm:cache_config_info through the sidecar); with a cache that evicts nothing they equal what the server hit,
    request by request, and the emulator's own counter (warm-ups included) equals the answers' sum."""
    from tests.helpers import counter
    from vllm_load.metrics.fleet.routing import _by_turns

    server_block = 32
    _agent_sessions(tmp_path / "agents.jsonl")
    emu = emulator_factory("--enable-prompt-tokens-details", "--ttft", "0.005", "--itl", "0.002", "--replica-name",
                           "r1", "--block-size", str(server_block))
    side = sidecar_factory("--vllm-url", emu.url, "--interval", "250ms", "--out", str(tmp_path / "series.jsonl"))
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", SESSIONS, "--headless", "-u", "3", "-r", "3", "-t", "60s", "--host", emu.url,
                          "--sessions", str(tmp_path / "agents.jsonl"), "--session-start", "0.5,0.5",
                          "--capture-header", "X-Vllm-Load-Replica", "--sidecar-url", side.url, "--run-dir",
                          str(run_dir), "--no-history"], tmp_path, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = read_log(run_dir / "requests.jsonl")
    assert all(r["ok"] for r in logs) and any(r["warmup"] for r in logs)
    # request by request, what the blocks allowed is what the server hit (whole server blocks)
    assert [min(r["reusable_tokens"], r["input_tokens"] - 1) // server_block * server_block for r in logs] == [
        r["cached_tokens"] for r in logs]
    assert any(r["reusable_tokens"] % server_block for r in logs)  # in 16-token blocks some would count more
    assert sum(r["cached_tokens"] for r in logs) == counter(emu.url, "vllm:prefix_cache_hits_total")
    routing = json.loads((run_dir / "summary.json").read_text())["summary"]["features"]["routing"]
    measured = [r for r in logs if not r["warmup"]]
    hits = sum(r["cached_tokens"] for r in measured)
    assert routing["cache_hits_achievable"] == routing["cache_hits_achieved"] == hits > 0, routing
    assert routing["cache_hits_of_achievable"] == 1.0 and routing["cache_block"] == server_block
    # pairing each turn with its previous one counted fewer: the primed first turns and the subagents' were missing
    by_session = defaultdict(list)
    for r in measured:
        by_session[r["session"]].append(r)
    paired, _ = _by_turns([sorted(rs, key=lambda r: r["start"]) for rs in by_session.values()], server_block)
    assert paired < hits, (paired, hits)
    assert f"prefix-cache hits {hits} of {hits} achievable tokens in the server's 32-token blocks (100%)" in res.stdout


def test_a_weka_replay_starts_each_first_session_at_its_t_star_by_recorded_time(tmp_path, emulator_factory):
    """--session-start 0.25,0.75 --seed 42 over Weka traces: each user's first session is warmed with the turn before
    its first turn at or after t* (drawn over the trace's recorded duration as AIPerf draws it), measured from it."""
    from vllm_load.workload.inputs.t_star import start

    weka_traces(tmp_path / "traces", count=6)
    sessions = {s.id: s for s in read_sessions(tmp_path / "traces")}
    logs, _res = _replay(tmp_path, emulator_factory, tmp_path / "traces", "--session-start", "0.25,0.75",
                         "--seed", "42")
    by_session = defaultdict(list)
    for r in logs:
        by_session[r["session"]].append(r)
    warmed = [sid for sid, rs in by_session.items() if any(r["warmup"] for r in rs)]
    assert warmed
    for sid in warmed:
        cut = start(sessions[sid], (0.25, 0.75), 42)
        assert cut.at is not None and [w for w, _ in cut.warm] == [sid]  # these traces' subagents never straddle t*
        kept = [x for x in cut.rest.steps if not isinstance(x, Fork)]
        own = sorted((r for r in by_session[sid]), key=lambda r: r["start"])
        assert [r["input_tokens"] for r in own] == [cut.warm[0][1].input_tokens, *(t.input_tokens for t in kept)]
        assert own[0]["warmup"] and not any(r["warmup"] for r in own[1:])


def test_a_subagent_live_at_t_star_is_warmed_beside_its_parent_and_measured_from_it(tmp_path, emulator_factory):
    """t* = 15 s of a trace whose subagent's calls are at 1, 12 and 16 s: the replay warms the root with its 10 s
    call and the subagent with its 12 s one (each under its own session id), then measures the root from its 20 s
    call and the subagent from its 16 s one; the calls before (0 s, 1 s) and a subagent wholly before t* never go."""
    from tests.test_t_star import _agent

    (tmp_path / "traces").mkdir()
    trace = _agent(tmp_path / "traces" / "t.json", {"live": [1.0, 12.0, 16.0], "early": [1.0, 2.0]})
    assert trace.id == "tr"
    logs, _res = _replay(tmp_path, emulator_factory, tmp_path / "traces", "--session-start", "0.5,0.5",
                         "--max-idle", "0.05")
    said = sorted((r["session"], r["warmup"], r["input_tokens"]) for r in logs)
    warm = [(s, n) for s, w, n in said if w]
    assert [s for s, _ in warm] == ["tr", "tr::sa:live"]
    measured = [s for s, w, _ in said if not w]
    assert measured.count("tr") == 2 and measured.count("tr::sa:live") == 1 and "tr::sa:early" not in measured
