"""One finished request: its raw timings and the LLM metrics derived from them.

Definitions (all times in seconds, from the request's start, which in open-loop mode is its
*intended* send time so that queueing in the client is not hidden):
  TTFT       first token-bearing chunk (a reasoning model's first reasoning token)
  TTFO       first chunk of the answer (content, text or a tool call; not reasoning): AIPerf's time to
             first output token; equal to TTFT for a model that does not reason
  ITL/chunk  gap between consecutive token-bearing chunks (what ``vllm bench serve`` reports)
  ITL/token  each chunk gap divided over the tokens that chunk carried, recorded once per token,
             so there are out-1 values whose sum is last-token minus first-token time
  TPOT       (E2E - TTFT) / (out - 1)
  E2E        end of the stream ([DONE])
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
from vllm_load.metric_table import RTF, TPOT


@dataclass
class RequestRecord:
    api: str
    start: float  # wall clock (time.time()) of the (intended) start
    e2e: float
    ok: bool
    error: str | None = None
    status: int | None = None
    ttft: float | None = None
    chunk_offsets: list[float] = field(default_factory=list)  # seconds from start
    chunk_tokens: list[int] = field(default_factory=list)
    input_tokens_asked: int | None = None
    output_tokens_asked: int | None = None
    max_tokens: int | None = None  # the body's max_tokens (forced, or a cap a server without usage is counted to)
    input_tokens: int | None = None  # from usage (server), else tokenizer
    output_tokens: int | None = None
    tokens_from_usage: bool = False
    continuous_usage: bool = False
    finish_reason: str | None = None
    send_lag: float | None = None  # open loop: actual minus intended send time
    startup: bool = False  # open loop: sent in the first seconds of its schedule (a run's or a sweep step's)
    worker: str = ""
    good: bool | None = None  # met every per-request SLO (None when no such SLO was given)
    step: int | None = None  # sweep step the request started in
    response_id: str | None = None  # the server's id for the request (joins with vLLM's own logs)
    retry_after: float | None = None  # seconds the server asked us to wait (Retry-After on 429/503)
    warmup: bool = False  # started during the warm-up: logged, not measured
    removed: bool = False  # cut when the load shape removed its user mid-run: logged, not measured
    #: the test stopped it mid-request (its user stopped past the drain, or removed): a failure when it is the
    #: run's end, never a connection failure (a request queued at a saturated server has no answer head yet)
    cancelled: bool = False
    abandoned: bool = False  # --cancel: the client gave up on it mid-answer on purpose: logged, in no metric
    steady: bool = False  # started and ended in the run's steady window (plugin/load/steady.py): measured there too
    segment: int | None = None  # --rate-schedule: the segment its intended start fell in: measured there too
    cached_tokens: int | None = None  # prompt tokens the server's prefix cache held (when its usage says)
    #: a replayed turn's prompt tokens in leading blocks an earlier prompt of the run had sent: what a prefix cache
    #: holding them could hit (workload/block_reuse.py); None for a prompt not made of a trace's blocks
    reusable_tokens: int | None = None
    trace_row: int | None = None  # trace replay: the row of the trace this request replayed
    name: str | None = None  # the user's name= for the request: its LLM metrics are grouped under it too
    ttfo: float | None = None  # the answer's first chunk (None: the stream carried no answer)
    #: output tokens spent reasoning, and how they were known: "usage" (the server's completion_tokens_details),
    #: "stream" (the running usage of the reasoning chunks: exact), "tokenizer" (the run's tokenizer over the
    #: reasoning text); None when the stream carried no reasoning
    reasoning_tokens: int | None = None
    reasoning_source: str | None = None
    items: int | None = None  # pooling requests: the inputs (texts, documents) it carried
    late_merged: int = 0  # chunk gaps of 0 made by the native reader's late reads (a late read merged two chunks)
    media: int = 0  # images and audio clips in the prompt: input_tokens_asked counts its text only
    clip_seconds: float | None = None  # speech to text: the clip's length
    graded: str | None = None  # --accuracy: the graded set's kind, and whether the answer was right
    correct: bool | None = None
    valid: bool | None = None  # --response-format: the answer's JSON parsed (and validated against the schema)
    #: a request that offered tools: its answer's tool-call violations (client/tool_integrity.py; [] whole)
    integrity: list[str] | None = None
    #: and its answer's calls as assembled (name, arguments): the evidence the check judged, in the request log
    tool_calls: list[dict[str, Any]] | None = None
    #: a greedy reference prompt's answer (features/reference.py): the prompt's index ("i"), asked alone before the
    #: load or beside it ("alone"), its tokens ("ids") and how they were known ("by": "text", re-tokenized)
    reference: dict[str, Any] | None = None
    target: str | None = None  # --host a,b: the replica it went to (its metrics are grouped under it too)
    headers: dict[str, str] | None = None  # the response header fields --capture-header asked for
    session: str | None = None  # the session id it carried (self.llm.session, --session-header)
    trace_id: str | None = None  # its W3C traceparent's trace id: the server's OpenTelemetry span carries the same
    #: where its time went on the server (vLLM's per-request metrics, seconds): waiting to be scheduled, from its
    #: scheduling to its first token, from its first token to its last; their first two added; and the rest of the
    #: client's TTFT: the network, the API server, a router (None where the server said nothing)
    server_queue: float | None = None
    server_prefill: float | None = None
    server_decode: float | None = None
    server_ttft: float | None = None
    client_overhead: float | None = None

    @property
    def connection_failed(self) -> bool:
        """Failed without any HTTP response: refused, reset before the headers, connect timeout; not one the test
        stopped before its answer's head (counted so, a saturated server's queue at the run's end read as an outage:
        "server unreachable ... 3 attempts, cancelled after 0 tokens")."""
        return not self.ok and not self.status and not self.cancelled

    def chunk_itls(self) -> list[float]:
        o = self.chunk_offsets
        return [o[i] - o[i - 1] for i in range(1, len(o))]

    def token_itls(self) -> list[tuple[float, int]]:
        """(per-token gap, how many tokens had it); the first chunk's extra tokens came with a 0 gap."""
        out: list[tuple[float, int]] = []
        if not self.chunk_offsets:
            return out
        if self.chunk_tokens[0] > 1:
            out.append((0.0, self.chunk_tokens[0] - 1))
        o, n = self.chunk_offsets, self.chunk_tokens
        for i in range(1, len(o)):
            if n[i] > 0:
                out.append(((o[i] - o[i - 1]) / n[i], n[i]))
        return out

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    @property
    def output_tps(self) -> float | None:
        """The request's output tokens per second of its own E2E time."""
        if not self.output_tokens or self.e2e <= 0:
            return None
        return self.output_tokens / self.e2e

    @property
    def rtf(self) -> float | None:
        """Speech to text's real-time factor: the request's E2E over its clip's length (under 1 keeps up)."""
        return self.e2e / self.clip_seconds if self.clip_seconds else None

    def _beyond_asked(self) -> int | None:
        """The server's prompt tokens minus the count made before sending (None without the server's usage)."""
        if self.input_tokens_asked is None or not self.tokens_from_usage or self.input_tokens is None:
            return None
        return self.input_tokens - self.input_tokens_asked

    @property
    def input_drift(self) -> int | None:
        """A text-only prompt's difference from what was asked: the tokenizers disagree."""
        return None if self.media else self._beyond_asked()

    @property
    def media_tokens(self) -> int | None:
        """The prompt tokens of its images and audio: the server's count minus the exact count of the text."""
        return self._beyond_asked() if self.media else None

    def to_json(self) -> dict[str, Any]:
        # a shallow dict: dataclasses.asdict deep-copies every list (1 ms for a 512-token request)
        data = {name: getattr(self, name) for name in _FIELDS}
        offsets = self.chunk_offsets
        # numpy's fixed cost per call (~5 us) is most of a short request's: Python rounds those
        data["chunk_offsets"] = ([round(x, 7) for x in offsets] if len(offsets) < 64
                                 else np.round(np.asarray(offsets, dtype=np.float64), 7).tolist())
        data[TPOT] = self.tpot
        if self.clip_seconds:
            data[RTF] = self.rtf
        if self.media:
            data["media_tokens"] = self.media_tokens
        return data


_FIELDS = tuple(f.name for f in fields(RequestRecord))
