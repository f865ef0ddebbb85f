"""AgentX's t* as AIPerf draws it (workload/inputs/t_star.py): its seed and draw equal AIPerf's own reference values
(rust/runtime/src/graph/tstar.rs' tests), the split is by the trace's recorded time (its subagents' calls included),
and sessions without recorded times keep the turns' share."""

from __future__ import annotations

import json

from tests.make_sessions import sessions_jsonl, weka_traces
from vllm_load.workload.inputs.sessions import Fork, Turn, read_sessions
from vllm_load.workload.inputs.t_star import first_measured, recorded_times, sample_t_star, seed_for_trace_lane


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


def test_the_first_measured_turn_is_the_first_at_or_after_t_star_by_recorded_time(tmp_path):
    # turns at 0, 1, 2, 3 and 40 s: by turn share 0.5 would be the third turn; by time, t* in 25-75 % of 40 s
    session = _trace(tmp_path / "a.json", [0.0, 1.0, 2.0, 3.0, 40.0])
    assert recorded_times(session) == [0, 1_000_000, 2_000_000, 3_000_000, 40_000_000]
    k, at = first_measured(session, (0.25, 0.75), 42)
    assert at == sample_t_star(0.25, 0.75, 42, "tr", 40e6) / 1e6 and 10.0 <= at <= 30.0
    assert k == 4  # the only turn at or after t*: the 40 s one, the 3 s one its warm-up
    # the duration counts the subagent's call (at 100 s, after every turn of the root): t* moves with it
    with_sub = _trace(tmp_path / "b.json", [0.0, 1.0, 2.0, 3.0, 40.0], sub_at=0.5)
    k2, at2 = first_measured(with_sub, (0.25, 0.75), 42)
    assert at2 == sample_t_star(0.25, 0.75, 42, "tr", 100e6) / 1e6 and 25.0 <= at2 <= 75.0
    assert k2 == 4  # the 40 s turn, or past it the root's last turn all the same (something to measure)
    # evenly spaced turns: the first at or after t*, to the microsecond
    even = _trace(tmp_path / "c.json", [float(i) for i in range(11)])
    for seed in range(20):
        k3, at3 = first_measured(even, (0.25, 0.75), seed)
        assert at3 is not None and k3 == next(i for i in range(11) if i * 1_000_000 >= round(at3 * 1e6, 3))
    # the seed decides the draw: other seeds, other instants, the same for one seed every time
    draws = {first_measured(session, (0.0, 1.0), seed)[1] for seed in range(8)}
    assert len(draws) == 8 and first_measured(session, (0.0, 1.0), 3) == first_measured(session, (0.0, 1.0), 3)


def test_sessions_without_recorded_times_start_by_their_turns_share(tmp_path):
    sessions_jsonl(tmp_path / "s.jsonl", count=4)
    for s in read_sessions(tmp_path / "s.jsonl"):
        turns = [x for x in s.steps if isinstance(x, Turn)]
        assert recorded_times(s) is None
        k, at = first_measured(s, (0.5, 0.5), 42)
        assert at is None and k == min(len(turns) - 1, len(turns) // 2)


def test_weka_traces_keep_each_calls_recorded_time(tmp_path):
    traces = weka_traces(tmp_path / "traces", count=4)
    sessions = read_sessions(tmp_path / "traces")
    for trace, session in zip(traces, sessions):
        calls = [r["t"] for r in trace["requests"] if r["type"] != "subagent"]
        assert [t.at for t in session.steps if isinstance(t, Turn)] == calls
        assert all(isinstance(x, Turn) or x.session.steps for x in session.steps if isinstance(x, Fork))
