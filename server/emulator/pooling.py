"""The pooling endpoints of vLLM's ``--runner pooling`` (``--convert embed``), in vLLM 0.32's shapes:
``/v1/embeddings``, ``/pooling``, ``/v1/rerank`` (and ``/rerank``, ``/v2/rerank``), ``/v1/score`` (and
``/score``). A real pooling server mounts no generation routes; the emulator serves both.

Each input is its own prefill-only request to the engine, all of a body's at once (vLLM schedules a batch's
inputs as separate requests), so the answer comes after the slowest prefill: the fixed schedule's TTFT plus
its per-token prefill, or the batching engine's cost model and queue. Token counts are vLLM's: each text
with the tokenizer's special tokens; a bi-encoder rerank or score counts the query once.
"""

from __future__ import annotations

import hashlib
import secrets
import struct
import time
from typing import TYPE_CHECKING, Any

import gevent
import orjson

from .generate import observe_finish

if TYPE_CHECKING:
    from .app import Emulator

#: the embedding size (vLLM's is the model's hidden size; the fixture's tiny Llama has 128)
DIM = 128
PATHS = ("/v1/embeddings", "/pooling", "/v1/rerank", "/rerank", "/v2/rerank", "/v1/score", "/score")


class PoolingError(ValueError):
    """A body vLLM would answer 400 (the message says which field)."""


def _texts(value: Any, field: str) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
        raise PoolingError(f"{field} must be a non-empty string or a list of non-empty strings")
    return texts


def vector(text: str) -> list[float]:
    """A deterministic unit-ish vector per text (its SHA-512, stretched): equal texts embed equally."""
    raw = b"".join(hashlib.sha512(f"{i}:{text}".encode()).digest() for i in range(DIM * 2 // 64))
    return [round(v / 32768.0, 6) for v in struct.unpack(f"<{DIM}h", raw[:DIM * 2])]


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    na, nb = sum(x * x for x in a) ** 0.5, sum(y * y for y in b) ** 0.5
    return dot / (na * nb) if na and nb else 0.0


def _prefill(emu: Emulator, ids: list[int]) -> None:
    """One input through the engine as a prefill-only request; returns when its "first token" is due."""
    for em in emu.engine.generate(len(ids), 1, 0):
        observe_finish(emu, len(ids), 0, em.offset, em.offset, em.queue_time, "stop")
        break


def serve(emu: Emulator, path: str, body: dict) -> bytes:
    """The answer to a pooling request at ``path`` (its inputs prefilled first), or PoolingError."""
    model = body.get("model", emu.served[0])
    if path in ("/v1/embeddings", "/pooling"):
        inputs = _texts(body.get("input"), "input")
        encoded = [emu.tok.encode(t, add_special_tokens=True) for t in inputs]
    elif path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        query = body.get("query")
        if not isinstance(query, str) or not query:
            raise PoolingError("query must be a non-empty string")
        inputs = [query, *_texts(body.get("documents"), "documents")]
        encoded = [emu.tok.encode(t, add_special_tokens=True) for t in inputs]
    else:
        first = body.get("queries", body.get("text_1"))
        second = body.get("documents", body.get("text_2"))
        queries, documents = _texts(first, "queries"), _texts(second, "documents")
        if len(queries) not in (1, len(documents)):
            raise PoolingError("queries must be one text or as many as the documents")
        inputs = [*queries, *documents]
        encoded = [emu.tok.encode(t, add_special_tokens=True) for t in inputs]
    tokens = sum(len(ids) for ids in encoded)
    if max(len(ids) for ids in encoded) > emu.max_model_len:
        raise PoolingError(f"an input is longer than the model's maximum context length {emu.max_model_len}")
    gevent.joinall([gevent.spawn(_prefill, emu, ids) for ids in encoded], raise_error=True)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0, "prompt_tokens_details": None,
             "completion_tokens_details": None}
    rid, created = secrets.token_hex(8), int(time.time())
    if path == "/v1/embeddings":
        data = [{"index": i, "object": "embedding", "embedding": vector(t)} for i, t in enumerate(inputs)]
        return orjson.dumps({"id": f"embd-{rid}", "object": "list", "created": created, "model": model,
                             "data": data, "usage": usage})
    if path == "/pooling":
        data = [{"index": i, "object": "pooling", "data": vector(t)} for i, t in enumerate(inputs)]
        return orjson.dumps({"id": f"pooling-{rid}", "object": "list", "created": created, "model": model,
                             "data": data, "usage": usage})
    if path.endswith("rerank"):
        q = vector(inputs[0])
        scored = sorted(((_cosine(q, vector(d)), i, d) for i, d in enumerate(inputs[1:])), reverse=True)
        top_n = body.get("top_n") or len(scored)
        results = [{"index": i, "document": {"text": d, "multi_modal": None}, "relevance_score": s}
                   for s, i, d in scored[:top_n]]
        return orjson.dumps({"id": f"score-{rid}", "model": model,
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}, "results": results})
    pairs = [(queries[0] if len(queries) == 1 else queries[i], d) for i, d in enumerate(documents)]
    data = [{"index": i, "object": "score", "score": _cosine(vector(a), vector(b))} for i, (a, b) in enumerate(pairs)]
    return orjson.dumps({"id": f"score-{rid}", "object": "list", "created": created, "model": model,
                         "data": data, "usage": usage})
