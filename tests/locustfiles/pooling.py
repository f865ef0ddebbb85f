"""A test locustfile (not shipped): a RAG-style user through the public API only: embed a question and its
passages, rerank the passages, and check what came back."""

from locust import task

from vllm_load import LLMUser


class Rag(LLMUser):
    @task
    def retrieve(self) -> None:
        question = self.llm.text(12)
        passages = [self.llm.text(30) for _ in range(4)]
        emb = self.llm.embed([question, *passages], name="embed")
        if emb.ok:
            vectors = [d["embedding"] for d in emb.data["data"]]
            assert len(vectors) == 5 and all(len(v) == len(vectors[0]) > 0 for v in vectors), emb.data
        ranked = self.llm.rerank(question, passages, name="rerank", top_n=2)
        if ranked.ok:
            assert len(ranked.data["results"]) == 2, ranked.data
        scored = self.llm.score(question, passages[:3], name="score")
        if scored.ok:
            assert [d["index"] for d in scored.data["data"]] == [0, 1, 2], scored.data
