"""A test locustfile whose run stops itself 1 s in, as --stop-over-saturated and an outage stop do (Locust's
runner.quit from a greenlet of their own), while its requests still run: the -t limit then comes during the drain."""

import gevent
from locust import events, task

from vllm_load import LLMUser


@events.test_start.add_listener
def _stop_soon(environment, **_kw):
    gevent.spawn_later(1.0, environment.runner.quit)


class Chat(LLMUser):
    @task
    def work(self) -> None:
        self.llm.chat([{"role": "user", "content": self.llm.text(tokens=16)}], max_tokens=30)
