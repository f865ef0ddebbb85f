"""The run plan: what a run is, decided once on the master (or local runner) when the run starts
(``plugin/prepare/plan.decide``), shipped to every worker in Locust's spawn messages, and kept in ``config.json`` (``plan``),
from which a finished run reads it back (``Run.plan``). Locust's parsed options stay as the user gave them.

Before it existed, nine values travelled by being written into the parsed options (model, tokenizer,
SLOs, host, sidecar, run id, salt, run dir, user count) and workers re-derived the rest.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from vllm_load.metrics.histogram import PERCENTILES
from vllm_load.rundir.files import RunDir
from vllm_load.workload.arrivals import ramp_rate
from vllm_load.workload.rate_schedule import RateSchedule


@dataclass(frozen=True)
class RunPlan:
    run_id: str
    salt: str  # every prompt's digest words derive from it: a new salt, new content, no prefix-cache hit
    run_dir: str
    host: str
    model: str  # the served model, resolved against /v1/models
    tokenizer: str  # what counts the prompts' tokens
    is_emulator: bool
    slos: tuple[str, ...]  # the SLO texts, parsed (files read) on the master
    sidecar_url: str  # given, or the embedded emulator's sidecar
    total_users: int  # the open-loop rate is split over this many users
    backoff_max: float  # seconds: --retry-backoff-max, --outage-after, --stop-on-outage as the target check parsed them
    outage_after: float
    stop_on_outage: float
    models: tuple[str, ...] = ()  # every model requests rotate over (one: ``model``)
    model_weights: tuple[float, ...] = ()  # --model a:0.6,b:0.4: each model's share (none: equal turns)
    warmup: float = 0.0  # --warmup seconds: requests started this soon after the run's (or a step's) start are excluded
    trace_rows: int = 0  # --trace: its rows, and the span they are due over (seconds)
    trace_span: float = 0.0
    processes: int = 1  # load-generating processes (workers) at the start: a trace is split over them
    seed: int | None = None  # --seed: lengths, arrivals, dataset order and trace split repeat run after run
    max_model_len: int | None = None  # the served model's context (None: the server did not say)
    num_requests: int = 0  # --num-requests: the run ends once this many (warm-up aside) finished; 0: by time
    server_kind: str = "vllm"  # "openai": a server that is not vLLM gets standard OpenAI fields only
    percentiles: tuple[float, ...] = ()  # --metric-percentiles: the columns every medium shows (): the standard five
    #: --ramp-up-strategy: (strategy, start req/s, end req/s, seconds it ramps over; 0: over --num-requests)
    ramp: tuple = ()
    #: --sweep: "users" or "rate" (what a step's level is), and its levels; "" and (): no sweep
    sweep_kind: str = ""
    sweep_levels: tuple = ()
    #: --host's replicas when it names several (``host`` is then their list): users are spread over them
    hosts: tuple[str, ...] = ()
    #: the run has a steady window (one load level: no sweep, ramp, trace or shape; ``plugin/load/steady.py``)
    steady: bool = False
    #: the open loop's one rate (req/s) when it has one level (``steady``): what the delivered load is judged
    #: against (``metrics/shape/delivered.py``); 0: a closed loop, or a rate that changes
    constant_rate: float = 0.0
    #: --rate-schedule's points, wire form ([at, rate, between, burstiness] each; ``workload/rate_schedule.py``):
    #: the open loop's rate over the run's time; (): none
    rate_schedule: tuple = ()
    rate_schedule_ends: bool = False  # no -t: the run ends at the schedule's last row (its arrivals sent and back)
    #: --scenario: its name (workload/scenarios.py), and the options given other values than it fixes
    scenario: str = ""
    scenario_overrides: tuple[str, ...] = ()
    min_duration: float = 0.0  # --min-duration: each point's floor (s) before its whole passes of --num-requests

    def users_at(self, level: float) -> float:
        """A sweep step's users: its level in a sweep of concurrencies, else the run's users (a rate sweep's)."""
        return level if self.sweep_kind == "users" else self.total_users

    def floor_of(self, users: float) -> float:
        """A point's duration floor: --min-duration, else its scenario's by concurrency region, else none."""
        if self.min_duration > 0 or not self.scenario or not self.num_requests:
            return self.min_duration
        from vllm_load.workload.scenarios import scenario_of

        return scenario_of(self.scenario).floor(users)

    def ramp_rate(self, elapsed: float, sent: int, share: int) -> float:
        """--ramp-up-strategy's total rate ``elapsed`` seconds after the run's epoch (a ramp over -t), or after
        ``sent`` of ``share`` requests (a ramp over --num-requests: a process's share, or the whole count)."""
        strategy, start, end, seconds = self.ramp
        progress = elapsed / seconds if seconds else sent / max(1, share - 1)
        return ramp_rate(strategy, start, end, progress)

    @functools.cached_property
    def schedule(self) -> RateSchedule | None:
        """--rate-schedule's points as a schedule (None: none), made once per plan: every reader shares it."""
        return RateSchedule.of(self.rate_schedule) if self.rate_schedule else None

    @property
    def shown_percentiles(self) -> tuple[float, ...]:
        return self.percentiles or PERCENTILES

    @property
    def computed_percentiles(self) -> tuple[float, ...]:
        """What the summary computes from the exact histograms: the standard five (compare and the web UI read
        them), the shown ones, and each SLO's (ttft.p75<=1s needs p75)."""
        from vllm_load.metrics.judge.slo import parse_slo

        wanted = {p for text in self.slos for p in [parse_slo(text).stat] if p.startswith("p")}
        return tuple(sorted({*PERCENTILES, *self.percentiles, *(float(p[1:]) for p in wanted)}))

    @property
    def urls(self) -> tuple[str, ...]:
        """Every target's URL (one, or --host's replicas)."""
        return self.hosts or (self.host,)

    def target_of(self, user_number: int) -> str | None:
        """The replica the run's ``user_number``-th user sends to (round robin), or None with one target."""
        return self.hosts[user_number % len(self.hosts)] if len(self.hosts) > 1 else None

    def share(self, index: int) -> int:
        """Load process ``index``'s part of --num-requests (the first ones take one more when it does not divide)."""
        base, extra = divmod(self.num_requests, self.processes)
        return base + (index % self.processes < extra)

    @property
    def share_end(self) -> str:
        """What every load process finished when its share ended the run (a session replay said "the trace was
        replayed")."""
        if self.num_requests:
            return f"{self.num_requests} requests completed (--num-requests)"
        if self.rate_schedule_ends:
            return "the rate schedule reached its last row"
        return "the trace was replayed" if self.trace_rows else "every session was replayed"

    @property
    def draws(self) -> str:
        """What every random draw of the run is seeded from: --seed (repeatable runs), else the run's salt."""
        return f"seed {self.seed}" if self.seed is not None else self.salt

    @property
    def files(self) -> RunDir:
        """The run directory's files."""
        return RunDir(Path(self.run_dir))

    def to_wire(self) -> dict:
        """msgpack/JSON-safe: what the workers receive and config.json keeps."""
        data = asdict(self)
        data["slos"] = list(self.slos)
        data["models"] = list(self.models)
        data["model_weights"] = list(self.model_weights)
        data["hosts"] = list(self.hosts)
        data["rate_schedule"] = [list(p) for p in self.rate_schedule]
        data["scenario_overrides"] = list(self.scenario_overrides)
        return data

    @classmethod
    def from_wire(cls, data: dict) -> RunPlan:
        """A plan from its wire form (a spawn message, or config.json's ``plan`` of a run kept before fields were
        added: their defaults; of a newer one: fields this version does not know are left out)."""
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        return cls(**{**data, "slos": tuple(data.get("slos") or ()), "models": tuple(data.get("models") or ()),
                      "model_weights": tuple(data.get("model_weights") or ()),
                      "percentiles": tuple(data.get("percentiles") or ()), "ramp": tuple(data.get("ramp") or ()),
                      "sweep_levels": tuple(data.get("sweep_levels") or ()), "hosts": tuple(data.get("hosts") or ()),
                      "rate_schedule": tuple(tuple(p) for p in data.get("rate_schedule") or ()),
                      "scenario_overrides": tuple(data.get("scenario_overrides") or ())})
