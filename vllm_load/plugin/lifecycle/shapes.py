"""Sweeps: steps of concurrency (closed loop) or request rate (open loop), one Locust LoadTestShape.

    locust -f locustfiles/sweep.py --headless --sweep 64,128,256,512 --step-duration 60 [--stop-on-slo-miss]
    locust -f locustfiles/sweep.py --headless --sweep-mode rate --sweep 5,10,20 --sweep-users 32 ...

Every request is tagged with the step it started in; each step's metrics are kept apart (shipped from
workers like the run's totals) and written as a run directory of its own under ``<run dir>/steps/``, so
the report's sweep table and "largest level meeting every SLO" come from exact per-step histograms.
"""

from __future__ import annotations

import time
from typing import Any

from locust import LoadTestShape

from vllm_load.errors import UsageError
from vllm_load.plugin.lifecycle.sweep import SweepSpec
from vllm_load.workload.arrivals import ramp_users

#: Seconds after a step ends before it is judged: workers report every 3 s.
JUDGE_DELAY = 3.5


class RunClockShape(LoadTestShape):
    """A shape whose clock is the load's: it starts when the run's load can start (``load_started``), not at
    Locust's test start. A local run fills its prompt pools between the two (a busy host: over 2 s), and a sweep
    whose clock ran meanwhile began its second step before its first had sent a request."""

    started = False
    #: the load's start is time 0 (a sweep's steps count from it); False: Locust's test start stays time 0 and the
    #: clock only holds until the load can start (a users ramp over -t keeps Locust's -t timer's clock)
    restart_at_load = True

    def reset_time(self) -> None:
        super().reset_time()
        self.started = False

    def load_started(self) -> None:
        """The run's load can start now (a local generator is ready; a master's plan is decided)."""
        if self.restart_at_load:
            self.start_time = time.perf_counter()
        self.started = True

    def get_run_time(self) -> float:
        # held at 0 until then: Locust's spawning greenlet runs the test start while the shape ticks, and a second
        # step's tick meanwhile killed it (``LocalRunner.start`` kills the spawning greenlet), generator and all
        return super().get_run_time() if self.started else 0.0


def load_started(shape: Any) -> None:
    """A run's load can start: a shape of ours starts its clock (a locustfile's own shape keeps Locust's)."""
    if isinstance(shape, RunClockShape):
        shape.load_started()


class SweepShape(RunClockShape):
    """Ticks through the levels of --sweep; the plugin tags, collects and judges each step."""

    uses_options = frozenset({"sweep", "sweep_mode", "sweep_users", "step_duration", "stop_on_slo_miss", "confidence"})

    @classmethod
    def check_options(cls, options: Any) -> None:
        """Before the run (the shape's ticks run in a greenlet, where a bad level would be a traceback)."""
        if not SweepSpec.of(options):
            raise UsageError("locustfiles/sweep.py needs --sweep LEVELS, e.g. --sweep 8,16,32")
        if options.sweep_users < 1:
            raise UsageError(f"--sweep-users must be >= 1, got {options.sweep_users}")

    def __init__(self) -> None:
        super().__init__()
        self.count_ends: list[float] = []
        self.spec: SweepSpec | None = None

    def reset_time(self) -> None:
        """A run starts (Locust calls this before the shape's first tick, and before the run plan exists): its
        steps start over, from the options as they are now (the web UI may have changed them)."""
        from vllm_load.plugin.lifecycle.process import process_of

        super().reset_time()  # RunClockShape's: the clock held until the load starts
        self.count_ends: list[float] = []  # --num-requests: the run time each finished step ended at
        self.spec = SweepSpec.of(self.runner.environment.parsed_options)
        process_of(self.runner.environment).new_sweep()

    def step_ends(self, spec: SweepSpec, t: float) -> list[float]:
        """The run times at which the finished steps ended: every --step-duration, or (with --num-requests) when
        every load process finished its share of the step's N requests."""
        from vllm_load.plugin.lifecycle.process import process_of

        levels = spec.levels
        if not getattr(self.runner.environment.parsed_options, "num_requests", 0):
            # --stop-on-slo-miss holds each next step until the last one is judged (``tick``): its start is later
            duration, gap = spec.step_duration, (JUDGE_DELAY if spec.stop_on_miss else 0.0)
            out: list[float] = []
            while len(out) < len(levels) and t >= (end := len(out) * (duration + gap) + duration):
                out.append(end)
            return out
        ends = self.count_ends
        ctl = process_of(self.runner.environment)
        processes = ctl.run.plan.processes if ctl.run is not None else 1
        while len(ends) < len(levels) and ctl.steps.done.get(len(ends), 0) >= processes:
            ends.append(t)
        return ends

    def tick(self) -> tuple[int, float] | None:
        from vllm_load.plugin.lifecycle import end_of_run
        from vllm_load.plugin.lifecycle.process import process_of

        spec = self.spec or SweepSpec.of(self.runner.environment.parsed_options)
        if spec is None:
            raise UsageError("locustfiles/sweep.py needs --sweep LEVELS, e.g. --sweep 8,16,32")
        levels = list(spec.levels)
        t = self.get_run_time()
        ends = self.step_ends(spec, t)
        step = len(ends)
        if spec.stop_on_miss:
            # judge every finished step whose workers' reports are in (judge_step remembers verdicts)
            for done, end in enumerate(ends):
                if t >= end + JUDGE_DELAY and not end_of_run.judge_step(process_of(self.runner.environment), done):
                    return None
        if step >= len(levels):
            if spec.stop_on_miss and t - ends[-1] < JUDGE_DELAY:
                return (0, 100.0)  # let the last step's reports arrive before its verdict
            return None
        if spec.stop_on_miss and step and t < ends[-1] + JUDGE_DELAY:
            # the next step waits for the last one's verdict, its users still sending at its level: with steps
            # shorter than the reports' delay, "stopping the sweep" came after the next step had already run
            users = spec.users_at(levels[step - 1])
            return users, float(max(users, 1))
        level = levels[step]
        process_of(self.runner.environment).begin_step(step, level)
        users = spec.users_at(level)
        return users, float(max(users, 1))


class UsersRamp(RunClockShape):
    """The closed loop's --ramp-up-strategy: the users go from --ramp-up-start-users to --ramp-up-end-users over -t,
    linearly or exponentially, re-targeted every second (Locust ticks its shape each second); installed by the
    plugin, so any locustfile ramps without a shape of its own. Its clock is Locust's -t timer's (the ramp ends with
    the run), held at 0 until the load can start (a new user count meanwhile killed the run's start)."""

    restart_at_load = False

    def __init__(self, strategy: str, start: int, end: int, seconds: float) -> None:
        super().__init__()
        self.strategy, self.start, self.end, self.seconds = strategy, start, end, seconds

    def users_at(self, t: float) -> int:
        return ramp_users(self.strategy, self.start, self.end, t / self.seconds)

    def tick(self) -> tuple[int, float] | None:
        t = self.get_run_time()
        if t >= self.seconds:
            return None
        users = self.users_at(t)
        return users, float(max(users, 1))  # each step's new users start within a second
