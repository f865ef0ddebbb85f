"""A test locustfile whose run stops itself once both users' requests are in flight (1 s in at the earliest), as
--stop-over-saturated and an outage stop do (Locust's runner.quit from a greenlet of their own), and stops again
0.5 s later, during that stop's drain, as the -t limit did (a stop at fixed times found, on a busy host, no request
sent yet)."""

import gevent
from locust import events, task

from vllm_load import LLMUser
from vllm_load.plugin.lifecycle.process import generator_of


@events.test_start.add_listener
def _stop_twice(environment, **_kw):
    def stop() -> None:
        gevent.sleep(1.0)
        while (gen := generator_of(environment)) is None or gen.in_flight < 2:
            gevent.sleep(0.05)
        gevent.spawn(environment.runner.quit)  # the first stop: its drain waits for the two requests
        gevent.sleep(0.5)
        environment.runner.quit()  # the second, during the first one's drain

    gevent.spawn(stop)


class Chat(LLMUser):
    @task
    def work(self) -> None:
        self.llm.chat([{"role": "user", "content": self.llm.text(tokens=16)}], max_tokens=30)
