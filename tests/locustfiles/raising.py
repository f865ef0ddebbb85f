"""A test locustfile whose task raises its own exception after its first request and every second one after (public
API only): any user that sent one raised (an open loop deals a run's 6 arrivals to 3 users unevenly, and after every
second request left a run with none raised)."""

from locust import task

from vllm_load import LLMUser


class Raising(LLMUser):
    def on_start(self) -> None:
        self.n = 0

    @task
    def work(self) -> None:
        self.n += 1
        reply = self.llm.chat([{"role": "user", "content": self.llm.text(tokens=40)}], max_tokens=8, name="asked")
        assert reply.ok, reply.error
        if self.n % 2 == 1:
            raise RuntimeError("boom in the user's own task")
