"""AgentX's t* as AIPerf draws it (workload/inputs/t_star.py): its seed and draw equal AIPerf's own reference values
(rust/runtime/src/graph/tstar.rs' tests), the split is by the trace's recorded time (its subagents' calls included),
and sessions without recorded times keep the turns' share."""

from __future__ import annotations

import json

from tests.make_sessions import sessions_jsonl, weka_traces
from vllm_load.workload.inputs.sessions import Fork, Turn, read_sessions
from vllm_load.workload.inputs.t_star import recorded_times, sample_t_star, seed_for_trace_lane, start


def test_the_seed_and_the_draw_are_aiperfs_reference_values():
    assert seed_for_trace_lane(0, "trace-7", 0) == 5561269195474234662
    assert seed_for_trace_lane(42, "abc", 3) == 12694478397425876729
    assert sample_t_star(0.2, 0.8, 0, "trace-7", 1000.0) == 611.7386827809453
    assert sample_t_star(0.2, 0.8, 0, "trace-7", 0.0) == 0.0 and sample_t_star(0.2, 0.8, 0, "trace-7", -5.0) == 0.0
    assert sample_t_star(0.0, 0.0, 0, "trace-7", 1000.0) == 0.0  # a window of no width: its lower end, no draw
    assert sample_t_star(0.5, 0.3, 0, "trace-7", 1000.0) == 500.0


def _trace(path, calls, sub_at=None):
    """One Weka trace: calls at the given times, and a subagent at ``sub_at`` whose one call is the trace's last."""
    requests = [{"t": t, "type": "s", "model": "m", "in": 64, "out": 2, "hash_ids": [1], "api_time": 0.5}
                for t in calls]
    if sub_at is not None:
        requests.insert(1, {"t": sub_at, "type": "subagent", "agent_id": "a", "status": "completed", "models": ["m"],
                            "requests": [{"t": 100.0, "type": "s", "model": "m", "in": 64, "out": 2, "hash_ids": [2],
                                          "api_time": 1.0}]})
    path.write_text(json.dumps({"id": "tr", "block_size": 16, "hash_id_scope": "local", "requests": requests}))
    return read_sessions(path)[0]


def _calls(session):
    return [(t.at, round(t.delay, 6)) for t in session.steps if isinstance(t, Turn)]


def test_the_measured_part_starts_at_the_first_turn_at_or_after_t_star_by_recorded_time(tmp_path):
    # turns at 0, 1, 2, 3 and 40 s: by turn share 0.5 would be the third turn; by time, t* in 25-75 % of 40 s
    session = _trace(tmp_path / "a.json", [0.0, 1.0, 2.0, 3.0, 40.0])
    assert recorded_times(session) == [0, 1_000_000, 2_000_000, 3_000_000, 40_000_000]
    cut = start(session, (0.25, 0.75), 42)
    assert cut.at == sample_t_star(0.25, 0.75, 42, "tr", 40e6) / 1e6 and 10.0 <= cut.at <= 30.0
    # the 3 s turn warms it; the 40 s turn is due its recorded time after t*, from the start (AIPerf re-roots it)
    assert [(sid, t.at) for sid, t in cut.warm] == [("tr", 3.0)]
    assert _calls(cut.rest) == [(40.0, round(40.0 - cut.at, 6))]
    # the duration counts a subagent's call (at 100 s, after every turn of the root): t* moves with it
    with_sub = _trace(tmp_path / "b.json", [0.0, 1.0, 2.0, 3.0, 40.0], sub_at=0.5)
    assert start(with_sub, (0.25, 0.75), 42).at == sample_t_star(0.25, 0.75, 42, "tr", 100e6) / 1e6
    # evenly spaced turns: the first at or after t*, to the microsecond, the ones after it as recorded
    even = _trace(tmp_path / "c.json", [float(i) for i in range(11)])
    for seed in range(20):
        cut = start(even, (0.25, 0.75), seed)
        k = next(i for i in range(11) if i * 1_000_000 >= round(cut.at * 1e6, 3))
        assert [t.at for _, t in cut.warm] == [float(k - 1)]
        assert [a for a, _ in _calls(cut.rest)] == [float(i) for i in range(k, 11)]
    # the seed decides the draw: other seeds, other instants, the same for one seed every time
    assert len({start(session, (0.0, 1.0), seed).at for seed in range(8)}) == 8
    assert start(session, (0.0, 1.0), 3) == start(session, (0.0, 1.0), 3)


def _agent(path, subagents):
    """A root whose calls are at 0, 10, 20 and 30 s, with subagents forked after its first call (their calls at the
    given times), as AIPerf's snapshot fixture's chains: live at t*, wholly before it, wholly after it."""
    requests = [{"t": 0.0, "type": "s", "model": "m", "in": 64, "out": 2, "hash_ids": [1], "api_time": 0.1}]
    for name, times in subagents.items():
        requests.append({"t": times[0], "type": "subagent", "agent_id": name, "status": "completed", "models": ["m"],
                         "requests": [{"t": t, "type": "s", "model": "m", "in": 64, "out": 2, "hash_ids": [9],
                                       "api_time": 0.1} for t in times]})
    requests += [{"t": t, "type": "s", "model": "m", "in": 64, "out": 2, "hash_ids": [1, 2], "api_time": 0.1}
                 for t in (10.0, 20.0, 30.0)]
    path.write_text(json.dumps({"id": "tr", "block_size": 16, "hash_id_scope": "local", "requests": requests}))
    return read_sessions(path)[0]


def test_every_chain_live_at_t_star_is_warmed_and_one_wholly_before_it_is_not_sent(tmp_path):
    session = _agent(tmp_path / "a.json", {"ended": [1.0, 12.0, 14.0], "early": [1.0, 2.0], "after": [25.0, 26.0]})
    cut = start(session, (0.5, 0.5), 0)  # a window of no width: t* = 15 s exactly, no draw
    assert cut.at == 15.0
    assert [(sid, t.at) for sid, t in cut.warm] == [("tr", 10.0)]  # the root is live at t*; no subagent is
    forks = {s.session.id: s.session for s in cut.rest.steps if isinstance(s, Fork)}
    assert set(forks) == {"tr::sa:after"}  # "ended" and "early" ended before t*: neither is sent
    # "after" was forked after the root's dropped first call: its first call is due its time after t*, its next as
    # recorded; the root's first kept call too
    recorded = {s.session.id: s.session for s in session.steps if isinstance(s, Fork)}["tr::sa:after"]
    assert _calls(forks["tr::sa:after"]) == [(25.0, 10.0), (26.0, round(recorded.steps[1].delay, 6))]
    assert _calls(cut.rest) == [(20.0, 5.0), (30.0, round(session.steps[-1].delay, 6))]
    straddling = _agent(tmp_path / "b.json", {"live": [1.0, 12.0, 16.0]})
    cut = start(straddling, (0.5, 0.5), 0)
    assert [(sid, t.at) for sid, t in cut.warm] == [("tr", 10.0), ("tr::sa:live", 12.0)]  # both chains primed
    live = next(s.session for s in cut.rest.steps if isinstance(s, Fork))
    assert _calls(live) == [(16.0, 1.0)]  # its first call after t*, due 16 - 15 s from the start


def test_sessions_without_recorded_times_start_by_their_turns_share(tmp_path):
    sessions_jsonl(tmp_path / "s.jsonl", count=4)
    for s in read_sessions(tmp_path / "s.jsonl"):
        turns = [x for x in s.steps if isinstance(x, Turn)]
        assert recorded_times(s) is None
        cut = start(s, (0.5, 0.5), 42)
        k = min(len(turns) - 1, len(turns) // 2)
        assert cut.at is None and [t for _, t in cut.warm] == ([turns[k - 1]] if k else [])
        assert [x for x in cut.rest.steps if isinstance(x, Turn)] == turns[k:]


def test_weka_traces_keep_each_calls_recorded_time(tmp_path):
    traces = weka_traces(tmp_path / "traces", count=4)
    sessions = read_sessions(tmp_path / "traces")
    for trace, session in zip(traces, sessions):
        calls = [r["t"] for r in trace["requests"] if r["type"] != "subagent"]
        assert [t.at for t in session.steps if isinstance(t, Turn)] == calls
        assert all(isinstance(x, Turn) or x.session.steps for x in session.steps if isinstance(x, Fork))
