"""Vectorised folding of finished requests into histograms: a batch's chunks flattened once, per-second
token counts, and chunk and per-token gaps, so a request's per-token work never runs on the loop one by one."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import chain

import numpy as np

from vllm_load.client.record import RequestRecord


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
