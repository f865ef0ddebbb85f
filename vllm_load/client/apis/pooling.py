"""Non-streaming pooling requests (embeddings, rerank, score): one JSON answer, timed from the send to its
last byte, its input tokens checked against the server's usage.

vLLM serves them with ``--runner pooling`` (``--convert embed`` for embeddings and bi-encoder rerank/score,
``--convert classify`` with one label for cross-encoders). Their usage has ``prompt_tokens`` only (rerank
has no ``completion_tokens``): the record has no output tokens, and TTFT, ITL and TPOT do not apply.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import orjson

from vllm_load.client.exchange import Clock, JsonBody, Transport
from vllm_load.client.record import RequestRecord
from vllm_load.client.stream import BodyDefaults, Placement, ReadyRequest, StreamCancelled, exchanged, merge_body, typed

#: the pooling APIs and how many inputs a body carries (for inputs/s)
POOLING = frozenset({"embeddings", "rerank", "score"})


def embeddings_request(model: str, inputs: list[str], input_tokens: int, *,
                       defaults: BodyDefaults = BodyDefaults(), extra: dict[str, Any] | None = None,
                       group: str | None = None) -> ReadyRequest:
    """``POST /v1/embeddings`` of ``inputs`` (each a text), counted together as ``input_tokens`` (each with the
    tokenizer's special tokens, as vLLM counts a prompt)."""
    return _pooling("embeddings", {"input": inputs}, len(inputs), model, input_tokens, defaults, extra, group)


def rerank_request(model: str, query: str, documents: list[str], input_tokens: int | None, *,
                   defaults: BodyDefaults = BodyDefaults(), extra: dict[str, Any] | None = None,
                   group: str | None = None, query_tokens: int | None = None) -> ReadyRequest:
    """``POST /v1/rerank``: ``query`` against ``documents``. ``input_tokens``: what a bi-encoder counts (the
    query once, each document once); with ``query_tokens`` a cross-encoder's count (the query in every pair) is
    known too, and the server's usage picks."""
    req = _pooling("rerank", {"query": query, "documents": documents}, len(documents) + 1, model, input_tokens,
                   defaults, extra, group)
    return _with_cross(req, len(documents), query_tokens)


def score_request(model: str, queries: str | list[str], documents: list[str], input_tokens: int | None, *,
                  defaults: BodyDefaults = BodyDefaults(), extra: dict[str, Any] | None = None,
                  group: str | None = None, query_tokens: int | None = None) -> ReadyRequest:
    """``POST /v1/score``: each document scored against the query (or query i against document i); counted as
    ``rerank``."""
    pairs = len(documents)
    req = _pooling("score", {"queries": queries, "documents": documents},
                   pairs + (1 if isinstance(queries, str) else len(queries)), model, input_tokens, defaults, extra,
                   group)
    return _with_cross(req, pairs, query_tokens if isinstance(queries, str) else None)


def _with_cross(req: ReadyRequest, pairs: int, query_tokens: int | None) -> ReadyRequest:
    if query_tokens is None or req.input_tokens is None:
        return req
    return replace(req, cross=(req.input_tokens + (pairs - 1) * query_tokens, pairs))


def _pooling(api: str, fields: dict[str, Any], items: int, model: str, input_tokens: int | None,
             defaults: BodyDefaults, extra: dict[str, Any] | None, group: str | None) -> ReadyRequest:
    """A pooling body: the model and the API's fields, --extra-body and ``extra`` merged over them."""
    body: dict[str, Any] = {"model": model, **fields}
    merge_body(body, defaults, extra, None)
    return ReadyRequest(api, orjson.dumps(body), input_tokens, None, group, items=items)


def pooling_request(transport: Transport, req: ReadyRequest, headers: dict[str, str], at: Placement = Placement(),
                    *, body: JsonBody | None = None, own: dict[str, str] | None = None) -> RequestRecord:
    """Send a pooling request, read its JSON answer and return its record (``body`` keeps the parsed answer
    for the caller). Faults become a failed record; a stopped user raises ``StreamCancelled``."""
    name = at.name if at.name is not None else req.group
    clock = Clock.now(at.intended_start)
    body = JsonBody() if body is None else body
    headers = typed(req, headers)
    ex = transport.exchange(req.path, req.body, headers, body, clock, name or req.path, own)
    usage = (body.data or {}).get("usage") if ex.error is None else None
    prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    from_usage = isinstance(prompt, int) and not isinstance(prompt, bool)
    asked, items = req.input_tokens, req.items
    if from_usage and req.cross is not None and prompt == req.cross[0] != asked:  # a cross-encoder answered
        asked, items = req.cross
    rec = RequestRecord(
        **exchanged(req, clock, ex, at, name, own),
        input_tokens_asked=asked,
        input_tokens=prompt if from_usage else req.input_tokens,
        output_tokens=None,  # none generated: no output-token row, rate or TPOT
        tokens_from_usage=from_usage,
        response_id=(body.data or {}).get("id") if body.data else None,
        items=items,
    )
    if ex.cancelled is not None:
        raise StreamCancelled(rec) from ex.cancelled
    return rec


def count_each(count: Callable[[str], int], inputs: list[str]) -> list[int]:
    """Each input's prompt tokens as vLLM counts a pooling input: on its own, special tokens included."""
    return [count(text) for text in inputs]


def count_inputs(count: Callable[[str], int], inputs: list[str]) -> int:
    """The prompt tokens of a batch of inputs (``count_each``, added)."""
    return sum(count_each(count, inputs))
