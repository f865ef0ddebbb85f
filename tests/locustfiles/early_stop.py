"""A test locustfile whose run stops itself once both users' requests are in flight (1 s in at the earliest), as
--stop-over-saturated and an outage stop do (Locust's runner.quit from a greenlet of their own), while its requests
still run: the -t limit then comes during the drain (a stop at a fixed 1 s found, on a busy host, no request sent yet)."""

import gevent
from locust import events, task

from vllm_load import LLMUser
from vllm_load.plugin.process import generator_of


@events.test_start.add_listener
def _stop_soon(environment, **_kw):
    def stop() -> None:
        gevent.sleep(1.0)
        while (gen := generator_of(environment)) is None or gen.in_flight < 2:
            gevent.sleep(0.05)
        environment.runner.quit()

    gevent.spawn(stop)


class Chat(LLMUser):
    @task
    def work(self) -> None:
        self.llm.chat([{"role": "user", "content": self.llm.text(tokens=16)}], max_tokens=30)
