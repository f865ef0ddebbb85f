"""What the web UI reads of a deciding process (a local runner, a master) each time it asks: the run's numbers while
it goes, its judged numbers once it stopped, its error, the live charts' series, and a swarm's host check.

Every Locust tab polls every 2 s, on the load's own event loop: an answer must cost the load nothing that grows with
the run. The summary so far is made at most once per ``FRESH_S`` and shared by every poll meanwhile (two tabs and a
poller made three per 2 s); made, it costs a few ms whatever the run's size (the histograms' statistics are numpy
passes over their counters, ``metrics/histogram.py``; before, 2.5-3.1 s a poll with the load's loop blocked)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from vllm_load.metrics.fleet.prometheus import registry_for
from vllm_load.plugin.prepare import startup
from vllm_load.plugin.webui import webui

if TYPE_CHECKING:
    from vllm_load.plugin.lifecycle.controller import Controller

#: how old the summary a poll gets may be (seconds): Locust's UI polls every 2 s
FRESH_S = 1.0


class LiveView:
    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl
        self._summary: tuple[float, Any, dict | None] = (0.0, None, None)  # made at, for which run, the summary

    def install(self, opts: Any) -> None:
        """The web UI's LLM tab (and its /metrics) and --metrics-port, fed from this view (UsageError: the port)."""
        ctl = self.ctl
        registry = registry_for(lambda: ctl.run.collector.totals if ctl.run and ctl.run.collector else None)
        webui.LLMTab(ctl.environment, self.summary, ctl.slos, lambda: ctl.end.report, self.status,
                     metrics_registry=lambda: registry, live_source=self.series,
                     target_source=lambda: ctl.target, swarm_check=self.swarm_check).install()
        if opts.metrics_port:
            startup.serve_metrics(registry, opts.metrics_host, int(opts.metrics_port),
                                  tuple(opts.web_allowed_host or ()))

    def status(self) -> str | None:
        """The run's fatal error, the target's failed check, or an outage going on now."""
        run = self.ctl.run
        outage = run.outage_now if run is not None else None
        return (run.fatal if run is not None else None) or self.ctl.target_error or (outage and f"OUTAGE: {outage}")

    def swarm_check(self, host: str) -> str | None:
        """Why the form's host cannot be swarmed (None: it can): the checked target passes, another is tried."""
        target = self.ctl.target
        if target is not None and target.host == host and not self.ctl.target_error:
            return None
        return startup.reachable(host)

    def series(self) -> dict:
        from vllm_load.plugin.webui.live_charts import live_series

        run = self.ctl.run
        col = run.collector if run is not None else None
        if col is None:
            return live_series(None, 0.0, None)
        live = run.live_server
        return live_series(col.totals, col.start_wall, live.samples if live is not None else None)

    def forget(self) -> None:
        """The numbers start over (the web UI's Reset): the next poll makes the summary anew."""
        self._summary = (0.0, None, None)

    def summary(self) -> dict | None:
        """The stopped run's judged summary, or the live one (made at most once per FRESH_S)."""
        final = self.ctl.end.final_summary
        if final is not None:
            return final
        run = self.ctl.run
        col = run.collector if run is not None else None
        if col is None:
            return None
        made, of, summary = self._summary
        now = time.monotonic()
        if of is not run or summary is None or now - made >= FRESH_S:
            summary = webui.live_summary(col.totals, col.measured_from, col.health, col.user_errors())
            summary["server"] = run.live_server.summary() if run.live_server is not None else None
            self._summary = (now, run, summary)
        return summary
