"""A scenario's abort rules: a run whose failed share passes the scenario's threshold stops, as AIPerf's
``--failed-request-threshold`` aborts an AgentX run, instead of measuring a fleet that is mostly failing; and a run
whose root session's t* warm-up failed stops before it measures, as AIPerf's ``trajectory_warmup_failed`` does (the
cache the measured turns stand on was never primed; a subagent's warm-up is not a root's).

Each load process judges its own requests (a swarm's worker stops the whole run through the master, as every fatal
line does) once it has ``LEAST`` measured ones: the first answers alone are no share (1 failed of 2 is 50 %)."""

from __future__ import annotations

from typing import Any, Callable

from vllm_load.client.record import RequestRecord
from vllm_load.errors import EXIT_INVALID

#: measured requests a process has ended before its failed share is judged
LEAST = 20


class FailedShare:
    """This process's measured requests and failures; ``on_fatal`` is told once, when the share passes ``limit``."""

    def __init__(self, limit: float, scenario: str, on_fatal: Callable[[str, int], Any]) -> None:
        self.limit, self.scenario, self.on_fatal = limit, scenario, on_fatal
        self.ended = self.failed = 0
        self.done = False

    def add(self, rec: RequestRecord) -> None:
        if not self.done and rec.warmup and not (rec.ok or rec.cancelled) and _root_warm_up(rec):
            self.done = True
            said = f"HTTP {rec.status}" if rec.status else "no answer"
            self.on_fatal(f"--scenario {self.scenario}: session {rec.session}'s warm-up failed ({said}): the run is "
                          "aborted before it measures and not valid for the scenario (AIPerf's "
                          "trajectory_warmup_failed)", EXIT_INVALID)
            return
        if self.done or rec.warmup or rec.cancelled or rec.abandoned or rec.removed:
            return  # not a measured request's outcome (a warm-up, the run's end, a cancel asked for)
        self.ended += 1
        self.failed += not rec.ok
        if self.ended >= LEAST and self.failed > self.limit * self.ended:
            self.done = True
            self.on_fatal(f"--scenario {self.scenario}: {self.failed} of {self.ended} requests failed "
                          f"({self.failed / self.ended * 100:.1f}%), over the scenario's {self.limit * 100:g}%: the "
                          "run is aborted and not valid for the scenario", EXIT_INVALID)


def _root_warm_up(rec: RequestRecord) -> bool:
    """A session's t* warm-up (sessions.py names it so), of a root session (a subagent's id holds ``::``)."""
    return rec.name == "warm-up" and bool(rec.session) and "::" not in str(rec.session)
