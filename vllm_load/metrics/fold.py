"""Vectorised folding of finished requests into histograms: a batch's chunks flattened once, per-second
token counts, and chunk and per-token gaps, so a request's per-token work never runs on the loop one by one."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import chain
from typing import Any
import bisect

import numpy as np

from vllm_load.client.record import RequestRecord
from vllm_load.metrics.histogram import Histogram
from vllm_load.metric_table import (
    E2E, ITL, ITL_ANSWER, ITL_REASONING, ITL_TOKEN, PER_REQUEST_FIELDS, SEND_LAG, SEND_LAG_STARTUP, TTFT)


@dataclass
class Chunks:
    """The chunks of a batch of requests, flattened once for every vectorised step of ``fold``."""

    lens: np.ndarray  # chunks per request
    offs: np.ndarray  # each chunk's offset from its request's start
    toks: np.ndarray  # tokens each chunk carried
    rec_of: np.ndarray  # the request each chunk belongs to

    @classmethod
    def of(cls, recs: list[RequestRecord]) -> Chunks:
        lens = np.array([len(r.chunk_offsets) for r in recs], dtype=np.int64)
        total = int(lens.sum())
        return cls(lens, np.fromiter(chain.from_iterable(r.chunk_offsets for r in recs), np.float64, total),
                   np.fromiter(chain.from_iterable(r.chunk_tokens for r in recs), np.int64, total),
                   np.repeat(np.arange(len(recs)), lens))


def per_second(out: Counter, starts: np.ndarray, c: Chunks) -> None:
    """Add each chunk's tokens to the wall-clock second it arrived in."""
    if not c.offs.size:
        return
    secs = np.floor(starts[c.rec_of] + c.offs).astype(np.int64)
    uniq, inv = np.unique(secs, return_inverse=True)
    for sec, n in zip(uniq.tolist(), np.bincount(inv, weights=c.toks).tolist()):
        out[sec] += int(n)


def gaps(c: Chunks, ok: np.ndarray) -> tuple[np.ndarray, ...]:
    """Chunk gaps, and per-token gaps with their token counts (``RequestRecord.token_itls``), of the
    requests flagged ``ok``; each per-token gap also says which request it came from."""
    first = np.zeros(c.offs.size, dtype=bool)
    first[(np.cumsum(c.lens) - c.lens)[c.lens > 0]] = True
    mine = ok[c.rec_of]
    j = np.nonzero(~first & mine)[0]  # chunks after the first of their request
    gaps = c.offs[j] - c.offs[j - 1]
    n = c.toks[j]
    keep = n > 0
    # a first chunk with k tokens brings k-1 tokens with a zero gap
    f = np.nonzero(first & mine & (c.toks > 1))[0]
    itl = np.concatenate([np.zeros(f.size), gaps[keep] / n[keep]])
    itl_n = np.concatenate([c.toks[f] - 1, n[keep]])
    itl_rec = np.concatenate([c.rec_of[f], c.rec_of[j][keep]])
    return gaps, itl, itl_n, itl_rec


def _answer_chunk(r: RequestRecord) -> int:
    """The index of the answer's first chunk. Chunks read together share an offset (a late read), so the offset
    alone leaves a range; the thinking's tokens counted over the chunks pick the one within it (taking the range's
    first moved 2 of a request's 31 thinking gaps into its answer on a busy host)."""
    o = r.chunk_offsets
    if r.ttfo is None:
        return len(o)
    lo, hi = bisect.bisect_left(o, r.ttfo), bisect.bisect_right(o, r.ttfo)
    if hi - lo > 1 and r.reasoning_tokens and r.chunk_tokens and len(r.chunk_tokens) == len(o):
        k = int(np.searchsorted(np.cumsum(r.chunk_tokens), r.reasoning_tokens, side="right"))
        if lo <= k < hi:
            return k
    return lo


def _phase_gaps(recs: list[RequestRecord]) -> tuple[list[float], list[float]]:
    """The chunk gaps of reasoning requests within their thinking and within their answer (the gap that crosses
    from one to the other is in neither); nothing for requests that did not reason."""
    thinking: list[float] = []
    answering: list[float] = []
    for r in recs:
        if r.reasoning_tokens is None:
            continue
        k = _answer_chunk(r)
        o = r.chunk_offsets
        thinking += [o[i] - o[i - 1] for i in range(1, k)]
        answering += [o[i] - o[i - 1] for i in range(k + 1, len(o))]
    return thinking, answering


def record(hists: dict[str, Histogram], windows: dict | None, tokens_per_second: Counter | None,
           recs: list[RequestRecord], window_s: int = 10) -> None:
    """Record a batch of finished requests: every histogram the metric table names, vectorised over the batch; with
    ``windows``/``tokens_per_second`` (a run's totals, not a name's group) the per-window histograms of each
    ``window_s`` of request starts and the output tokens of each wall second."""
    h = hists
    h[SEND_LAG].record_many([r.send_lag for r in recs if r.send_lag is not None and not r.startup])
    h[SEND_LAG_STARTUP].record_many([r.send_lag for r in recs if r.send_lag is not None and r.startup])
    chunks = Chunks.of(recs)
    starts = np.array([r.start for r in recs])
    if tokens_per_second is not None:
        per_second(tokens_per_second, starts, chunks)
    ok_mask = np.array([r.ok for r in recs], dtype=bool)
    ok = [r for r in recs if r.ok]
    if not ok:
        return
    for key, name in PER_REQUEST_FIELDS:  # the table's one-value-per-request metrics (a time is never below 0: a
        # server's and the client's clocks may disagree by a little on the client's overhead)
        h[key].record_many([max(0.0, v) if isinstance(v, float) else v for r in ok
                            if (v := getattr(r, name, None)) is not None])
    thinking, answering = _phase_gaps(ok)  # and those derived from the chunks
    h[ITL_REASONING].record_many(thinking)
    h[ITL_ANSWER].record_many(answering)
    chunk_gaps, itl, itl_n, itl_rec = gaps(chunks, ok_mask)
    h[ITL].record_many(chunk_gaps)
    h[ITL_TOKEN].record_many(itl, itl_n)
    if windows is None:
        return
    # per window (by request start): e2e and ttft of each ok request, itl of each of its tokens
    e2e = np.array([r.e2e for r in recs])
    ttft = np.array([np.nan if r.ttft is None else r.ttft for r in recs])
    win_of = (starts // window_s).astype(np.int64) * window_s
    for w in np.unique(win_of[ok_mask]).tolist():
        mine = ok_mask & (win_of == w)
        in_win = mine[itl_rec]
        for metric, values, weights in (
            (E2E, e2e[mine], None),
            (TTFT, ttft[mine & ~np.isnan(ttft)], None),
            (ITL_TOKEN, itl[in_win], itl_n[in_win]),
        ):
            if not values.size:
                continue
            win = windows[w]
            hist = win.get(metric)
            if hist is None:
                hist = win[metric] = Histogram()
            hist.record_many(values, weights)


def count_success(stats: Any, rec: RequestRecord) -> None:
    """A successful request's O(1) counters in ``stats`` (an ``LLMStats``), at once on the loop; its histograms
    wait for ``record``'s vectorised batch."""
    if rec.ttft is not None and stats.timeline:
        second = int(rec.start + rec.ttft)
        stats.ttft_per_second[second] += rec.ttft
        stats.first_tokens_per_second[second] += 1
    if rec.input_tokens is not None:
        stats.input_tokens += rec.input_tokens
    if rec.output_tokens is not None:
        stats.output_tokens += rec.output_tokens
    if rec.cached_tokens is not None and rec.input_tokens is not None:
        stats.cached_tokens += rec.cached_tokens
        stats.cached_of += rec.input_tokens
    if not rec.tokens_from_usage:
        stats.usage_missing += 1
    if rec.chunk_offsets and not rec.continuous_usage:
        stats.one_token_chunks += 1
    drift = rec.input_drift
    if drift:
        stats.drift_requests += 1
        stats.drift_max_abs = max(stats.drift_max_abs, abs(drift))
    if rec.output_tokens_asked is not None and rec.output_tokens not in (None, rec.output_tokens_asked):
        stats.output_mismatch += 1
    if rec.reasoning_tokens is not None:
        stats.reasoning_requests += 1
        stats.reasoning_tokens += rec.reasoning_tokens
        stats.reasoning_by_tokenizer += rec.reasoning_source == "tokenizer"
    if rec.items:
        stats.items += rec.items
    if rec.correct is not None:
        stats.graded += 1
        stats.correct += rec.correct
    if rec.valid is not None:
        stats.validated += 1
        stats.valid += rec.valid
    stats.late_merged += rec.late_merged
    if rec.media:
        stats.media_items += rec.media
        stats.media_tokens += rec.media_tokens or 0
