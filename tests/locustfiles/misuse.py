"""A test locustfile whose tasks misuse self.llm (not shipped): each call must fail at the call, with vllm-load's
own message, and send nothing."""

from locust import task

from vllm_load import LLMUser


class Misuse(LLMUser):
    @task
    def misuse(self) -> None:
        for call in (lambda: self.llm.chat("a string"),
                     lambda: self.llm.chat({"role": "user", "content": "hi"}),
                     lambda: self.llm.chat([{"content": "no role"}]),
                     lambda: self.llm.chat([{"role": "user", "content": "hi"}], max_tokens=0),
                     lambda: self.llm.chat([{"role": "user", "content": "hi"}], max_tokens=-3),
                     lambda: self.llm.chat([{"role": "user", "content": "hi"}], max_tokens=10**9),
                     lambda: self.llm.complete(["not", "a", "str"])):
            try:
                call()
            except (TypeError, ValueError) as exc:
                print(f"MISUSE {type(exc).__name__}: {exc}", flush=True)
        self.llm.chat([{"role": "user", "content": self.llm.text(tokens=10)}], max_tokens=2, name="fine")
        self.environment.runner.quit()
