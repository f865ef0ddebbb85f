"""One run: what lives from a run's start (Locust's test_start) until the next one starts or the process quits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_load.errors import EXIT_BAD_INPUT, EXIT_ERRORS
from vllm_load.plugin.lifecycle.collector import Collector
from vllm_load.plugin.load.generator import Generator
from vllm_load.plugin.prepare.plan import RunPlan
from vllm_load.plugin.sources.server_side import LiveServer
from vllm_load.plugin.load.warmup_reset import WarmupGate


@dataclass
class Run:
    """A run's plan and its parts: what generates load (local runner, worker), what collects and judges it (local
    runner, master), and what watches it. Kept after the run stops: the web UI still shows its numbers and error."""

    plan: RunPlan
    generator: Generator | None = None
    collector: Collector | None = None
    warmup: WarmupGate | None = None  # the warm-up's end for Locust's table (--warmup)
    watchers: Any = None  # gevent.pool.Group: outages, silent workers, saturation (local runner, master)
    live_server: LiveServer | None = None  # the server's samples while the web UI shows the run
    fatal: str | None = None  # a failure every request would repeat: the run was stopped with it
    fatal_code: int = EXIT_BAD_INPUT  # and its exit code (2 bad input, 6 the run's files could not be written)
    outage_now: str | None = None  # an outage going on right now, as the console said it
    outage_stop: str | None = None  # --stop-on-outage ended the run with this reason
    shares_done: int = 0  # load processes that finished their share (trace rows, --num-requests)
    flushed: set = field(default_factory=set)  # workers that sent their final report (a master's drain)
    drained: set = field(default_factory=set)  # the --host replicas a fault plan's drain holds out now
    timed: bool = False  # its -t is armed, from its load's start (plugin/lifecycle/run_timer.py)
    beside: list = field(default_factory=list)  # greenlets a feature runs beside the load (feature_spec.before_load)

    def stop_with(self, message: str, code: int) -> None:
        """The run stops on a failure (``Controller.fatal``): its summary says so (a scenario's stamp reads it)."""
        self.fatal, self.fatal_code = message, code
        if self.collector is not None:
            self.collector.stopped, self.collector.stopped_code = message, code

    def stop_on_outage(self, message: str) -> None:
        """--stop-on-outage ends the run (exit code 1): its summary says so, as for any stop."""
        self.outage_stop = message
        if self.collector is not None and not self.collector.stopped:
            self.collector.stopped, self.collector.stopped_code = message, EXIT_ERRORS

    def close(self) -> None:
        """Stop what runs in the background (idempotent): the next run's parts start clean."""
        for part in (self.warmup, self.watchers, *self.beside):
            if part is not None:
                part.kill(block=False)
        if self.live_server is not None:
            self.live_server.stop()
        if self.generator is not None:
            self.generator.close()
