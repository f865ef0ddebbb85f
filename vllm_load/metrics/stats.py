"""LLM metrics of a run: exact histograms, counters and a per-second timeline.

A worker records into its own ``LLMStats`` and ships ``take_delta()`` to the master with every
Locust stats report; the master ``merge``s each delta. Everything is additive (histogram buckets,
counters, per-second counts), so the master's totals equal the union of all workers' exactly.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from vllm_load.metrics.fleet import outages
from vllm_load.metrics.shape.delivered import Sends
from vllm_load.metrics.error_kinds import MAX_KINDS, OTHER, error_kind
from vllm_load.metrics.histogram import PERCENTILES, Histogram
from vllm_load.metrics import fold as folding
from vllm_load.metrics.summary import (  # noqa: F401  (upgrade_summary: where readers found it first)
    NAMES_VERSION, RunSummary, upgrade_summary, upgrade_wire)
from vllm_load.metrics.summarise import summarise
from vllm_load.metric_table import INPUT_TOKENS, METRICS, OUTPUT_TOKENS, REASONING_TOKENS, WINDOWED
from vllm_load.client.record import RequestRecord

#: Latency-like histograms (seconds) and per-request output tokens/s.
#: Width of the time windows whose TTFT/ITL/E2E histograms the report plots over time.
WINDOW_S = 10
#: Windows this much older than the newest are packed (a late request still unpacks its window).
PACK_AFTER_S = 60
WINDOW_METRICS = WINDOWED  # the table's windowed metrics: ttft, itl_token, e2e
#: distinct name= groups kept apart (each holds ~10 histograms); further names share one group, as a
#: locustfile naming every request uniquely would otherwise grow memory without bound
MAX_NAMES = 100
OTHER_NAMES = "(other names)"


def _new_hists() -> dict[str, Histogram]:
    return {m.key: Histogram(scale=m.hist_scale) for m in METRICS}


@dataclass
class LLMStats:
    """Totals of finished requests. ``add`` is O(1) on the event loop: counters are updated at once
    and the per-token work (histograms, per-second tokens, windows) is folded in vectorised batches
    the first time anything reads it, so a request finishing never stalls the streams still reading."""

    _hists: dict[str, Histogram] = field(default_factory=_new_hists)
    requests: int = 0
    failures: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    usage_missing: int = 0
    drift_requests: int = 0
    drift_max_abs: int = 0
    output_mismatch: int = 0
    good: int = 0  # requests that met every per-request SLO
    cached_tokens: int = 0  # prompt tokens served from the server's prefix cache (requests whose usage says)
    cached_of: int = 0  # prompt tokens of those requests
    warmup_excluded: int = 0  # requests started during the warm-up: sent and logged, not in any metric
    #: requests cut because the load shape (a ramp down, the web UI's new user count) removed their user mid-run:
    #: logged, neither a success nor a failure (a healthy server ran 6 of them as failures and exit 1)
    removed_excluded: int = 0
    abandoned_excluded: int = 0  # --cancel: requests the client gave up on mid-answer: logged, in no metric
    #: successful streams whose chunks' token counts the server did not say (no continuous usage): each chunk is
    #: taken for one token, so ITL per token is per chunk, whatever a chunk carried
    one_token_chunks: int = 0
    backoffs: int = 0  # closed loop: waits before a next request after a server error, and their total in ms
    reasoning_tokens: int = 0  # output tokens spent reasoning (successful requests)
    reasoning_requests: int = 0
    reasoning_by_tokenizer: int = 0
    items: int = 0  # pooling: inputs (texts, documents) of the successful requests
    graded: int = 0  # --accuracy: successful requests graded, and those whose answer was right
    correct: int = 0
    validated: int = 0  # --response-format: successful requests checked, and those whose JSON was valid
    valid: int = 0
    late_merged: int = 0  # chunk gaps of 0 made by the native reader's late reads (successful requests)
    media_items: int = 0  # images and audio clips of the successful requests, and their prompt tokens (the
    media_tokens: int = 0  # server's count minus the exact text count, where the server gave one)
    backoff_ms: int = 0
    judged: int = 0  # requests judged for goodput (all requests, when per-request SLOs exist)
    errors: Counter = field(default_factory=Counter)  # failures by kind (error_kinds.error_kind)
    error_examples: dict = field(default_factory=dict)  # kind -> its first raw reason
    _tokens_per_second: Counter = field(default_factory=Counter)  # int(wall second) -> output tokens
    done_per_second: Counter = field(default_factory=Counter)  # int(wall second) -> finished requests
    #: int(wall second of the first token) -> the TTFTs' sum and count (the saturation detector's TTFT trend)
    ttft_per_second: Counter = field(default_factory=Counter)
    first_tokens_per_second: Counter = field(default_factory=Counter)
    _windows: dict = field(default_factory=lambda: defaultdict(dict))  # window start -> metric -> Histogram
    first_start: float | None = None
    last_start: float | None = None
    last_end: float | None = None
    # 100 ms buckets (outages.bucket) of evidence: answers (a first token, an end), connection-level and other failures
    ok_buckets: Counter = field(default_factory=Counter)
    conn_buckets: Counter = field(default_factory=Counter)
    fail_buckets: Counter = field(default_factory=Counter)
    conn_error: tuple = (0.0, "")  # the latest connection-level failure: (start, reason)
    #: the same metrics per request name (name=): totals of their own, merged exactly like the run's
    names: dict = field(default_factory=dict)
    #: the same per target (--host a,b): each replica's own totals, outages included
    targets: dict = field(default_factory=dict)
    #: the same over a phase of the run: "steady", its requests that ran in the steady window (``plugin/load/steady.py``)
    phases: dict = field(default_factory=dict)
    #: open loop at a constant rate: every process's actual send times (``delivered``: the load delivered)
    sends: Sends = field(default_factory=Sends)
    timeline: bool = True  # per-second and per-window series (a name's group keeps none: the run's has them)
    _pending: list = field(default_factory=list, repr=False, compare=False)

    #: pending requests beyond which ``add`` folds by itself (bounds memory when nothing reads)
    MAX_PENDING = 20_000

    @property
    def hists(self) -> dict[str, Histogram]:
        self.fold()
        return self._hists

    @property
    def windows(self) -> dict:
        self.fold()
        return self._windows

    @property
    def tokens_per_second(self) -> Counter:
        self.fold()
        return self._tokens_per_second

    def named(self, name: str) -> LLMStats:
        sub = self.names.get(name)
        if sub is None:
            if len(self.names) >= MAX_NAMES and name != OTHER_NAMES:
                return self.named(OTHER_NAMES)
            sub = self.names[name] = LLMStats(timeline=False)
        return sub

    def targeted(self, url: str) -> LLMStats:
        sub = self.targets.get(url)
        if sub is None:
            sub = self.targets[url] = LLMStats(timeline=False)
        return sub

    def phase(self, name: str) -> LLMStats:
        sub = self.phases.get(name)
        if sub is None:
            sub = self.phases[name] = LLMStats(timeline=False)
        return sub

    def _groups(self) -> list[LLMStats]:
        return [*self.names.values(), *self.targets.values(), *self.phases.values()]

    def add(self, rec: RequestRecord) -> None:
        if self.timeline:  # the run's totals: a request also counts in its name's and its target's group
            if rec.name is not None:
                self.named(rec.name).add(rec)
            if rec.target is not None:
                self.targeted(rec.target).add(rec)
            if rec.steady:
                self.phase("steady").add(rec)
            if rec.segment is not None:
                self.phase(f"segment {rec.segment}").add(rec)
        self.requests += 1
        end = rec.start + rec.e2e
        self.first_start = rec.start if self.first_start is None else min(self.first_start, rec.start)
        self.last_start = rec.start if self.last_start is None else max(self.last_start, rec.start)
        self.last_end = end if self.last_end is None else max(self.last_end, end)
        self.done_per_second[int(end)] += 1
        if rec.good is not None:
            self.judged += 1
            self.good += rec.good
        self._pending.append(rec)
        if len(self._pending) >= self.MAX_PENDING:
            self.fold()
        # the outage buckets hold evidence at the time it is of: an answer when its first token came (its end without
        # one; a 25 s request on a healthy replica counted only at its start), a failure from when the server went silent
        # on it: its last chunk, or its start when it got none (a stream cut by a kill 20 s in started its outage 20 s
        # early; a request a stopping vLLM held 30 s without its head is the outage's from its send)
        answered = rec.start + rec.ttft if rec.ttft is not None else None
        silent = rec.start + (rec.chunk_offsets[-1] if rec.chunk_offsets else 0.0)
        if not rec.ok:
            self.failures += 1
            self.count_error(rec.error or "unknown error")
            if answered is not None:  # it answered before it failed or the run's end stopped it: the server was
                self.ok_buckets[outages.bucket(answered)] += 1  # there then (a restarted replica's 1,000-token answers,
                # cut by the run's end, once left its outage running to the end)
            if rec.cancelled:  # the run's end stopped it: neither refused nor answered badly, in no outage or storm
                return
            if rec.connection_failed:
                self.conn_buckets[outages.bucket(silent)] += 1
                if rec.start >= self.conn_error[0]:
                    self.conn_error = (rec.start, rec.error or "")
            else:
                self.fail_buckets[outages.bucket(silent)] += 1
            return
        self.ok_buckets[outages.bucket(answered if answered is not None else end)] += 1
        folding.count_success(self, rec)

    @property
    def pending(self) -> int:
        return len(self._pending) + sum(len(n._pending) for n in self._groups())

    def fold(self, max_values: int | None = None) -> None:
        """Record the pending requests' per-request and per-token values, vectorised over all of them
        (or over the oldest ones holding about ``max_values`` chunks: a slice of bounded time)."""
        for sub in self._groups():
            sub.fold(max_values)
        recs = self._pending
        if not recs:
            return
        if max_values is None:
            self._pending = []
        else:
            k, n = 0, 0
            while k < len(recs) and (k == 0 or n < max_values):
                n += len(recs[k].chunk_offsets) + 1
                k += 1
            recs, self._pending = recs[:k], recs[k:]
        folding.record(self._hists, self._windows if self.timeline else None,
                       self._tokens_per_second if self.timeline else None, recs, WINDOW_S)
        self._pack_old_windows()

    def _pack_old_windows(self) -> None:
        """A run's memory must not grow with its length: each window's three histograms hold 265 KB
        of counters each (286 MB per hour of 10 s windows); packed they take ~1 KB."""
        if len(self._windows) < 2:
            return
        horizon = max(self._windows) - PACK_AFTER_S
        for w, ms in self._windows.items():
            if w < horizon:
                for h in ms.values():
                    h.pack()

    def count_error(self, reason: str, n: int = 1, kind: str | None = None) -> None:
        """``n`` failures of ``reason``, counted under its kind (at most MAX_KINDS kinds; later ones as one
        row), the first raw reason kept as the kind's example."""
        kind = error_kind(reason) if kind is None else kind
        if kind not in self.errors and len(self.errors) >= MAX_KINDS:
            kind = OTHER
        self.errors[kind] += n
        self.error_examples.setdefault(kind, reason[:240])

    # -- shipping between processes -------------------------------------------------------------
    _BUCKETS = ("ok_buckets", "conn_buckets", "fail_buckets")
    _COUNTERS = ("requests", "failures", INPUT_TOKENS, OUTPUT_TOKENS, "usage_missing",
                 "drift_requests", "output_mismatch", "good", "judged", "cached_tokens", "cached_of",
                 "warmup_excluded", "removed_excluded", "abandoned_excluded", "one_token_chunks", "backoffs",
                 "backoff_ms", REASONING_TOKENS, "reasoning_requests", "reasoning_by_tokenizer", "items", "late_merged",
                 "media_items", "media_tokens", "graded", "correct", "validated", "valid")

    def to_wire(self) -> dict:
        return {
            "hists": {k: v.to_wire() for k, v in self.hists.items() if v.count},
            **{k: getattr(self, k) for k in self._COUNTERS},
            "drift_max_abs": self.drift_max_abs,
            "errors": dict(self.errors),
            "error_examples": self.error_examples,
            "tokens_per_second": {str(k): v for k, v in self.tokens_per_second.items()},
            "done_per_second": {str(k): v for k, v in self.done_per_second.items()},
            "ttft_per_second": {str(k): v for k, v in self.ttft_per_second.items()},
            "first_tokens_per_second": {str(k): v for k, v in self.first_tokens_per_second.items()},
            "windows": {str(w): {m: h.to_wire() for m, h in ms.items()} for w, ms in self.windows.items()},
            "first_start": self.first_start,
            "last_start": self.last_start,
            "last_end": self.last_end,
            **{k: {str(b): n for b, n in getattr(self, k).items()} for k in self._BUCKETS},
            "conn_error": list(self.conn_error),
            "names": {n: sub.to_wire() for n, sub in self.names.items()},
            "names_version": NAMES_VERSION,
            **({"targets": {t: sub.to_wire() for t, sub in self.targets.items()}} if self.targets else {}),
            **({"phases": {p: sub.to_wire() for p, sub in self.phases.items()}} if self.phases else {}),
            **({"sends": self.sends.times.tolist()} if self.sends.times else {}),
        }

    @classmethod
    def from_wire(cls, data: dict) -> LLMStats:
        data = upgrade_wire(data)
        s = cls()
        for k, v in data["hists"].items():
            s.hists[k] = Histogram.from_wire(v)
        for k in cls._COUNTERS:
            setattr(s, k, int(data.get(k, 0)))  # older run dirs lack newer counters
        s.drift_max_abs = int(data["drift_max_abs"])
        s.errors = Counter(data["errors"])
        s.error_examples = dict(data.get("error_examples") or {})
        s._tokens_per_second = Counter({int(k): v for k, v in data["tokens_per_second"].items()})
        s.done_per_second = Counter({int(k): v for k, v in data["done_per_second"].items()})
        s.ttft_per_second = Counter({int(k): v for k, v in data.get("ttft_per_second", {}).items()})
        s.first_tokens_per_second = Counter({int(k): v for k, v in data.get("first_tokens_per_second", {}).items()})
        for w, ms in data["windows"].items():
            s.windows[int(w)] = {m: Histogram.from_wire(h) for m, h in ms.items()}
        s.first_start, s.last_end = data["first_start"], data["last_end"]
        s.last_start = data.get("last_start")
        for k in cls._BUCKETS:  # older run dirs have none
            setattr(s, k, Counter({int(b): n for b, n in data.get(k, {}).items()}))
        s.conn_error = tuple(data.get("conn_error", (0.0, "")))
        s.sends.extend(data.get("sends") or ())
        for group in ("names", "targets", "phases"):
            for key, wire in data.get(group, {}).items():
                sub = cls.from_wire(wire)
                sub.timeline = False
                getattr(s, group)[key] = sub
        return s

    def merge(self, other: LLMStats) -> None:
        for n, sub in other.names.items():
            self.named(n).merge(sub)
        for t, sub in other.targets.items():
            self.targeted(t).merge(sub)
        for p, sub in other.phases.items():
            self.phase(p).merge(sub)
        for k, h in other.hists.items():
            self.hists[k].merge(h)
        for k in self._COUNTERS:
            setattr(self, k, getattr(self, k) + getattr(other, k))
        self.drift_max_abs = max(self.drift_max_abs, other.drift_max_abs)
        for kind, n in other.errors.items():
            self.count_error(other.error_examples.get(kind, kind), n, kind)
        self.tokens_per_second.update(other.tokens_per_second)
        self.done_per_second.update(other.done_per_second)
        self.ttft_per_second.update(other.ttft_per_second)
        self.first_tokens_per_second.update(other.first_tokens_per_second)
        for k in self._BUCKETS:
            getattr(self, k).update(getattr(other, k))
        self.conn_error = max(self.conn_error, other.conn_error, key=lambda e: e[0])
        self.sends.extend(other.sends.times)
        for w, ms in other.windows.items():
            mine = self.windows[w]
            for m, h in ms.items():
                if m in mine:
                    mine[m].merge(h)
                else:
                    mine[m] = h
        for attr, pick in (("first_start", min), ("last_start", max), ("last_end", max)):
            a, b = getattr(self, attr), getattr(other, attr)
            setattr(self, attr, b if a is None else a if b is None else pick(a, b))
        self._pack_old_windows()

    def take_delta(self) -> dict:
        """Everything recorded since the last call, as wire data; the local stats start over."""
        wire = self.to_wire()
        self.__init__(timeline=self.timeline)  # type: ignore[misc]
        return wire

    # -- reading ----------------------------------------------------------------------------------
    def recent_output_tps(self, now: float, window: int = 10, lag: int = 3) -> float:
        """Output tokens/s over the ``window`` whole seconds ending ``lag`` s ago (workers report every 3 s)."""
        end = int(now) - lag
        return sum(self.tokens_per_second.get(s, 0) for s in range(end - window, end)) / window

    def outage_windows(self, min_seconds: float, now: float | None = None) -> list[outages.Window]:
        """Spans with failures and no success (``outages``); O(buckets), no fold: cheap to poll live."""
        return outages.find_windows(self.ok_buckets, self.conn_buckets, self.fail_buckets, min_seconds, now)

    def summary(self, duration: float | None = None, records_per_request: int = 0,
                outage_after: float | None = 2.0, now: float | None = None,
                percentiles: tuple[float, ...] = PERCENTILES, shown: tuple[float, ...] = PERCENTILES) -> RunSummary:
        """The run's summary of these totals (``metrics/summary.summarise``)."""
        return summarise(self, duration, records_per_request, outage_after, now, percentiles, shown)
