"""A sweep's steps (and --repeat's, a sweep of one level) as the deciding process walks them, and --repeat's set-up.

The shape announces each step (``SweepSteps.begin``); a step's measured window starts after its warm-up, the load
processes get its open-loop rate, the server's cache is reset before its first request, the profiler follows the step
it was asked for; with --num-requests a step ends once every load process finished its share (``finish``)."""

from __future__ import annotations

import time
from typing import Any, Callable

from vllm_load.errors import UsageError
from vllm_load.plugin.prepare.plan import ramp_kind


class SweepSteps:
    """The steps seen so far: the one the shape announced last (kept when it comes before the run's start, and
    applied then), and how many load processes finished each step's share."""

    def __init__(self) -> None:
        self.last: tuple[int, float] | None = None
        self.done: dict[int, int] = {}  # sweep step -> load processes that finished their share of it

    def new_sweep(self) -> None:
        """The sweep shape starts over (a run starts): no step finished yet."""
        self.done = {}

    def finish(self, step: int, processes: int, num_requests: int) -> None:
        """A load process finished its share of ``step``; said once every one of ``processes`` has."""
        self.done[step] = self.done.get(step, 0) + 1
        if self.done[step] == processes:
            print(f"vllm-load: sweep step {step}: {num_requests} requests completed (--num-requests)", flush=True)

    def begin(self, step: int, level: float, run: Any, opts: Any, cache_reset: Callable[[str], Any] | None,
              announce: Callable[[int, float, float], None]) -> None:
        """The shape's tick (before the run's first too, or while a local run's generator is still being made: kept,
        and applied once the run's load starts)."""
        self.last = (step, level)
        col = run.collector if run is not None else None
        # a local run's generator fills its prompt pools before it exists: a tick meanwhile (a busy host's) began
        # step 0 without it, and its 51 requests were labelled no step
        if col is None or col.sweep is None or (run.generator is None and not col.swarm):
            return
        # a step's measured window starts after its warm-up (its requests before that are not in its stats)
        if not col.sweep.begin(step, level, time.time(), col.plan.warmup):
            return
        rate = float(level) if col.sweep.kind == "rate" else 0.0
        floor = col.plan.floor_of(col.plan.users_at(level))
        if run.generator is not None:
            run.generator.set_step(step, rate, floor)
        unit = "req/s" if col.sweep.kind == "rate" else "users"
        repeats = int(getattr(opts, "repeat", 1) or 1)
        said = f"repeat {step + 1} of {repeats}" if repeats > 1 else f"sweep step {step}"
        print(f"vllm-load: {said}: {level:g} {unit}", flush=True)
        profiler = col.profiler
        if profiler is not None:  # the profiled step's trace ends where it does, before the next one's reset
            profiler.stop()
        if cache_reset is not None:  # before the step's first request (its workers are told next)
            cache_reset(f"sweep step {step}")
        if profiler is not None and not profiler.windows and profiler.at.kind == "step" and level == profiler.at.value:
            profiler.start(f"sweep step {step} ({level:g} {unit})")
        announce(step, rate, floor)


def install_repeat(environment: Any) -> None:
    """--repeat N: the run's load N times back to back, as a sweep of one level repeated N times (its steps, their
    spread and the report's repeats table are the sweep's: --sweep LEVELxN, on any locustfile)."""
    opts = environment.parsed_options
    n = int(getattr(opts, "repeat", 1))
    if n <= 1:  # below 1: validate's bounds refuse it, in one line
        return
    if getattr(opts, "sweep", "") or environment.shape_class is not None:
        raise UsageError("--repeat repeats a plain run; a sweep repeats a level with --sweep LEVELxN, and a "
                         "locustfile's own load shape ends when it says: drop --repeat")
    if ramp_kind(opts) or opts.trace:
        raise UsageError("--repeat repeats a steady load: drop --ramp-up-strategy or --trace (a trace replays once)")
    seconds = float(opts.run_time or 0)
    if not seconds and not getattr(opts, "num_requests", 0):
        raise UsageError(f"--repeat {n} needs each repeat's length: -t DURATION (or --num-requests N)")
    from vllm_load.plugin.lifecycle.shapes import SweepShape

    rate = float(opts.request_rate or 0)
    opts.sweep = f"{rate:g}x{n}" if rate > 0 else f"{int(opts.num_users)}x{n}"
    opts.sweep_mode, opts.sweep_users = ("rate" if rate > 0 else "users"), max(1, int(opts.num_users))
    opts.step_duration = seconds
    opts.run_time = None  # the shape ends the run after its last repeat (Locust's -t would cut it at the first)
    shape = SweepShape()
    shape.runner = environment.runner
    environment.shape_class = shape
