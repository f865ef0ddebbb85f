"""Fault actions on their planned clock (``plugin/watch/fault_plan.run_plan``): each in a greenlet of its own, so one that
runs long delays no other (an undrain planned at 45 s ran at 76.4 s behind a restart), unless the plan asks for the
order (``AT after previous``); every record holds the planned and the actual start; actions that never began are
named. The timing bounds are the subject here (0.5 s: the lateness every output flags)."""

from __future__ import annotations

import re
import time

import gevent

from vllm_load.plugin.watch import fault_plan
from vllm_load.plugin.watch.fault_plan import LATE_S, not_begun, parse_action, parse_plan, run_plan


def _run(lines: list[str]) -> tuple[list[dict], list[str], float]:
    actions = parse_plan(lines)
    done: list[dict] = []
    said: list[str] = []
    start = time.time()
    run_plan(actions, start, done, said.append)
    return done, said, start


def test_timing_an_action_starts_on_its_planned_time_while_an_earlier_one_still_runs():
    done, said, start = _run(["0s: exec: sleep 1.5", "0.5s: exec: true"])
    first, second = sorted(done, key=lambda d: d["at"])
    assert abs(second["start"] - (start + 0.5)) < LATE_S  # not after the first one's end (1.5 s)
    assert second["start"] < first["end"] and first["ok"] and second["ok"]
    assert second["started_s"] == round(second["start"] - start, 3) and second["late_s"] < LATE_S
    assert "(started at" not in second["label"] and second["late"] is False


def test_an_action_after_previous_stays_behind_the_action_written_before_it_whatever_its_own_time():
    """A rolling update's '0s after previous: undrain' (once the restart ends): sorted by its own 0 s it ran first,
    before the drain, and the replica stayed drained for the rest of a real fleet's run."""
    plan = parse_plan(["2s: drain: http://r2", "4s: restart: ./restart.sh", "0s after previous: undrain: http://r2",
                       "1s: exec: true", "3s: exec: a", "0.5s after previous: exec: b"])
    assert [(a.kind, a.what) for a in plan] == [("exec", "true"), ("drain", "http://r2"), ("exec", "a"),
                                                 ("exec", "b"), ("restart", "./restart.sh"), ("undrain", "http://r2")]
    done, _, _ = _run(["0.3s: exec: sleep 0.5", "0s after previous: exec: true"])
    first, second = done
    assert first["kind"] == "exec" and first["at"] == 0.3 and second["start"] >= first["end"]


def test_timing_after_previous_waits_for_the_previous_action_and_says_when_it_started_not_late():
    action = parse_action("0.2s after previous: exec: true")
    assert action.after and action.at == 0.2
    done, said, start = _run(["0s: exec: sleep 1.2", "0.2s after previous: exec: true"])
    first, second = sorted(done, key=lambda d: d["at"])
    assert second["start"] >= first["end"] and second["after_previous"]
    # waiting for the previous action is its plan: it says so and when it started, and is not flagged late (a
    # rolling update's '0s after previous: undrain' behind an 18 s restart printed "LATE", 22.0 s late)
    assert second["waited_s"] > 0.9 and second["late_s"] < LATE_S and second["late"] is False
    assert second["label"].startswith("exec at 0.2 s after previous: true (started at ")
    assert second["label"].endswith("when the previous action ended, as planned)")
    assert any("when the previous action ended, as planned" in line for line in said)
    assert not any("LATE" in line for line in said)
    # the first action's span as said: from 0.0 to its end, at least its 1.2 s sleep (a busy host adds to it)
    spans = [float(m.group(1)) for line in said if (m := re.search(r"\(from 0\.0 to (\d+\.\d) s\)", line))]
    assert spans and min(spans) >= 1.2 and abs(min(spans) - round(first["end"] - start, 1)) <= 0.1, said


def test_killed_with_the_run_the_running_actions_and_their_commands_go_too(tmp_path):
    pidfile = tmp_path / "pid"
    done: list[dict] = []
    g = gevent.spawn(run_plan, parse_plan([f"0s: exec: echo $$ > {pidfile}; sleep 300"]), time.time(), done,
                     lambda _line: None)
    deadline = time.time() + 30
    while not (pidfile.exists() and pidfile.read_text().strip()) and time.time() < deadline:
        gevent.sleep(0.05)  # polls the command's own word that it started
    g.kill()
    pid = int(pidfile.read_text())
    import os
    assert done and done[0]["end"] is None  # cut: the run ended mid-command
    try:
        os.kill(pid, 0)
        alive = open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        alive = False
    assert not alive


def test_actions_that_never_began_are_named_with_why():
    actions = parse_plan(["1s: exec: true", "5s: exec: true", "50s: exec: true"])
    done = [{"at": 1.0, "kind": "exec"}]
    missing = not_begun(actions, done, 40.0)
    assert [m["at"] for m in missing] == [5.0, 50.0]
    assert "the run ended before it began" in missing[0]["detail"]
    assert "planned after the run's end (40.0 s)" in missing[1]["detail"]
    assert fault_plan.LATE_S == 0.5
