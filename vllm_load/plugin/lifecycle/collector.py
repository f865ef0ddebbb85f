"""What collects, on a master or a local runner: the merged totals and per-step stats, the workers seen and
lost, the client-health verdict, the run's window, and the results written into the run directory.
A worker has none; in a local run the totals are the generator's own stats (the same objects)."""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import gevent.event

from vllm_load.feature_spec import RunEnd
from vllm_load.features import FEATURES
from vllm_load.metrics.judge.client_health import ClientHealth
from vllm_load.metrics.judge.client_monitor import ClientMonitor
from vllm_load.metrics.shape.delivered import by_segment, delivered, in_flight, in_flight_finding, schedule_finding
from vllm_load.metrics.stats import LLMStats
from vllm_load.metrics.summary import RunSummary
from vllm_load.metrics.fleet.router_counters import per_action
from vllm_load.runtime.embedded import emulator_mode
from vllm_load.plugin.prepare.plan import RunPlan
from vllm_load.plugin.watch.fault_plan import not_begun
from vllm_load.plugin.swarm.run_clock import MasterClock
from vllm_load.plugin.lifecycle.run_timer import run_seconds
from vllm_load.plugin.lifecycle.sweep import Sweep
from vllm_load.plugin.prepare.target import Target, public_options
from vllm_load.metrics.fleet.energy import energy_summary
from vllm_load.workload.scenarios import Point, overflows, stamp
from vllm_load.rundir.files import FORMAT_VERSION
from vllm_load.metric_table import E2E, TTFT
from vllm_load.workload.inputs.datasets import records_per_request


log = logging.getLogger("vllm_load")
WALL_MOVE_S = 0.05  # a wall clock set by more than this while a run went is said


def wall_lead() -> float:
    """The wall clock's lead over perf_counter now: it changes only when the wall clock is set."""
    return time.time() - time.perf_counter()


@dataclass
class Collector:
    opts: Any  # Locust's parsed options, read only
    plan: RunPlan
    totals: LLMStats = field(default_factory=LLMStats)  # master: merge of worker deltas; local: the generator's
    sweep: Sweep | None = None  # --sweep: its steps, their windows, merged stats and verdicts
    health: ClientHealth = field(default_factory=ClientHealth)
    faults: list = field(default_factory=list)  # the fault plan's actions that began (``fault_plan.run_plan``)
    fault_actions: list = field(default_factory=list)  # every action the plan holds (those that never began too)
    stopped: str = ""  # why the run was stopped on a failure (``Run.stop_with``), '' when it was not
    stopped_code: int = 0  # and the exit code it was stopped with
    signal: tuple[str, float] | None = None  # the first stopping signal the process took (name, wall clock)
    router_end: dict | str | None = None  # --router-metrics: the router's counters at the run's end (or why not)
    workers_seen: set = field(default_factory=set)
    workers_lost: list = field(default_factory=list)  # workers that never sent their final report
    last_report: dict = field(default_factory=dict)  # worker -> wall time of its latest report (when it was lost)
    #: worker -> seconds into the run when Locust first marked it missing (no heartbeat for ~3 s: a blocked loop
    #: or a starved host; with every worker missing Locust stops the test)
    workers_missing: dict = field(default_factory=dict)
    swarm: bool = False  # a master's (its load processes are workers, each READY before the epoch)
    dcgm: Any = None  # plugin/sources/dcgm_source.DcgmPoller (--dcgm-url): GPU telemetry through the run
    profiler: Any = None  # plugin/sources/server_control.Profiler (--profile-at): the server's profiler windows
    saturation: Any = None  # metrics/fleet/saturation.Finding: when the server stopped keeping up (None: it kept up)
    start_wall: float = field(default_factory=time.time)
    end_wall: float | None = None
    #: the wall clock's lead over perf_counter at start_wall and at end_wall: a VM's clock set while the run goes
    #: (CI's was stepped 21 s forward once) is taken out of the run's duration, as the stamps take it out of each
    #: request's timings (client/rxstamp.py)
    start_lead: float = field(default_factory=wall_lead)
    end_lead: float | None = None
    drained: bool = False  # the end-of-run drain has begun
    #: set when that drain is over: a second stop during it (the -t limit reached while an earlier stop's drain
    #: still waits) waits for it too, not cancelling the requests the first stop let finish
    drain_over: gevent.event.Event = field(default_factory=gevent.event.Event)
    results: RunSummary | None = None  # what write_results wrote (the run's end writes them once)
    target: Target | None = None  # the checked target the run was planned against (config.json says it)
    config_written: bool = False
    clock: MasterClock = field(default_factory=MasterClock)  # the run's epoch, and the workers' offsets to it
    #: Locust's exception rows so far, (count, message, traceback) each: a task raising in a loop is the cause
    user_errors: Callable[[], list] = list

    @classmethod
    def create(cls, opts: Any, plan: RunPlan, master_runner: Any = None, target: Target | None = None) -> Collector:
        plan.files.path.mkdir(parents=True, exist_ok=True)
        col = cls(opts=opts, plan=plan, sweep=Sweep(plan.sweep_kind) if plan.sweep_kind else None, target=target)
        col.clock.reset(plan.processes, master_runner)  # the epoch is fixed once this many workers are ready
        return col

    def write_config(self) -> None:
        """config.json: what the run was (its plan, target and options), once its load has started (``started``)."""
        target = self.target
        info = {
            "format": FORMAT_VERSION,
            "run_id": self.plan.run_id,
            "salt": self.plan.salt,
            "host": self.plan.host,
            "target_is_emulator": self.plan.is_emulator,
            # how the embedded emulator served (continuous batching and its profile, or a fixed schedule)
            "emulator_mode": emulator_mode(self.opts) if self.plan.is_emulator else None,
            "model": self.plan.model,
            "tokenizer": self.plan.tokenizer,
            "max_model_len": target.max_model_len if target else None,
            "target_kind": target.kind if target else ("EMULATOR" if self.plan.is_emulator else ""),
            "server_version": target.server_version if target else "",
            "started": self.start_wall,
            "client_host": socket.gethostname(),
            "plan": self.plan.to_wire(),
            "options": public_options(self.opts),
        }
        self.plan.files.write(self.plan.files.config, info, indent=2)
        self.config_written = True

    @property
    def measured_from(self) -> float:
        """When the measured part of the run began: after its warm-up (the requests before it are in no number),
        and not before its first measured request. The processes of a swarm fill their prompt pools before they
        send; counted from Locust's spawn, a quiet `--processes 2` run of 6 s had its first request 1.2 s in and
        its rate 18 % low (4.5 s of a 6 s run on a busy host)."""
        first = self.totals.first_start
        return max(self.start_wall + self.plan.warmup, first if first is not None else 0.0)

    def mark_end(self) -> None:
        """The run ended now (once): its end on the wall clock, and how far that clock was set since the start."""
        if self.end_wall is not None:
            return
        self.end_wall, self.end_lead = time.time(), wall_lead()
        moved = self.wall_moved(self.end_wall)
        if abs(moved) >= WALL_MOVE_S:
            log.warning("the host's wall clock was set by %+.3f s while the run went: the timings and the run's "
                        "duration are on the monotonic clock and leave it out", moved)

    def wall_moved(self, end: float) -> float:
        """How far the wall clock was set between the run's start and ``end`` (its end, else now)."""
        lead = self.end_lead if self.end_lead is not None and end == self.end_wall else wall_lead()
        return lead - self.start_lead

    def write_results(self, monitor: ClientMonitor | None = None) -> RunSummary:
        """Exact summary plus the raw histograms, so a report can be rebuilt from the run dir alone."""
        end = self.end_wall or time.time()
        if not self.config_written:  # a stop that came while the run was starting (-t shorter than a busy host's
            self.write_config()  # start-up): the run directory is complete all the same (its report once failed)
        if self.dcgm is not None:  # its last read, past the run's end, closes the window
            self.dcgm.stop()
            self.plan.files.write_series(self.plan.files.dcgm, self.dcgm.samples)
        summary = self.summarise(monitor, end)
        data = {"run_id": self.plan.run_id, "start": self.start_wall, "end": end, "summary": summary,
                "stats": self.totals.to_wire()}
        self.plan.files.write(self.plan.files.stats, data)
        return summary

    def _take_local(self, monitor: ClientMonitor) -> None:
        """A local run's last report: what the monitor saw since its last 3 s one. A run shorter than the monitor's
        first second still says which readers timed its chunks (a 0.9 s TLS run dropped its only report, and with
        it the console's "timed by the clock" line)."""
        last = monitor.take()
        if last["cpu"] or last["lag"] or last["streams"] or not self.health.reports.get("local"):
            self.health.add("local", last)

    def summarise(self, monitor: ClientMonitor | None = None, end: float | None = None) -> RunSummary:
        """The run's summary (``results``) up to ``end`` (default: the run's end, else now), judged from the merged
        totals, without touching the disk."""
        end = end or self.end_wall or time.time()
        summary = self.totals.summary(duration=max(1e-9, end - self.measured_from - self.wall_moved(end)),
                                      records_per_request=records_per_request(
            self.opts.dataset, self.opts.dataset_batch), outage_after=self.plan.outage_after, now=end,
            percentiles=self.plan.computed_percentiles, shown=self.plan.shown_percentiles)
        done = self._workers()  # what the collector knows beyond the totals, added to the summary once at the end
        done["saturation"] = self.saturation.to_json() if self.saturation is not None else None
        if self.dcgm is not None:
            done["energy"] = energy_summary(self.dcgm.samples, self.measured_from, end, summary.output_tokens,
                                            summary.succeeded)
            if done["energy"] is None:
                done["energy_missing"] = self.dcgm.error or "no GPU telemetry in the run's window"
        if monitor is not None:
            self._take_local(monitor)
        # CPU and lag while the server was unreachable or failing every request are the failures' doing
        quiet = [(w.start, w.end) for w in summary.outages]
        done["client"] = self.health.judge(summary, self.user_errors(), quiet,
                                           cap=self.plan.total_users * int(self.opts.max_concurrency))
        done["target_request_rate"] = float(self.opts.request_rate or 0.0)
        done["delivered"] = self._delivered()
        if self.faults or self.fault_actions:  # the fault plan's actions as they ran (start and end, wall clock)
            done["faults"] = per_action(self.faults, self.router_end) + not_begun(  # the router's doing, when read
                self.fault_actions, self.faults, end - (self.clock.epoch or self.start_wall))
        if self.swarm:  # how many of its load processes got ready (the epoch waits for all)
            done["processes"], done["processes_ready"] = self.clock.expected, len(self.clock.ready)
        if self.clock.ready:  # each worker's offset to the master's clock, and its uncertainty
            done["clock"] = self.clock.summary()
        done.update(self._kept(summary))
        done.update(self._profiled())
        done["features"] = self._features(summary, end, done.get("faults") or [])
        summary = summary.replace(**done)
        self.results = summary  # the verdict is given from it even when the disk refuses the file
        return summary

    def _features(self, summary: RunSummary, end: float, faults: list[dict]) -> dict | None:
        """Each feature's part of the summary (``vllm_load/features/``), from what the run knows at its end."""
        facts = RunEnd(self.opts, self.clock.epoch or self.start_wall, end, int(summary.requests or 0),
                       run_seconds(self.opts), 0 if self.plan.sweep_kind else int(self.plan.num_requests or 0),
                       self.signal, self.stopped, self.stopped_code, tuple(faults), summary, str(self.plan.files.path))
        parts = {f.name: part for f in FEATURES if (part := f.summarise(facts)) is not None}
        return parts or None

    def _kept(self, summary: RunSummary) -> dict:
        """What the run kept of what it was asked: a trace's schedule, a scenario's rules."""
        done: dict = {}
        if self.plan.trace_rows:  # the schedule kept: the trace's span as intended, and as the requests were sent
            first, last = self.totals.first_start, self.totals.last_start
            done["trace"] = {"rows": self.plan.trace_rows,
                             "sent": summary.requests + (summary.warmup_excluded or 0),
                             "intended_s": self.plan.trace_span,
                             "sent_span_s": (last - first) if first is not None and last is not None else 0.0}
        if self.plan.scenario:  # --scenario: whether the run kept its rules
            done["scenario"] = stamp(self.plan.scenario, self.plan.scenario_overrides, summary.requests,
                                     summary.failed, self.stopped, self._points(summary),
                                     float(summary.duration_s or 0.0), str(getattr(self.opts, "sessions", "") or ""),
                                     overflows(summary.errors))
        return done

    def _points(self, summary: RunSummary) -> list[Point]:
        """The run's measured points (each sweep step's window, or the run's): what a floored scenario judges."""
        plan, now = self.plan, time.time()
        if self.sweep is None:
            users = plan.total_users
            return [Point(users, float(summary.duration_s or 0.0), int(summary.requests or 0), plan.num_requests,
                          plan.floor_of(users))]
        out = []
        for _, s in sorted(self.sweep.steps.items()):
            users = plan.users_at(s.level)
            out.append(Point(users, (s.end or now) - s.start, s.stats.requests, plan.num_requests, plan.floor_of(users)))
        return out

    def _delivered(self) -> dict | None:
        """The load delivered against the asked (``metrics/shape/delivered.py``): an open loop's sends at its one rate or
        per segment of its rate schedule, a closed loop's requests in flight in its steady window against its users;
        None where neither applies."""
        if self.plan.rate_schedule:
            return self._schedule()
        if self.plan.constant_rate > 0:
            found = delivered(self.totals.sends.times, self.plan.constant_rate, float(self.opts.burstiness))
            return found.to_json() if found is not None else None
        steady = self.totals.phases.get("steady")
        replay = self.plan.trace_rows or getattr(self.opts, "sessions", "")  # its waits are the recording's
        if steady is None or not steady.requests or steady.first_start is None or replay or \
                steady.failures > 0.1 * steady.requests:  # failing at once is no load to judge
            return None
        window, mean_e2e = steady.last_end - steady.first_start, steady.hists[E2E].mean
        if window < 10 * mean_e2e:  # requests across its edges, left out, would weigh more than a tenth
            return None
        return in_flight_finding(in_flight(steady.requests, mean_e2e, window), self.plan.total_users)

    def _schedule(self) -> dict:
        """--rate-schedule: each segment's delivered rate up to the run's end, and its requests' latencies."""
        schedule = self.plan.schedule
        assert schedule is not None
        until = (self.end_wall or time.time()) - (self.clock.epoch or self.start_wall)  # on the epoch's clock
        if self.plan.rate_schedule_ends:  # the run ended at the last row: the drain after it asked for nothing
            until = min(until, schedule.end)
        segments = by_segment(self.totals.sends.times, schedule, until, float(self.opts.burstiness))
        for seg in segments:
            part = self.totals.phases.get(f"segment {seg['segment']}")
            if part is not None and part.requests > part.failures:
                h = part.hists
                seg.update(requests=part.requests, failed=part.failures, ttft_p50=h[TTFT].percentile(50),
                           ttft_p99=h[TTFT].percentile(99), e2e_p99=h[E2E].percentile(99))
        return schedule_finding(segments)

    def _profiled(self) -> dict:
        """--profile-at: where in the run the server's profile is (seconds from the measured window's start)."""
        if self.profiler is None or not self.profiler.windows:
            return {}
        return {"profiled": [{"what": w["what"], "targets": w["targets"],
                              "from_s": round(w["start"] - self.measured_from, 3),
                              "to_s": round(w["stop"] - self.measured_from, 3)} for w in self.profiler.windows]}

    def _workers(self) -> dict:
        """The workers that reported, those lost (and how far into the run each last reported: its requests after
        that are in its log only; None: it never reported) and those Locust marked missing."""
        return {"workers": sorted(self.workers_seen), "workers_lost": list(self.workers_lost),
                "workers_lost_at": {w: round(self.last_report[w] - self.start_wall, 1) if w in self.last_report
                                    else None for w in self.workers_lost},
                "workers_missing": dict(self.workers_missing)}

    def note_missing(self, runner: Any) -> None:
        """Record the workers Locust's heartbeat check marks missing (it says so only in its log)."""
        for client in runner.clients.all:
            if client.state == "missing" and client.id not in self.workers_missing:
                self.workers_missing[client.id] = round(time.time() - self.start_wall, 1)

    def drain_once(self, drain: Any) -> None:
        """The end-of-run drain, run once: a stop that comes during it (the -t limit reached while
        --stop-over-saturated's stop drains a queued server) waits for it, so Locust stops no user before its
        request has finished; 4 requests of a saturated run were once cancelled and failed that way."""
        if self.drained:
            self.drain_over.wait()
            return
        self.drained = True
        try:
            drain()
        finally:
            self.drain_over.set()

    def reset_metrics(self) -> None:
        """Locust's --reset-stats / the web UI's Reset: the merged metrics start over with Locust's table."""
        self.totals.__init__()  # type: ignore[misc]
        if self.sweep is not None:
            self.sweep.reset()
        self.health = ClientHealth()
        self.saturation = None
        self.workers_seen = set()
        self.start_wall, self.start_lead = time.time(), wall_lead()
