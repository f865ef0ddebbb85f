"""Agent sessions made up from a spec (``--sessions synthetic:...``): each turn's context its predecessor's, grown;
a shared system prompt; subagents; the same sessions in every process; and a replay whose prompt-cache hits are
the growing prefix, exactly."""

from __future__ import annotations

from collections import defaultdict

import pytest

from tests.helpers import ROOT, run_in_process
from vllm_load.errors import UsageError
from vllm_load.rundir.reqlog import read_log
from vllm_load.workload.inputs.sessions import Fork, Turn, read_sessions

SPEC = "synthetic:sessions=6,turns=3-5,system=64,first=100-300,growth=20-80,output=8-24,think=0-0.05,subagents=0.5," \
       "subagent_turns=2,block=16,seed=7"


def turns_of(session):
    return [s for s in session.steps if isinstance(s, Turn)]


def test_a_spec_makes_agent_loops_whose_context_grows_turn_by_turn():
    sessions = read_sessions(SPEC)
    assert len(sessions) == 6 and read_sessions(SPEC) == sessions  # the same in every process
    assert read_sessions(SPEC.replace("seed=7", "seed=8")) != sessions
    forks = [s for x in sessions for s in x.steps if isinstance(s, Fork)]
    assert forks and all(len(turns_of(f.session)) == 2 and f.join for f in forks)
    system = tuple(range(1, 5))  # 64 tokens of shared system prompt: 4 blocks of 16, in every context
    for session in [*sessions, *(f.session for f in forks)]:
        turns = turns_of(session)
        assert turns[0].delay == 0 and all(0 <= t.delay <= 0.05 for t in turns)
        for a, b in zip(turns, turns[1:]):  # the whole previous context, then the answer and what came back
            assert b.hash_ids[:len(a.hash_ids)] == a.hash_ids and len(b.hash_ids) > len(a.hash_ids)
            grown = (len(b.hash_ids) - len(a.hash_ids)) * 16
            assert a.output_tokens + 20 <= grown < a.output_tokens + 80 + 16
        for t in turns:
            assert t.hash_ids[:4] == system and t.input_tokens == 16 * len(t.hash_ids) and 8 <= t.output_tokens <= 24
    own = [set(t.hash_ids[4:]) for x in sessions for t in turns_of(x)[:1]]
    assert all(not (a & b) for i, a in enumerate(own) for b in own[i + 1:])  # no two tasks share a block


@pytest.mark.parametrize("spec,said", [
    ("synthetic:sessions=0", "sessions and block must be 1 or more"),
    ("synthetic:turns=x", "turns='x' is not a length"),
    ("synthetic:subagents=1.5", "subagents='1.5' is not a share"),
    ("synthetic:think=3-1", "think='3-1' is not a seconds"),
    ("synthetic:color=red", "'color=red' is not KEY=VALUE of sessions, turns"),
])
def test_a_bad_spec_is_one_line(spec, said):
    with pytest.raises(UsageError, match=said.replace("(", r"\(")):
        read_sessions(spec)


def test_a_synthetic_replay_hits_exactly_the_growing_prefix(tmp_path, emulator_factory):
    emu = emulator_factory("--enable-prompt-tokens-details", "--ttft", "0.005", "--itl", "0.002")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles" / "sessions.py"), "--headless", "-u", "3", "-r", "3", "-t",
                          "90s", "--host", emu.url, "--sessions", SPEC, "--run-dir", str(run_dir)], tmp_path,
                         timeout=180)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "every session was replayed: stopping the run" in res.stdout
    sessions = read_sessions(SPEC)
    steps: dict[str, list] = {}

    def flatten(s):
        steps[s.id] = turns_of(s)
        for f in s.steps:
            if isinstance(f, Fork):
                flatten(f.session)

    for s in sessions:
        flatten(s)
    logs = read_log(run_dir / "requests.jsonl")
    by_session = defaultdict(list)
    for r in logs:
        assert r["ok"], r["error"]
        by_session[r["session"]].append(r)
    assert {k: len(v) for k, v in by_session.items()} == {k: len(v) for k, v in steps.items()}
    offsets = set()
    for sid, rs in by_session.items():
        rs.sort(key=lambda r: r["start"])
        for k, (r, turn) in enumerate(zip(rs, steps[sid])):
            assert r["input_tokens"] == turn.input_tokens and r["output_tokens"] == turn.output_tokens
            if k:  # the previous turn's whole context was cached by then (the emulator's 16-token blocks)
                offsets.add(r["cached_tokens"] - 16 * len(steps[sid][k - 1].hash_ids))
    # one constant for every turn (the chat template's tokens around the blocks shift where the whole blocks end):
    # each turn hits its predecessor's whole context, never more, never less
    assert len(offsets) == 1 and abs(offsets.pop()) < 2 * 16, offsets
