"""``self.llm``'s pooling calls (embeddings, rerank, score): each input counted under the run's tokenizer first, off
the event loop, then sent through the one request path (``LLM.send``)."""

from __future__ import annotations

from typing import Any

from vllm_load.client.apis.pooling import count_each, count_inputs, embeddings_request, rerank_request, score_request
from vllm_load.client.reply import Reply


class PoolingCalls:
    """A part of ``LLM`` (``plugin/requests/llm.py``): it needs ``_source()`` and ``send()`` from there."""

    _source: Any
    send: Any

    def embed(self, inputs: str | list[str], *, name: str | None = None, headers: dict[str, str] | None = None,
              **body: Any) -> Reply:
        """One ``/v1/embeddings`` request of ``inputs`` (a text or a list of texts), each counted under the run's
        tokenizer first (as vLLM counts it: special tokens included) and checked against the server's usage;
        ``Reply.data`` is the answer (its ``data[i].embedding``). ``body`` keys merge into the request
        (``encoding_format``, ``dimensions``, ``model`` …)."""
        texts = [inputs] if isinstance(inputs, str) else inputs
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise TypeError("self.llm.embed(inputs): give a str or a non-empty list of str")
        src = self._source()
        tokens = src.offload(count_inputs, src.tokenizer.count_completion, texts)
        model, group = (body.pop("model"), None) if "model" in body else src.next_model()
        return self.send(embeddings_request(model, texts, tokens, defaults=src.defaults, extra=body, group=group),
                         name=name, headers=headers)

    def rerank(self, query: str, documents: list[str], *, name: str | None = None,
               headers: dict[str, str] | None = None, **body: Any) -> Reply:
        """One ``/v1/rerank`` request: ``documents`` ranked against ``query`` (``Reply.data["results"]``). The
        input tokens are checked as the server's usage says it counted them: a bi-encoder the query once and each
        document once, a cross-encoder the query in every (query, document) pair."""
        if not isinstance(query, str) or not isinstance(documents, list) or not documents \
                or not all(isinstance(d, str) for d in documents):
            raise TypeError("self.llm.rerank(query, documents): give a str and a non-empty list of str")
        src = self._source()
        counts = src.offload(count_each, src.tokenizer.count_completion, [query, *documents])
        model, group = (body.pop("model"), None) if "model" in body else src.next_model()
        return self.send(rerank_request(model, query, documents, sum(counts), defaults=src.defaults, extra=body,
                                        group=group, query_tokens=counts[0]), name=name, headers=headers)

    def score(self, queries: str | list[str], documents: list[str], *, name: str | None = None,
              headers: dict[str, str] | None = None, **body: Any) -> Reply:
        """One ``/v1/score`` request: each document scored against the query (a str), or query i against document i
        (a list as long as ``documents``); ``Reply.data["data"][i]["score"]``. Input tokens are checked as a
        bi-encoder counts them (each text once), as ``rerank``."""
        qs = [queries] if isinstance(queries, str) else queries
        if not isinstance(qs, list) or not qs or not all(isinstance(q, str) for q in qs) \
                or not isinstance(documents, list) or not documents or not all(isinstance(d, str) for d in documents) \
                or len(qs) not in (1, len(documents)):
            raise TypeError("self.llm.score(queries, documents): give a str (or as many str as documents) and a "
                            "non-empty list of str")
        src = self._source()
        counts = src.offload(count_each, src.tokenizer.count_completion, [*qs, *documents])
        model, group = (body.pop("model"), None) if "model" in body else src.next_model()
        return self.send(score_request(model, queries, documents, sum(counts), defaults=src.defaults, extra=body,
                                       group=group, query_tokens=counts[0]), name=name, headers=headers)

