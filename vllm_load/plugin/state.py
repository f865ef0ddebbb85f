"""Process-wide plugin state: one Locust environment per process, so one of these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gevent.event import Event
from locust.runners import MasterRunner, WorkerRunner

from vllm_load.plugin.embedded import ChildServer
from vllm_load.plugin.plan import RunPlan
from vllm_load.plugin.collector import Collector
from vllm_load.plugin.generator import Generator
from vllm_load.plugin.server_side import LiveServer
from vllm_load.plugin.target import Target


@dataclass
class _State:
    """Process-wide plugin state (one Locust environment per process): an instance of its own per process, no
    value shared through class defaults."""

    target: Target | None = None
    slos: list = field(default_factory=list)
    report: str | None = None  # path of the last run's report.html
    end_block: str = ""  # the end-of-run block, printed when Locust quits (after its own last tables)
    end_block_hooked: bool = False
    warmup_reset: Any = None  # the greenlet that starts Locust's table over when --warmup ends
    flushed: set = field(default_factory=set)  # workers that sent their final report
    last_step: tuple | None = None  # the sweep step the shape announced last
    emulator: ChildServer | None = None
    emulator_log: Any = None  # the embedded emulator's log file (copied into each run directory)
    sidecar: ChildServer | None = None
    generator: Generator | None = None  # local runner and workers: what generates load
    collector: Collector | None = None  # local runner and master: what collects and judges
    fatal: str | None = None  # a failure every request would repeat: the run was stopped with it
    fatal_code: int = 2  # and the exit code it gives (2 bad input, 6 the run's files could not be written)
    target_error: str | None = None  # the web UI's target failed its check: shown there until fixed
    outage_now: str | None = None  # an outage going on right now, as the console said it
    outage_stop: str | None = None  # --stop-on-outage ended the run with this reason
    trace_done: int = 0  # load processes that replayed their share of the trace (master / local)
    worker_step: tuple | None = None  # a worker: the sweep step (and rate) the master announced last
    steps_done: dict = field(default_factory=dict)  # sweep step -> load processes that finished their --num-requests share in it
    watcher: Any = None  # greenlets watching for outages and silent workers (master / local)
    live_server: LiveServer | None = None  # the sidecar's samples while the web UI shows a run
    environment: Any = None  # this process's Locust environment (some events do not pass it)
    plan: RunPlan | None = None  # the run's plan: decided here (master/local) or received (worker)
    sidecar_url: str = ""  # --sidecar-url, or the embedded emulator's sidecar
    ending: Any = None  # set while the end of the run is written (an Event, set when it is done)
    end_signals: int = 0  # quitting events that came while it was written
    final_summary: Any = None  # the stopped run's judged summary (dict): what the web UI shows until the next start
    span_receiver: Any = None  # --otlp-receiver (span_receiver.SpanReceiver), master or local
    cache_reset: Any = None  # --reset-prefix-cache (server_control.CacheReset), master or local
    own_headers: Any = None  # a worker's own credential --header values (worker_secrets.OwnHeaders)
    #: set once the plugin's init listener has run (its message handlers registered): a worker joining a running
    #: swarm gets its spawn message, and so test_start, while Locust still builds its runner, before init
    initialised: Event = field(default_factory=Event)


STATE = _State()


def role(environment: Any) -> str:
    runner = environment.runner
    if runner is None:  # Locust still builds it (a worker's first spawn can come that early): the options say
        opts = environment.parsed_options
        return "worker" if getattr(opts, "worker", False) else "master" if getattr(opts, "master", False) else "local"
    if isinstance(runner, WorkerRunner):
        return "worker"
    if isinstance(runner, MasterRunner):
        return "master"
    return "local"
