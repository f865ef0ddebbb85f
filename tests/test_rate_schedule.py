"""--rate-schedule (workload/rate_schedule.py): a file's points read or refused in one line, the run's one arrival
sequence stretched over the schedule's rate (each segment's arrivals its rate's integral, each its own gamma shape),
each segment's delivered rate judged against its band, and a run over a master and two workers sending exactly the
seeded sequence's arrivals in each segment."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from tests.helpers import ROOT, run_in_process
from vllm_load.errors import UsageError
from vllm_load.metrics.shape.delivered import by_segment, schedule_finding
from vllm_load.workload.arrivals import ArrivalSequence
from vllm_load.workload.rate_schedule import NEVER_S, Point, RateSchedule

CHAT = str(ROOT / "locustfiles/chat.py")


def _file(tmp_path, text: str) -> str:
    path = tmp_path / "schedule.csv"
    path.write_text(text)
    return str(path)


def arrivals(schedule: RateSchedule, seed: str, until: float, burstiness: float = 1.0, processes: int = 1) -> list:
    """The run's arrivals before ``until``, as every process of a swarm draws its share of them."""
    out = []
    for index in range(processes):
        seq = ArrivalSequence(schedule.gap, burstiness, seed, index, processes,
                              shape=lambda t: schedule.burstiness_at(t, burstiness))
        while (t := seq.next()) < until:
            out.append(t)
    return sorted(out)


def test_a_schedule_file_reads_with_its_units_comments_and_defaults(tmp_path):
    s = RateSchedule.read(_file(tmp_path, "# a morning\nat,rate,between,burstiness\n0,2,linear\n1m,12,,0.5\n90s,0\n"))
    assert s.points == (Point(0, 2, "linear"), Point(60, 12, "step", 0.5), Point(90, 0))
    assert s.end == 90 and s.rate_at(30) == 7 and s.rate_at(75) == 12 and s.rate_at(1000) == 0
    assert s.area(0, 60) == 420 and s.area(60, 90) == 360 and s.area(90, 200) == 0
    assert [s.segment_of(t) for t in (0, 59.9, 60, 89, 90, 500)] == [0, 0, 1, 1, 2, 2]
    assert RateSchedule.of(s.to_wire()) == s  # the plan's wire form


@pytest.mark.parametrize("text, says", [
    ("time,rate\n0,1\n", "its first line must be the header at,rate[,between,burstiness]"),
    ("at,rate,shape\n0,1,step\n", "unknown column 'shape'"),
    ("at,rate\n", "no rows"),
    ("at,rate\n5,1\n", "the first row is at 5 s: the schedule starts at 0"),
    ("at,rate\n0,1\n10,2\n10,3\n", "the row at 10 s does not come after the one at 10 s"),
    ("at,rate\n0,1\nsoon,2\n", "line 3: at 'soon' is not a duration"),
    ("at,rate\n0,fast\n", "line 2: rate 'fast' is not a number"),
    ("at,rate\n0,-1\n", "line 2: rate -1 must be a finite number >= 0"),
    ("at,rate,between\n0,1,smooth\n", "between 'smooth' is not step or linear"),
    ("at,rate,between,burstiness\n0,1,step,0\n", "burstiness must be > 0"),
    ("at,rate\n0,0\n10,0\n", "every rate is 0: nothing would be sent"),
])
def test_a_bad_schedule_is_one_line_naming_its_row(tmp_path, text, says):
    with pytest.raises(UsageError, match=None) as err:
        RateSchedule.read(_file(tmp_path, text))
    assert says in str(err.value) and "\n" not in str(err.value)


def test_constant_gaps_put_each_segments_area_in_it():
    """burstiness inf (vLLM's constant gaps): each segment holds its rate's integral, to the arrival on its edge; a
    pause (rate 0) is passed over; past the last row the last rate holds."""
    s = RateSchedule.of([Point(0, 10, "linear"), Point(10, 30), Point(20, 0), Point(25, 5)])
    times = arrivals(s, "x", 35.0, burstiness=math.inf)
    counts = [sum(1 for t in times if s.segment_of(t) == k) for k in range(4)]
    assert [abs(c - a) <= 1 for c, a in zip(counts, (200, 300, 0, 50))] == [True] * 4, counts
    assert not any(20 <= t < 25 for t in times)
    assert RateSchedule.of([Point(0, 5), Point(2, 0)]).gap(2.5, 0, 1.0) == NEVER_S  # ends at 0: none after


@pytest.mark.parametrize("processes", [1, 3])
def test_seeded_arrivals_are_delivered_as_asked_in_every_segment_with_its_own_shape(processes):
    s = RateSchedule.of([Point(0, 20, "linear"), Point(30, 60, "step", 4.0), Point(60, 40, "step", math.inf)])
    times = arrivals(s, "seed 3/arrivals/None", 90.0, processes=processes)
    found = schedule_finding(by_segment(times, s, 90.0, 1.0))
    assert [g["as_asked"] for g in found["segments"]] == [True, True, True], found["detail"]
    assert found["as_asked"] is True and "3 of 3 segments judged, each sent as asked" in found["detail"]
    for k, cv in ((1, 0.5), (2, 0.0)):  # gamma(4)'s gaps, then constant ones
        inside = [t for t in times if s.segment_of(t) == k]
        gaps = [b - a for a, b in zip(inside, inside[1:])]
        assert statistics.pstdev(gaps) / statistics.mean(gaps) == pytest.approx(cv, abs=0.06)


def test_a_segment_sent_short_is_flagged_and_a_short_one_not_judged():
    s = RateSchedule.of([Point(0, 20), Point(30, 40), Point(60, 5)])
    times = arrivals(s, "y", 62.0)
    short = [t for i, t in enumerate(times) if not (30 <= t < 60 and i % 5 == 0)]  # a fifth of segment 1 lost
    found = schedule_finding(by_segment(short, s, 62.0, 1.0))
    assert [g["as_asked"] for g in found["segments"]] == [True, False, None], found["detail"]
    assert found["as_asked"] is False and "NOT as asked in segment 1" in found["detail"]


def test_a_scheduled_run_over_two_workers_sends_each_segments_seeded_arrivals(tmp_path):
    """A master and two workers in this process, seeded: each segment's requests (by their intended start) are
    exactly the seeded sequence's arrivals in it; every send is counted; no -t: the run ends at the last row."""
    rows = "at,rate,between,burstiness\n0,10,linear\n2,30,step,4\n3.5,0\n4,0\n"
    schedule = RateSchedule.read(_file(tmp_path, rows))
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", CHAT, "--headless", "--processes", "2", "-u", "4", "-r", "4", "--seed", "7",
                          "--rate-schedule", str(tmp_path / "schedule.csv"), "--input-tokens", "32",
                          "--output-tokens", "4", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    expected = arrivals(schedule, "seed 7/arrivals/None", 4.0)
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    segments = summary["delivered"]["segments"]
    per_segment = [sum(1 for t in expected if schedule.segment_of(t) == k) for k in range(3)]
    assert [g.get("requests", 0) for g in segments[:3]] == per_segment, (segments, per_segment)
    assert summary["requests"] == len(expected) == sum(g["sent"] for g in segments)
    assert segments[0]["rate_asked"] == 20 and segments[1]["rate_asked"] == 30 and segments[2]["rate_asked"] == 0
    assert [(g["from_s"], g["to_s"]) for g in segments] == [(0, 2), (2, 3.5), (3.5, 4)]  # the pause ran to its end
    assert "the rate schedule reached its last row: stopping the run" in res.stdout
    assert "delivered load: rate schedule:" in res.stdout and "  segment 1 (2-3.5 s): " in res.stdout
    assert "<table id='schedule'>" in (run_dir / "report.html").read_text()
    vllm = json.loads((run_dir / "vllm-result.json").read_text())  # vLLM's keys: the schedule's mean rate, not inf
    assert 0 < vllm["request_rate"] <= 30 and vllm["max_concurrency"] is None, vllm["request_rate"]
    plan = json.loads((run_dir / "config.json").read_text())["plan"]
    assert RateSchedule.of(plan["rate_schedule"]) == schedule


@pytest.mark.parametrize("extra, says", [
    (["--request-rate", "5"], "--rate-schedule sets the rate over the run's time: drop --request-rate"),
    (["--num-requests", "5"], "drop --num-requests"),
])
def test_a_schedule_beside_another_rate_is_refused_in_one_line(tmp_path, extra, says):
    _file(tmp_path, "at,rate\n0,5\n4,1\n")
    res = run_in_process(["-f", CHAT, "--headless", "-u", "1", "-r", "1", "--rate-schedule",
                          str(tmp_path / "schedule.csv"), *extra, "--run-dir", str(tmp_path / "run")], cwd=tmp_path)
    assert res.returncode == 2 and says in res.stdout + res.stderr, res.stdout[-2000:] + res.stderr[-2000:]
