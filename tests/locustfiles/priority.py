"""A test locustfile written only against vllm-load's public API (not shipped): an interactive class (short
answers, priority 0, a think time between requests) beside a batch class (longer answers, priority 10, none), each
request named by its class; vLLM's ``priority`` rides in the body (lower is handled earlier)."""

from locust import constant, task

from vllm_load import LLMUser


class Interactive(LLMUser):
    weight = 1
    fixed_count = 1
    wait_time = constant(0.2)

    @task
    def ask(self) -> None:
        self.llm.chat([{"role": "user", "content": self.llm.text(tokens=32)}], max_tokens=8, name="interactive",
                      priority=0)


class Batch(LLMUser):
    weight = 3

    @task
    def work(self) -> None:
        self.llm.chat([{"role": "user", "content": self.llm.text(tokens=64)}], max_tokens=32, name="batch",
                      priority=10)
