"""One streaming OpenAI request, timed chunk by chunk (vLLM's RequestFuncInput -> RequestFuncOutput:
``ReadyRequest`` -> ``RequestRecord``).

Two transports carry it. With the native reader and a plain-HTTP target, a user's own keep-alive
connections (``direct.py``): the native thread sends it, reads its headers and decodes its body into
lines, each with the kernel's stamp of the read that completed it, and Locust's request event is fired
here. Otherwise Locust's FastHttpSession (TLS, the Python reader): lines are read with the raw
geventhttpclient response's ``readline`` (Locust's ``iter_lines`` buffers 1 KB and inflates TTFT),
timed by the receive stamp of the read that completed them (``rxstamp``), or by the clock at read time
where there is none. Either way the Locust row gets the real end-to-end time and the failure reason.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import orjson
from gevent import GreenletExit

from vllm_load.client.exchange import Clock, Exchange, Transport
from vllm_load.client.record import RequestRecord
from vllm_load.client.sse import StreamState, usage_count
from vllm_load.client.tool_integrity import check as check_tools
from vllm_load.client.trace_context import trace_id
from vllm_load.workload.prompts import Prompt
from vllm_load.metric_table import CLIP_SECONDS, E2E, SEND_LAG

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "embeddings": "/v1/embeddings",
         "rerank": "/v1/rerank", "score": "/v1/score", "responses": "/v1/responses",
         "messages": "/v1/messages", "transcription": "/v1/audio/transcriptions",
         "translation": "/v1/audio/translations"}


@dataclass(frozen=True)
class ReadyRequest:
    """A request ready to send, built off the event loop by the prompt thread (vLLM's RequestFuncInput):
    the exact bytes and the lengths asked, against which the server's usage is checked."""

    api: str  # a key of PATHS: "chat", "completions", "embeddings", "rerank", "score"
    body: bytes
    input_tokens: int  # the prompt's length as the server counts it (chat template included)
    output_tokens: int | None  # forced with ignore_eos/min_tokens; None: the model stops on its own
    group: str | None = None  # the metrics' name when the request names none (its model, when a run has several)
    due: float | None = None  # trace replay: seconds after the run's start the request is due
    row: int | None = None  # trace replay: the trace row it replays
    max_tokens: int | None = None  # the body's max_tokens (forced or a cap): a stream far past it is cut
    items: int | None = None  # pooling: the prompts the server runs (texts; a bi-encoder's query and documents)
    #: rerank/score of one query: (input tokens, prompts) as a cross-encoder counts them, the query in every
    #: (query, document) pair, N - 1 more times than a bi-encoder; the server's usage says which it is
    cross: tuple[int, int] | None = None
    media: int = 0  # images and audio clips in the prompt (input_tokens counts its text only)
    graded: str | None = None  # --accuracy: the graded set's kind, and the answer its grader expects
    expected: str | None = None
    content_type: str | None = None  # a body that is not JSON (speech to text's multipart form)
    audio_seconds: float | None = None  # speech to text: the clip's length (the real-time factor's denominator)
    streamed: bool = True  # False: one JSON answer, timed to its last byte (pooling, a whole transcription)
    tools: tuple[Any, ...] = ()  # the tools the body offers: an answer's calls are checked against them
    call_required: bool = False  # its tool_choice asks for a call ("required", or a function named): none is a fault
    #: a replayed turn's prompt tokens in leading blocks an earlier prompt of the run sent (workload/block_reuse.py)
    reusable: int | None = None

    @property
    def path(self) -> str:
        return PATHS[self.api]


class StreamCancelled(GreenletExit):
    """The user was stopped mid-stream: the request is recorded as failed (nothing is lost from the counts)
    before the stop goes on; ``record`` is it."""

    def __init__(self, record: RequestRecord) -> None:
        super().__init__()
        self.record = record


@dataclass(frozen=True)
class BodyDefaults:
    """What every body of a run carries unless a request says otherwise (decided once from the options)."""

    temperature: float = 0.0  # --temperature
    ignore_eos: bool = True  # off with --no-ignore-eos: no ignore_eos/min_tokens (servers that refuse them)
    continuous_usage: bool = True  # off with --no-continuous-usage: usage only at the end
    extra: tuple[tuple[str, Any], ...] = ()  # --extra-body, as items (hashable, frozen)


def ready_request(api: str, model: str, prompt: Prompt, max_tokens: int,
                  defaults: BodyDefaults = BodyDefaults(), group: str | None = None,
                  media: list[dict[str, Any]] | None = None) -> ReadyRequest:
    """The run's workload request (built-in users): the prompt as built, the length asked; ``media`` (chat):
    content parts after the last message's text."""
    content: Any = prompt.messages if api == "chat" else prompt.text
    if media:
        last = content[-1]
        content = [*content[:-1], {**last, "content": [{"type": "text", "text": last["content"]}, *media]}]
    ready = build_request(api, model, content, prompt.tokens, max_tokens, defaults=defaults, group=group)
    return dataclasses.replace(ready, media=len(media)) if media else ready


def build_request(api: str, model: str, content: Any, input_tokens: int, max_tokens: int | None, *,
                  defaults: BodyDefaults = BodyDefaults(), extra: dict[str, Any] | None = None,
                  group: str | None = None) -> ReadyRequest:
    """The one body builder. ``content``: the messages (chat) or the prompt (completions), counted as
    ``input_tokens`` by the caller. With ``max_tokens`` and ``ignore_eos`` the answer's length is forced
    (``min_tokens`` too, so the server's usage can be checked against it); ``max_tokens=None`` lets the
    model stop on its own. ``extra`` keys are merged last (``tools``, ``temperature``, ``model``, vLLM's
    own fields); ``ignore_eos: False`` among them turns the forced length into a cap. The stream and its
    usage stay on whatever ``extra`` says: they are what the measurement reads."""
    body: dict[str, Any] = {"model": model, "stream": True, "temperature": defaults.temperature}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    body["messages" if api == "chat" else "prompt"] = content
    forced = merge_body(body, defaults, extra, max_tokens)
    if forced:
        body["ignore_eos"] = True
        body["min_tokens"] = max_tokens
    body["stream"] = True
    options = body.get("stream_options")
    body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    if defaults.continuous_usage:
        body["stream_options"]["continuous_usage_stats"] = True
    tools = body.get("tools")
    return ReadyRequest(api, orjson.dumps(body), input_tokens, max_tokens if forced else None, group,
                        max_tokens=int_or_none(body.get("max_completion_tokens") or body.get("max_tokens")),
                        tools=tuple(tools) if isinstance(tools, list) else (),
                        call_required=body.get("tool_choice") == "required" or isinstance(body.get("tool_choice"), dict))


def merge_body(body: dict[str, Any], defaults: BodyDefaults, extra: dict[str, Any] | None,
               asked: int | None) -> bool:
    """--extra-body, then the caller's own keys, over ``body``; whether the length ``asked`` is then forced
    (``ignore_eos`` on, and not turned off by ``extra``). Every request type's body goes through it."""
    forced = defaults.ignore_eos and asked is not None
    body.update(defaults.extra)
    if extra:
        forced = forced and extra.get("ignore_eos", True) is not False
        body.update(extra)
    return forced


def int_or_none(value: Any) -> int | None:
    """A body's length cap when it is an int (a bool is not one)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a request belongs in the run, decided by its sender: this process (``worker``), the open loop's
    intended start (None: timed from its send), its sweep step, whether it was sent in its schedule's first
    seconds (``startup``), and its name (None: ``req.group``)."""

    worker: str = ""
    intended_start: float | None = None
    step: int | None = None
    startup: bool = False
    name: str | None = None


def stream_request(transport: Transport, req: ReadyRequest, headers: dict[str, str], at: Placement = Placement(),
                   *, state: StreamState | None = None, own: dict[str, str] | None = None,
                   count_output: Callable[[str], int] | None = None) -> RequestRecord:
    """Send ``req`` over ``transport``, read its SSE stream to the end and return its record (the caller
    records it; the transport reported it to Locust's request event).

    Server faults never raise: they become a failed record with a reason. A user stopped mid-request
    raises ``StreamCancelled`` carrying the failed record, for the caller to record before the stop goes on.
    ``own``: this request's own header fields (after ``headers``, the run's). ``at.name`` groups the request
    (Locust's row and the LLM metrics; default: ``req.group``, else the API's path for Locust's row and no group
    for the LLM metrics); ``state``, when given, is the parser to fill (the caller reads the answer's text and tool
    calls from it).
    """
    name = at.name if at.name is not None else req.group
    clock = Clock.now(at.intended_start)
    state = StreamState() if state is None else state
    state.cap(req.max_tokens)
    headers = typed(req, headers)
    ex = transport.exchange(req.path, req.body, headers, state, clock, name or req.path, own)
    offsets = state.chunk_times
    # the counts as the C reader and the named-event APIs (Messages, Responses) took them from the usage, checked as
    # the Python parser checks its own while it reads (a count no server could mean is no usage)
    state.prompt_tokens, state.completion_tokens = usage_count(state.prompt_tokens), usage_count(state.completion_tokens)
    state.cached_tokens = usage_count(state.cached_tokens)
    tokens_from_usage = state.completion_tokens is not None and state.prompt_tokens is not None
    rec = RequestRecord(
        **exchanged(req, clock, ex, at, name, own),
        ttft=offsets[0] if offsets else None,
        chunk_offsets=offsets,
        chunk_tokens=state.chunk_tokens,
        input_tokens_asked=req.input_tokens,
        output_tokens_asked=req.output_tokens,
        max_tokens=req.max_tokens,
        input_tokens=state.prompt_tokens if tokens_from_usage else req.input_tokens,
        output_tokens=state.completion_tokens if tokens_from_usage else counted_output(state, req.max_tokens),
        tokens_from_usage=tokens_from_usage,
        continuous_usage=state.continuous_usage,
        finish_reason=state.finish_reason,
        response_id=state.response_id,
        cached_tokens=state.cached_tokens,
        reusable_tokens=req.reusable,
        trace_row=req.row,
        ttfo=state.answer_at,
        late_merged=state.late_merged,
        media=req.media,
        abandoned=state.abandoned,
    )
    rec.reasoning_tokens, rec.reasoning_source = reasoning_count(state, count_output)
    if req.tools and rec.ok:  # the answer's tool calls, whole or not (client/tool_integrity.py)
        rec.integrity = check_tools(req.tools, state.calls, getattr(state, "empty_tool_deltas", 0), req.call_required)
        rec.tool_calls = [dict(c, function=dict(c.get("function") or {})) for c in state.calls] or None
    if state.server_metrics and rec.ok:
        server_parts(rec, state.server_metrics)
    if ex.cancelled is not None:
        raise StreamCancelled(rec) from ex.cancelled
    return rec


#: the run's headers with another body's Content-Type, made once per header set and type (a transport builds its
#: request prefix once per header dict it is given: one dict per type, not one per request)
_TYPED: dict[tuple[int, str], tuple[dict[str, str], dict[str, str]]] = {}


def typed(req: ReadyRequest, headers: dict[str, str]) -> dict[str, str]:
    """The run's headers, with the request's body's Content-Type when that is not JSON (a multipart form)."""
    if req.content_type is None:
        return headers
    key = (id(headers), req.content_type)
    known = _TYPED.get(key)
    if known is None or known[0] is not headers:
        known = _TYPED[key] = (headers, {**headers, "Content-Type": req.content_type})
    return known[1]


def server_parts(rec: RequestRecord, metrics: dict) -> None:
    """The server's own split of a request's time (vLLM 0.32's per-request metrics, in ms: queue_time_ms is queued
    to scheduled, time_to_first_token_ms scheduled to first token, generation_time_ms first to last token) onto the
    record, with the client's TTFT beyond the server's: what the network, the API server and a router added."""
    def seconds(key: str) -> float | None:
        value = metrics.get(key)
        return value / 1000.0 if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    rec.server_queue, rec.server_prefill = seconds("queue_time_ms"), seconds("time_to_first_token_ms")
    rec.server_decode = seconds("generation_time_ms")
    if rec.server_queue is not None and rec.server_prefill is not None:
        rec.server_ttft = rec.server_queue + rec.server_prefill
        if rec.ttft is not None:
            rec.client_overhead = rec.ttft - rec.server_ttft


def counted_output(state: StreamState, max_tokens: int | None) -> int:
    """A stream's output tokens when the server gave no usage: its token-bearing deltas (a server streams a
    token a delta; one that merges them is under-counted, never over), at most ``max_tokens``, and exactly
    ``max_tokens`` where it stopped for that length. Counting the text again with the run's tokenizer gave 14 %
    more tokens than were generated, answers above their max_tokens among them."""
    if max_tokens and state.finish_reason == "length":
        return max_tokens
    return min(state.streamed_tokens, max_tokens) if max_tokens else state.streamed_tokens


def exchanged(req: ReadyRequest, clock: Clock, ex: Exchange, at: Placement, name: str | None,
              own: dict[str, str] | None) -> dict[str, Any]:
    """The record's fields every request type fills the same way: when it started, how its exchange went, and
    where it belongs (``at``, its name decided)."""
    return {"api": req.api, "start": clock.start_wall, E2E: ex.e2e, "ok": ex.error is None, "error": ex.error,
            "status": ex.status, "cancelled": ex.cancelled is not None, "retry_after": ex.retry_after,
            "worker": at.worker, "step": at.step,
            "startup": at.startup, "name": name,
            SEND_LAG: None if at.intended_start is None else max(0.0, clock.now_perf - clock.t0),
            "headers": ex.captured, "trace_id": trace_id(own), CLIP_SECONDS: req.audio_seconds}


def reasoning_count(state: StreamState, count: Callable[[str], int] | None) -> tuple[int | None, str | None]:
    """A stream's reasoning tokens and where the number came from. The server's own count when it is one (vLLM
    0.32 reports 0 whatever the model thought: a 0 beside streamed reasoning is not a count); else the running
    usage of the reasoning chunks (exact with continuous usage); else the run's tokenizer over the reasoning
    text (each chunk counted as one token otherwise)."""
    streamed = state.reasoning_streamed if state.continuous_usage else None  # exact: the running usage's
    if state.reasoning_reported:
        if streamed is not None and streamed != state.reasoning_reported:  # the stream's exact count wins, said
            return streamed, "stream"
        return state.reasoning_reported, "usage"
    if not state.reasoning_parts:
        return None, None
    if streamed is not None:
        return streamed, "stream"
    if count is not None:  # the text counted again: never more than the tokens generated (it was, in 9 %)
        generated = state.completion_tokens if state.completion_tokens is not None else state.streamed_tokens
        return min(count("".join(state.reasoning_parts)), generated), "tokenizer"
    return state.reasoning_streamed, "stream"
