"""The run summary's nested parts, each a ``Part``: its keys declared once here and read by attribute.

A part is a dict underneath, so every writer (json, orjson, msgpack) writes it as the object it always was and
summary.json keeps its shape; a summary wraps each part it is given (``RunSummary`` calls ``wrap_parts``), so a
part read back from a file and one built in the run read alike. An absent key reads as its declared default."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Generic, TypeVar, overload

from vllm_load.metric_table import INPUT_TOKENS

T = TypeVar("T")
P = TypeVar("P", bound="Part")
#: an absent mapping's default: read-only, so that no reader changes the one every part shares
EMPTY: Mapping[str, Any] = MappingProxyType({})


class Key(Generic[T]):
    """One declared key of a ``Part``: read as an attribute, ``default`` when the part has no such key."""

    def __init__(self, default: T | None = None, doc: str = "", key: str | None = None) -> None:
        self.default, self.__doc__, self.name = default, doc, key

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = self.name or name  # the attribute's name, unless the key is another table's (key=)

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Key[T]: ...

    @overload
    def __get__(self, obj: Part, owner: type | None = None) -> T: ...

    def __get__(self, obj: Part | None, owner: type | None = None) -> Any:
        return self if obj is None else obj.get(self.name, self.default)


class Part(dict[str, Any]):
    """A nested part of a summary. Subclasses declare their keys as ``Key`` attributes; ``NESTED`` names the keys
    whose values are parts themselves (a part, or a mapping or list of parts), wrapped when the part is made."""

    NESTED: dict[str, tuple[str, type[Part]]] = {}  # key -> ("one" | "map" | "maps" | "list", its part's class)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for key, (shape, cls) in self.NESTED.items():
            value = self.get(key)
            if value is not None:
                self[key] = wrap(shape, cls, value)

    @classmethod
    def declared(cls) -> frozenset[str]:
        """The keys this part declares."""
        return frozenset(v.name for c in cls.__mro__ for v in vars(c).values() if isinstance(v, Key))

    @classmethod
    def of(cls: type[P], value: Mapping[str, Any] | None) -> P | None:
        """``value`` as this part (None stays None)."""
        return value if value is None or isinstance(value, cls) else cls(value)


def wrap(shape: str, cls: type[Part], value: Any) -> Any:
    """``value`` as ``cls``: one part, a mapping of them (by worker, by label), a mapping of such mappings (a tail
    by metric, then by percentile) or a list of them."""
    if shape == "one":
        return cls.of(value)
    if shape == "map":
        return {k: cls.of(v) for k, v in value.items()}
    if shape == "maps":
        return {k: wrap("map", cls, v) for k, v in value.items()}
    return [cls.of(v) for v in value]


class MetricSummary(Part):
    """One metric's statistics: ``count``, ``mean``, ``min``, ``std``, the percentiles computed (``p50``,
    ``p99.9``: ``histogram.percentile_key``, read by ``at``) and ``max``. A metric of the summary, or a server part
    of the timing breakdown."""

    count = Key[int](0)
    mean = Key[float]()
    min = Key[float]()
    std = Key[float]()
    max = Key[float]()

    def at(self, stat: str) -> float | None:
        """A statistic by its column name (``p99``, ``mean``): None when this summary did not compute it."""
        return self.get(stat)


class Tail(Part):
    """A tail of TTFT or E2E at one percentile: its edge, its requests, and the mean of each part over them."""

    value = Key[float](0.0, "the tail's edge, seconds")
    requests = Key[int](0)
    split = Key[dict](EMPTY, "part (metric_table key, or 'client') -> its mean over the tail's requests, seconds")


class GroupTails(Part):
    """Requests (a run's, one replica's, one name's) and their TTFT and E2E tails: metric -> "p99" -> ``Tail``."""

    NESTED = {"tails": ("maps", Tail)}
    requests = Key[int](0)
    tails = Key[dict](EMPTY)

    def tail(self, metric: str, q: str = "p99") -> Tail | None:
        return self.tails.get(metric, {}).get(q)


class SpansJoined(Part):
    """--otlp-receiver: how the server's spans joined the run's requests (``metrics/fleet/spans.py``)."""

    spans = Key[int](0)
    joined = Key[int](0)
    unmatched = Key[int](0)
    requests_without = Key[int](0)


class Timing(GroupTails):
    """Where each request's time went (``metrics/shape/breakdown.py``): each server part's statistics, the tails' mean
    splits, the p99 tails per replica and per name where there are several, and how the spans joined."""

    NESTED = {**GroupTails.NESTED, "parts": ("map", MetricSummary), "by_replica": ("map", GroupTails),
              "by_name": ("map", GroupTails), "spans": ("one", SpansJoined)}
    parts = Key[dict](EMPTY, "part -> MetricSummary")
    by_replica = Key[dict](EMPTY, "replica -> GroupTails")
    by_name = Key[dict](EMPTY, "name -> GroupTails")
    spans = Key[SpansJoined]()

    def groups(self, group: str) -> dict[str, GroupTails]:
        """``by_replica`` or ``by_name`` by the group's name (``replica``, ``name``): empty with one group."""
        return self.get(f"by_{group}") or {}


class ClientVerdict(Part):
    """The client's verdict on itself (``ClientHealth.verdict``, with the embedded emulator's lateness joined by
    ``verdict.judge_emulator``): whether it kept time, why not, and the evidence."""

    saturated = Key[bool](False, "the numbers describe what fell behind, not the server")
    reasons = Key[list](())
    notes = Key[list](())
    cause = Key[str](None, "client_health.ADVICE's keys, or 'emulator'")
    advice = Key[str]("")
    cpu_max = Key[float](0.0)
    loop_lag_max = Key[float](0.0)
    cpu_wait_max = Key[float](0.0)
    steal_max = Key[float](0.0)
    streams_max = Key[int](0)
    readers = Key[list]((), "which readers timed the chunks: native, python, clock")
    read_lag_max = Key[float](0.0)


class ReplicaRow(Part):
    """One replica's share of the run's requests (the routing verdict)."""

    requests = Key[int](0)
    failed = Key[int](0)
    input_tokens = Key[int](0, key=INPUT_TOKENS)
    cached_tokens = Key[int](doc="None: its answers carried no cached tokens (vLLM's --enable-prompt-tokens-details)")


class Routing(Part):
    """The verdict on the router (``metrics/fleet/routing.py``): replicas' shares, sessions kept on one replica, and the
    prefix-cache hits kept of those a replica holding the session's turns could have had."""

    NESTED = {"replicas": ("map", ReplicaRow)}
    source = Key[str]("")
    replicas = Key[dict](EMPTY, "replica -> ReplicaRow")
    replica_imbalance = Key[float](1.0)
    sessions = Key[int](0)
    sticky_sessions = Key[int](0)
    session_stickiness = Key[float]()
    cache_hits_achievable = Key[int](0)
    cache_hits_achieved = Key[int](doc="None: not known (cache_hits_unknown says why), never taken as 0")
    cache_hits_of_achievable = Key[float]()
    cache_hits_source = Key[str]("", "where the achieved hits come from: the answers' usage, or the replicas' counters")
    cache_hits_unknown = Key[str]("", "why the achieved hits are not known")
    cache_block = Key[int](16, "the server's KV block the achievable hits are counted in: its vllm:cache_config_info "
                           "block_size through a sidecar, else vLLM's default 16")
    unattributed = Key[int](0, "failed requests through a router that named no replica (no span, no header)")


class Saturation(Part):
    """When the server stopped keeping up (``metrics/fleet/saturation.Finding``)."""

    detected = Key[bool](False)
    text = Key[str]("")
    at_s = Key[float]()
    onset_s = Key[float]()
    offered = Key[float]()
    offered_unit = Key[str]("")
    capacity_rps = Key[float]()
    queue_from = Key[float]()
    queue_to = Key[float]()
    queue_source = Key[str]("")
    ttft_from = Key[float]()
    ttft_to = Key[float]()


class Energy(Part):
    """GPU energy over the run's window (``metrics/fleet/energy.energy_summary``, --dcgm-url)."""

    gpus = Key[int](0)
    source = Key[str]("")
    energy_j = Key[float](0.0)
    average_power_w = Key[float](0.0)
    power_max_w = Key[float]()
    gpu_util_mean = Key[float]()
    energy_per_output_token_j = Key[float]()
    energy_per_request_j = Key[float]()
    output_tokens_per_joule = Key[float]()


class TraceKept(Part):
    """--trace: how much of it was sent, over what span against the intended one."""

    rows = Key[int](0)
    sent = Key[int](0)
    intended_s = Key[float](0.0)
    sent_span_s = Key[float](0.0)


class WorkerOffset(Part):
    """A swarm worker's offset to the master's clock (``run_clock.MasterClock.summary``), in ms."""

    offset_ms = Key[float](0.0)
    uncertainty_ms = Key[float](0.0)
    remeasured = Key[int](0)
    offset_last_ms = Key[float]()
    drift_ms = Key[float]()
    schedule_moved_ms = Key[float]()


class OutageWindow(Part):
    """A span of failures with no success in between (``outages.Window.to_json`` plus its sentence)."""

    start = Key[float](0.0, "wall clock")
    end = Key[float](0.0)
    attempts = Key[int](0)
    connection = Key[int](0)
    ongoing = Key[bool](False)
    conn_seconds = Key[float](0.0)
    seconds = Key[float](0.0)
    outage = Key[bool](False, "unreachable, not merely failing")
    text = Key[str]("")
    target = Key[str](None, "--host a,b: the one target it hit (None: every target)")


class ProfiledWindow(Part):
    """--profile-at: one profiler window, seconds into the measured window."""

    what = Key[str]("")
    targets = Key[list](())
    from_s = Key[float](0.0)
    to_s = Key[float](0.0)


#: RunSummary's fields that hold parts: field -> (shape, part class)
SUMMARY_PARTS: dict[str, tuple[str, type[Part]]] = {
    "metrics": ("map", MetricSummary), "client": ("one", ClientVerdict), "timing": ("one", Timing),
    "saturation": ("one", Saturation), "energy": ("one", Energy), "trace": ("one", TraceKept),
    "clock": ("map", WorkerOffset), "outages": ("list", OutageWindow), "profiled": ("list", ProfiledWindow),
}


def wrap_parts(values: dict[str, Any]) -> dict[str, Any]:
    """The parts among a summary's ``values`` as their ``Part`` classes (a part given as None stays None)."""
    return {k: wrap(*SUMMARY_PARTS[k], v) if k in SUMMARY_PARTS and v is not None else v for k, v in values.items()}
