"""A test locustfile whose task raises its own exception at its first turn, before any request, and after every second
request (public API only): every user raised (an open loop deals a run's 6 arrivals to 3 users unevenly, and a raise
only after a request could come after the count had ended the run)."""

from locust import task

from vllm_load import LLMUser


class Raising(LLMUser):
    def on_start(self) -> None:
        self.n = 0

    @task
    def work(self) -> None:
        self.n += 1
        if self.n == 1:  # before any request: every user raises, however soon the count ends the run (beside busy
            raise RuntimeError("boom in the user's own task")  # loops the 6 requests ended it before any raise after)
        reply = self.llm.chat([{"role": "user", "content": self.llm.text(tokens=40)}], max_tokens=8, name="asked")
        assert reply.ok, reply.error
        if self.n % 2 == 1:
            raise RuntimeError("boom in the user's own task")
