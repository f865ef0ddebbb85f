"""-t counted from the load's start, not from Locust's.

Locust arms a headless run's --run-time timer as it starts the runner, before the run's start-up: a local runner's
generator fills its prompt pools in the test start, a swarm's workers load their tokenizers and fill theirs and the
master fixes the run's epoch once every one is ready. On a slow or busy host that start-up took seconds of -t: a
3 s tune probe lost its whole run, a 4 s two-process run at 20 req/s sent for 1.2 s. The plugin takes the timer
over in a headless run without a load shape (``take_over``: Locust and the in-process harness then arm none) and
arms it where the load starts (``arm``: a local run's generator ready, a swarm's epoch), so a run lasts what -t says.
A shape keeps its own clock (``shapes.RunClockShape``); the web UI's runs keep Locust's timer."""

from __future__ import annotations

import logging
import time
from typing import Any

import gevent
from locust.runners import STATE_STOPPED, STATE_STOPPING

#: the parsed options' attribute holding -t once the plugin took it over (Locust's own is then None)
RUN_TIME_ATTR = "vllm_load_run_time"
log = logging.getLogger("vllm_load")


def take_over(opts: Any, environment: Any) -> None:
    """At start-up, after the checks: a headless run's -t (not a worker's, not a shape's) is the plugin's to arm."""
    if opts.headless and not getattr(opts, "worker", False) and environment.shape_class is None and opts.run_time:
        setattr(opts, RUN_TIME_ATTR, opts.run_time)
        opts.run_time = None
        _quiet_locusts_no_limit_line()


class _NoLimitLine(logging.Filter):
    """Locust, finding no -t of its own (the plugin holds it), says "No run time limit set, use CTRL+C to interrupt"
    on every headless run with -t: a line that is false for that run."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("No run time limit set")


def _quiet_locusts_no_limit_line() -> None:
    logger = logging.getLogger("locust.main")
    if not any(isinstance(f, _NoLimitLine) for f in logger.filters):
        logger.addFilter(_NoLimitLine())


def run_seconds(opts: Any) -> float:
    """The run's -t in seconds (0: none), whoever arms it: what every reader of -t reads after the start-up."""
    return float(opts.run_time or getattr(opts, RUN_TIME_ATTR, None) or 0)


def arm(environment: Any, started_wall: float) -> bool:
    """Quit the run -t after ``started_wall`` (the load's start, on the wall clock); False when -t is Locust's."""
    seconds = getattr(environment.parsed_options, RUN_TIME_ATTR, None)
    if not seconds:
        return False
    gevent.spawn_later(max(0.0, started_wall + float(seconds) - time.time()), _quit, environment, float(seconds))
    return True


def _quit(environment: Any, seconds: float) -> None:
    runner = environment.runner
    if runner is None or runner.state in (STATE_STOPPING, STATE_STOPPED):  # ended already (--num-requests, a stop)
        return
    # Locust's own words first: what a reader (or a test) of Locust's log looks for
    log.info("--run-time limit reached (%gs, counted from the load's start), shutting down", seconds)
    runner.quit()
