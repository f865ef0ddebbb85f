"""Which arrival sequence a load process's open loop follows (a rate sweep's step, a ramp, --ramp-up's linear start,
a --rate-schedule, or --request-rate), decided from the plan; every process draws it from the same seed and takes
its share (``workload/arrivals.py``)."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any, Callable

import gevent

from vllm_load.rundir.plan import RunPlan
from vllm_load.workload.arrivals import ArrivalSequence, constant_gap, index_ramp_gap, time_ramp_gap
from vllm_load.workload.rate_schedule import RateSchedule


def _time_ramp(strategy: str, start: float, end: float, seconds: float, t: float, _i: int, unit: float) -> float:
    return time_ramp_gap(strategy, start, end, seconds, t, unit)


def is_open_loop(plan: RunPlan, opts: Any, step: int | None, step_rate: float) -> bool:
    """Does the run (or its sweep step) send on an arrival schedule?"""
    if step is not None and plan.sweep_kind == "rate":
        return step_rate > 0
    return bool(plan.ramp) or bool(plan.rate_schedule) or float(opts.request_rate) > 0


def arrival_sequence(plan: RunPlan, opts: Any, step: int | None, step_rate: float, offset: float,
                     worker_index: int) -> ArrivalSequence:
    """The run's sequence (a sweep step's from ``offset``, the step's start on the schedule's clock)."""
    burstiness, shape = float(opts.burstiness), None
    if step is not None and plan.sweep_kind == "rate":
        gap = constant_gap(step_rate)
    elif plan.ramp:
        strategy, start, end, seconds = plan.ramp
        gap = (functools.partial(_time_ramp, strategy, start, end, seconds) if seconds else
               index_ramp_gap(strategy, start, end, plan.num_requests))
    elif plan.schedule is not None:
        gap, shape = plan.schedule.gap, functools.partial(_shape_at, plan.schedule, burstiness)
    elif float(opts.ramp_up) > 0:
        gap = functools.partial(_time_ramp, "linear", 0.0, float(opts.request_rate), float(opts.ramp_up))
    else:
        gap = constant_gap(float(opts.request_rate))
    step_key = step if step is not None and plan.sweep_kind == "rate" else None
    return ArrivalSequence(gap, burstiness, f"{plan.draws}/arrivals/{step_key}", worker_index, plan.processes,
                           offset, shape)


def _shape_at(schedule: RateSchedule, default: float, t: float) -> float:
    return schedule.burstiness_at(t, default)


@dataclass
class ScheduleEnd:
    """A rate schedule that ends the run (no -t): this process's arrivals taken before its last row (``end``) and
    those whose task ended; its share is done (``on_done``, once) when its sequence passed the row, the last of
    them ended and the row's time came, as a trace's share is when its last row came back."""

    end: float
    on_done: Callable[[], None]
    started: Callable[[], float]  # the schedule's start on the perf_counter clock (the run's epoch)
    due: int = 0
    ended: int = 0
    over: bool = False

    def take(self, t: float) -> bool:
        """An arrival at ``t`` drawn: send it (True), or not, past the last row."""
        if t < self.end and not self.over:
            self.due += 1
            return True
        self.over = True
        self.task_ended(0)
        return False

    def task_ended(self, count: int = 1) -> None:
        self.ended += count
        if self.over and self.ended >= self.due >= 0:
            self.due = -1  # said once
            gevent.spawn(self._done)

    def _done(self) -> None:
        """Said at the last row's time (a pause there still runs), once the last arrival's task ended."""
        gevent.sleep(max(0.0, self.started() + self.end - time.perf_counter()))
        self.on_done()
