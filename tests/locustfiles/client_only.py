"""A test locustfile (not shipped) whose LLMUser sends only through self.client: nothing is LLM-timed."""

from locust import task

from vllm_load import LLMUser


class ClientOnly(LLMUser):
    @task
    def models(self) -> None:
        self.client.get("/v1/models")
