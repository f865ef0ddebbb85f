"""An ``LLMStats``' totals summed up into a ``RunSummary``: counts, rates, each metric's percentiles, outages, and
the same per name and per target."""

from __future__ import annotations

from typing import Any

from vllm_load.metrics.fleet import outages
from vllm_load.metrics.histogram import PERCENTILES, percentile_key
from vllm_load.metrics.summary import RunSummary, name_order
from vllm_load.metrics.judge.repeats import wilson
from vllm_load.metric_table import INPUT_TOKENS, ITL, OUTPUT_TOKENS, REASONING_TOKENS


def summarise(self: Any, duration: float | None = None, records_per_request: int = 0,
              outage_after: float | None = 2.0, now: float | None = None,
              percentiles: tuple[float, ...] = PERCENTILES, shown: tuple[float, ...] = PERCENTILES) -> RunSummary:
    """An ``LLMStats``' summary (``self``: its totals). ``records_per_request``: dataset records each request carries (``--dataset-batch``), for the
    records/s that a batching comparison is about; 0 when prompts are not dataset records. ``percentiles``:
    those computed (the run's --metric-percentiles, the standard ones and its SLOs'); ``shown``: the columns
    every medium shows (``summary["percentiles"]``)."""
    if duration is None:
        duration = (self.last_end - self.first_start) if self.first_start is not None else 0.0
    ok = self.requests - self.failures
    with_usage = ok - self.usage_missing
    out: dict[str, Any] = {
        "requests": self.requests,
        "succeeded": ok,
        "failed": self.failures,
        "error_rate": self.failures / self.requests if self.requests else 0.0,
        "duration_s": duration,
        "request_rate": ok / duration if duration else 0.0,
        # arrivals per second between the first and the last request's (intended) start
        "send_rate": (self.requests - 1) / (self.last_start - self.first_start)
        if self.requests > 1 and self.last_start and self.first_start and self.last_start > self.first_start else 0.0,
        INPUT_TOKENS: self.input_tokens,
        OUTPUT_TOKENS: self.output_tokens,
        "output_token_rate": self.output_tokens / duration if duration else 0.0,
        # vllm bench serve's "Total token throughput": input and output tokens per second
        "total_token_rate": (self.input_tokens + self.output_tokens) / duration if duration else 0.0,
        "usage_missing": self.usage_missing,
        "input_drift_requests": self.drift_requests,
        "input_drift_max_abs": self.drift_max_abs,
        "input_drift_fraction": self.drift_requests / with_usage if with_usage > 0 else 0.0,
        "output_mismatch": self.output_mismatch,
        REASONING_TOKENS: self.reasoning_tokens,
        "reasoning_requests": self.reasoning_requests,
        "reasoning_by_tokenizer": self.reasoning_by_tokenizer,
        # the server's prefix-cache hits as its usage reported them per request (None: it reported none)
        "cached_tokens": self.cached_tokens if self.cached_of else None,
        "cached_fraction": self.cached_tokens / self.cached_of if self.cached_of else None,
        # vllm bench serve's goodput: requests/s that met every per-request SLO; and their share
        "goodput": self.good / duration if self.judged and duration else None,
        "good_request_fraction": self.good / self.judged if self.judged else None,
        "good_requests": self.good,
        "warmup_excluded": self.warmup_excluded,
        "removed_excluded": self.removed_excluded,
        "abandoned_excluded": self.abandoned_excluded,
        "one_token_chunks": self.one_token_chunks,
        "backoffs": self.backoffs,
        "backoff_s": self.backoff_ms / 1000.0,
        "errors": dict(self.errors.most_common()),
        "error_examples": {k: self.error_examples.get(k, k) for k in self.errors},
        "metrics": {k: h.summary(percentiles) for k, h in self.hists.items()},
        "percentiles": [percentile_key(p) for p in shown],
        # chunk gaps of 0: two chunks of a stream under one receive stamp (a late read merges them, or the
        # server wrote them together)
        "shared_stamps": self.hists[ITL].at_most_1ns(),
        # of those, the ones a late read of the native reader made (the others landed together: the server's)
        "late_merged_gaps": self.late_merged,
    }
    # outage_after None: no outage windows (the web UI's live table polls this and shows none)
    windows = self.outage_windows(outage_after, now) if outage_after is not None else []
    start = self.first_start or 0.0
    out["outages"] = [{**w.to_json(), "text": outages.describe(w, start, self.conn_error[1] if w.is_outage else "")}
                      for w in windows]
    out["outage_seconds"] = sum(w.seconds for w in windows if w.is_outage)
    if self.media_items:  # images and audio: their prompt tokens apart from the text's
        out["media_items"] = self.media_items
        out["media_tokens"] = self.media_tokens
        out["text_input_tokens"] = self.input_tokens - self.media_tokens
    # the answers checked and the share that passed, with its 95 % Wilson interval: --accuracy's graded answers that
    # were right, --response-format's whose JSON was valid
    for checked, share, n, right in (("graded", "accuracy", self.graded, self.correct),
                                     ("validated", "valid_output", self.validated, self.valid)):
        if n:
            out[checked], out[share], out[f"{share}_ci"] = n, right / n, list(wilson(right, n))
    if self.items:  # pooling requests: their inputs, and inputs/s
        out["inputs"] = self.items
        out["input_rate"] = self.items / duration if duration else 0.0
        out["input_token_rate"] = self.input_tokens / duration if duration else 0.0
    if records_per_request:
        out["records_per_request"] = records_per_request
        out["records"] = ok * records_per_request
        out["record_rate"] = ok * records_per_request / duration if duration else 0.0
    if self.names:
        out["names"] = {n: self.names[n].summary(duration, records_per_request, None, now, percentiles, shown)
                        for n in sorted(self.names, key=name_order)}
    steady = self.phases.get("steady")
    if steady is not None and steady.first_start is not None:  # its own span, not the run's
        part = steady.summary(None, records_per_request, None, now, percentiles, shown)
        out["steady"] = part.replace(window_s=[steady.first_start - start, steady.last_end - start])
    if self.targets:  # --host a,b: each replica's rows, and its outages named as that target's
        out["targets"] = {t: self.targets[t].summary(duration, records_per_request, None, now, percentiles, shown)
                          for t in sorted(self.targets)}
        if outage_after is not None:
            own = {t: self.targets[t].outage_windows(outage_after, now) for t in sorted(self.targets)}
            # the run's own window is every target's only when each was unreachable (a storm: failing) in it too:
            # one replica down while the other answered, slowly enough to leave a second without an answer (beside
            # the full suite), was called "every target" and hid the replica's own outage; the streams a kill cut,
            # with the other replica's long answers still streaming, were "every target: every request failed"
            out["outages"] = [{**w, "text": "every target: " + w["text"]} for w in out["outages"]
                              if all(any((x.is_outage or not w["outage"]) and x.start < w["end"] and w["start"] < x.end
                                         for x in windows) for windows in own.values())]
            out["outage_seconds"] = sum(w["seconds"] for w in out["outages"] if w["outage"])  # the run's: every target
            for t, windows in own.items():
                sub = self.targets[t]
                out["outages"] += [{**w.to_json(), "target": t, "text": f"target {t}: " + outages.describe(
                    w, start, sub.conn_error[1] if w.is_outage else "")} for w in windows
                    if not any(r["start"] <= w.start and w.end <= r["end"] for r in out["outages"] if "target" not in r)]
    return RunSummary(**out)
