"""The run summary's shape: what ``LLMStats.summary`` computes and the collector completes, as written to
llm_stats.json and summary.json and read by the verdict, the console, the web UI and the report."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Final

from vllm_load.metric_table import ITL, ITL_TOKEN
from vllm_load.metrics.summary_parts import (ClientVerdict, Energy, MetricSummary, OutageWindow, ProfiledWindow,
                                             Saturation, SUMMARY_PARTS, Timing, TraceKept, WorkerOffset,
                                             wrap_parts)


class _Absent:
    """A field not given where a summary was built: its group did not happen, or an older run wrote the file."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Final[Any] = _Absent()
#: summary.json's summary format: 2 since the summary is a RunSummary written with its format (1: the dicts before)
FORMAT: Final = 2


def metric_stats(summary: Mapping[str, Any], key: str) -> MetricSummary:
    """A summary's statistics of one metric (count 0 when it has none), from a ``RunSummary`` or its JSON alike."""
    m = (summary.get("metrics") or {}).get(key)
    return m if isinstance(m, MetricSummary) else MetricSummary(m or {})


@dataclass(frozen=True, eq=False)
class RunSummary(Mapping[str, Any]):
    """One run's (or one group's, or one sweep step's) summary: built once by ``summarise`` and completed once
    by the collector (``replace``), never changed in place. Any field may be absent (its group did not happen,
    or an older run wrote the file): read by attribute, an absent field is None; as a mapping, the summary has
    the fields it has (and the JSON it writes has no key for the others). ``to_json``/``from_json`` are its only
    file form, with ``FORMAT``; ``of`` takes either."""

    # counts and rates, from LLMStats.summary
    requests: int = ABSENT
    succeeded: int = ABSENT
    failed: int = ABSENT
    error_rate: float = ABSENT  # fraction of requests that failed
    duration_s: float = ABSENT
    request_rate: float = ABSENT  # successful requests per second
    send_rate: float = ABSENT  # arrivals per second between the first and last (intended) start
    input_tokens: int = ABSENT
    output_tokens: int = ABSENT
    output_token_rate: float = ABSENT
    total_token_rate: float = ABSENT  # input and output tokens per second (vLLM's total token throughput)
    usage_missing: int = ABSENT  # successful requests without server usage (tokens counted locally)
    input_drift_requests: int = ABSENT  # requests whose prompt length differed from what was asked
    input_drift_max_abs: int = ABSENT
    input_drift_fraction: float = ABSENT  # of the requests with server usage
    output_mismatch: int = ABSENT
    reasoning_tokens: int = ABSENT  # output tokens a reasoning model spent thinking (in output_tokens too)
    reasoning_requests: int = ABSENT  # successful requests whose stream carried reasoning
    reasoning_by_tokenizer: int = ABSENT  # of those, counted with the run's tokenizer (the server's stream gave no count)
    goodput: float | None = ABSENT  # requests/s meeting every per-request SLO, as vllm bench serve (None without one)
    good_request_fraction: float | None = ABSENT  # their share of the requests judged
    good_requests: int = ABSENT
    errors: dict[str, int] = ABSENT  # reason -> count, most common first
    metrics: dict[str, MetricSummary] = ABSENT  # metric_table key -> its statistics
    outages: list[OutageWindow] = ABSENT
    outage_seconds: float = ABSENT
    media_items: int = ABSENT  # images and audio clips sent, their prompt tokens (server's count minus the exact text
    media_tokens: int = ABSENT  # count) and the text's own
    text_input_tokens: int = ABSENT
    #: --accuracy: graded answers, the share right, and its 95 % Wilson interval (per name: each set's own)
    graded: int = ABSENT
    accuracy: float = ABSENT
    accuracy_ci: list[float] = ABSENT
    #: --response-format: answers checked, the share whose JSON was valid, and its 95 % Wilson interval
    validated: int = ABSENT
    valid_output: float = ABSENT
    valid_output_ci: list[float] = ABSENT
    inputs: int = ABSENT  # pooling requests (embeddings, rerank): the inputs they carried, inputs/s and input tokens/s
    input_rate: float = ABSENT
    input_token_rate: float = ABSENT
    records_per_request: int = ABSENT  # only with a dataset
    records: int = ABSENT
    record_rate: float = ABSENT
    cached_tokens: int | None = ABSENT  # prompt tokens the server's usage reported as prefix-cache hits
    cached_fraction: float | None = ABSENT  # their share of those requests' prompt tokens
    warmup_excluded: int = ABSENT  # requests started during --warmup, left out of every number here
    removed_excluded: int = ABSENT  # requests cut when the load shape removed their user mid-run, likewise
    abandoned_excluded: int = ABSENT  # --cancel: requests the client gave up on mid-answer, likewise
    timing: Timing | None = ABSENT  # metrics/shape/breakdown.py: where each request's time went (the server's parts)
    one_token_chunks: int = ABSENT  # streams whose chunks were each taken for one token (no continuous usage)
    backoffs: int = ABSENT  # closed loop: waits before a next request after a server error (and their total, seconds)
    backoff_s: float = ABSENT
    percentiles: list[str] = ABSENT  # the percentile columns every medium shows (--metric-percentiles; the standard five)
    names: dict[str, dict] = ABSENT  # name= -> the same summary for that group's requests (only when names were used)
    targets: dict[str, dict] = ABSENT  # --host a,b: each replica's URL -> the same summary for its requests
    #: the same summary for the requests that ran in the steady window (every user sending: ramp and drain left out)
    steady: dict = ABSENT
    window_s: list[float] = ABSENT  # a phase's summary (``steady``): its first start and last end, seconds into the run
    # completed by the collector at the end of a run
    workers: list[str] = ABSENT
    workers_lost: list[str] = ABSENT
    shared_stamps: int = ABSENT  # chunk gaps of 0: two chunks of a stream under one receive stamp
    late_merged_gaps: int = ABSENT  # of those, made by the native reader's late reads (the rest landed together)
    workers_lost_at: dict[str, float | None] = ABSENT  # a lost worker -> seconds into the run of its last report (None: none)
    energy: Energy | None = ABSENT  # metrics/fleet/energy.energy_summary over the run's window (--dcgm-url)
    energy_missing: str = ABSENT  # why a run with --dcgm-url has no energy block
    saturation: Saturation | None = ABSENT  # metrics/fleet/saturation.Finding.to_json(): when the server stopped keeping up
    processes: int = ABSENT  # a swarm: its load processes at the start, and how many got ready (sent READY to the master)
    processes_ready: int = ABSENT
    workers_missing: dict[str, float] = ABSENT  # a worker Locust marked missing (no heartbeat ~3 s) -> seconds into the run
    client: ClientVerdict = ABSENT  # ClientHealth.verdict()
    target_request_rate: float = ABSENT
    #: the load delivered against the asked (``metrics/shape/delivered.py``): an open loop's rate and inter-arrival CV, a
    #: closed loop's requests in flight; each with ``as_asked`` and its one-line ``detail``
    delivered: dict = ABSENT
    #: the fault plan's actions (start and end on the wall clock, outcome) and what each did to the requests
    faults: list[dict] = ABSENT
    disruption: dict = ABSENT
    scenario: dict = ABSENT  # --scenario: whether the run kept its rules (workload/scenarios.stamp)
    trace: TraceKept = ABSENT  # --trace: rows, sent, intended and achieved span (seconds)
    profiled: list[ProfiledWindow] = ABSENT  # --profile-at: each profiler window (seconds into the run)
    #: each feature's part (``vllm_load/features/``), under its name: the summary's fields name no feature
    features: dict[str, dict] = ABSENT
    # the rest of the run's summary
    error_examples: dict[str, str] = ABSENT  # an error kind -> the first full text seen of it
    clock: dict[str, WorkerOffset] = ABSENT  # a swarm: each worker's offset to the master's clock
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys of a newer format, kept as read
    _has: frozenset[str] = field(default=frozenset(), init=False, repr=False)  # the fields given

    def __post_init__(self) -> None:
        has = frozenset(k for k in _FIELDS if getattr(self, k) is not ABSENT)
        for k in _FIELDS:
            if k not in has:
                object.__setattr__(self, k, None)
        for k, v in wrap_parts({k: getattr(self, k) for k in SUMMARY_PARTS if k in has}).items():
            object.__setattr__(self, k, v)  # each nested part read by attribute, however the summary was made
        object.__setattr__(self, "_has", has)

    @classmethod
    def of(cls, summary: Mapping[str, Any]) -> RunSummary:
        """``summary`` itself, or the summary its JSON (a dict) holds: for readers handed either."""
        return summary if isinstance(summary, RunSummary) else cls.from_json(summary)

    def __getitem__(self, key: str) -> Any:
        if key in self._has:
            return getattr(self, key)
        if key not in _KNOWN and key in self.extra:
            return self.extra[key]
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        yield from (k for k in _FIELDS if k in self._has)
        yield from self.extra

    def __len__(self) -> int:
        return len(self._has) + len(self.extra)

    def replace(self, **changes: Any) -> RunSummary:
        """A copy with ``changes`` (the collector's completion, the verdict's view of the client)."""
        return RunSummary(**{**{k: getattr(self, k) for k in self._has}, **changes}, extra=self.extra)

    def to_json(self) -> dict[str, Any]:
        """The summary as summary.json and llm_stats.json keep it (groups nested as plain objects)."""
        return {"format": FORMAT, **{k: _plain(v) for k, v in self.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunSummary:
        """A summary read back (any format up to ``FORMAT``: older ones upgraded; keys this version does not
        know are kept in ``extra``). A newer format is read as far as its fields are known."""
        if isinstance(data, RunSummary):
            return data
        data = upgrade_summary({k: v for k, v in data.items() if k != "format"})
        known = {k: v for k, v in data.items() if k in _KNOWN}
        for group in ("names", "targets"):
            if isinstance(known.get(group), dict):
                known[group] = {n: cls.from_json(g) for n, g in known[group].items()}
        if isinstance(known.get("steady"), dict):
            known["steady"] = cls.from_json(known["steady"])
        return cls(**known, extra={k: v for k, v in data.items() if k not in _KNOWN})


def _plain(value: Any) -> Any:
    if isinstance(value, RunSummary):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def json_default(value: Any) -> Any:
    """``json.dumps(..., default=json_default)``: a summary anywhere inside what is written becomes its JSON."""
    if isinstance(value, RunSummary):
        return value.to_json()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


#: in order: the file's key order
_FIELDS = tuple(f.name for f in fields(RunSummary) if f.name not in ("extra", "_has"))
_KNOWN = frozenset(_FIELDS)


#: the wire's metric names: 2 since itl means the per-chunk gap (vLLM's) and itl_token the per-token one
NAMES_VERSION = 2
#: metric keys before that: the old name -> today's
_OLD_NAMES = {ITL: ITL_TOKEN, "itl_chunk": ITL}


def upgrade_wire(data: dict) -> dict:
    """Run dirs written before vLLM's names (itl per token, itl_chunk per chunk) read with today's names."""
    if data.get("names_version", 1) >= NAMES_VERSION:
        return data
    data = dict(data)
    data["hists"] = {_OLD_NAMES.get(k, k): v for k, v in data.get("hists", {}).items()}
    data["windows"] = {w: {_OLD_NAMES.get(m, m): h for m, h in ms.items()} for w, ms in data.get("windows", {}).items()}
    return data


def upgrade_summary(summary: dict) -> dict:
    """The same for a saved summary: metric keys, goodput (then a share) as good_request_fraction, and a part kept
    before its feature had a module (``protection``, ``prefill_curve``, ``routing``) under the features, where its module reads
    it."""
    for moved in ("protection", "prefill_curve", "routing"):  # parts kept before their features had modules
        if moved in summary:
            summary = dict(summary)
            summary["features"] = {**(summary.get("features") or {}), moved: summary.pop(moved)}
    if "good_request_fraction" in summary or "metrics" not in summary:
        return summary
    out = dict(summary)
    out["metrics"] = {_OLD_NAMES.get(k, k): v for k, v in summary["metrics"].items()}
    out["good_request_fraction"] = summary.get("goodput")
    duration = summary.get("duration_s") or 0.0
    out["goodput"] = summary.get("good_requests", 0) / duration if summary.get("goodput") is not None and duration else None
    return out


def name_order(name: str) -> list:
    """'turn 2' before 'turn 10': digits compare as numbers."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", name)]




def accuracy_rows(a: RunSummary, b: RunSummary) -> list[dict[str, Any]]:
    """``compare``'s rows of each graded set two runs share (--accuracy): A's and B's accuracy in %, apart when their
    95 % intervals do not overlap."""
    rows = []
    for name in sorted(set(a.names or {}) & set(b.names or {})):
        sa, sb = RunSummary.of(a.names[name]), RunSummary.of(b.names[name])
        if sa.accuracy is not None and sb.accuracy is not None:
            rows.append({"metric": f"accuracy[{name}]", "title": f"accuracy [{name}]", "unit": "%",
                         "a": sa.accuracy * 100, "b": sb.accuracy * 100, "delta": (sb.accuracy - sa.accuracy) * 100,
                         "pct": (sb.accuracy - sa.accuracy) / sa.accuracy * 100 if sa.accuracy else None,
                         "significant": sa.accuracy_ci[1] < sb.accuracy_ci[0] or sb.accuracy_ci[1] < sa.accuracy_ci[0]})
    return rows
