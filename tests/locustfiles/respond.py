"""A test locustfile (not shipped): a user's own Responses API calls through the public API: a string input,
then a two-turn input with instructions."""

from locust import task

from vllm_load import LLMUser


class Responder(LLMUser):
    @task
    def ask(self) -> None:
        first = self.llm.respond(self.llm.text(40), max_output_tokens=8, name="string input")
        if not first.ok:
            return
        history = [{"role": "user", "content": self.llm.text(30)}, {"role": "assistant", "content": first.text},
                   {"role": "user", "content": self.llm.text(20)}]
        self.llm.respond(history, max_output_tokens=12, name="messages", instructions="be brief")
