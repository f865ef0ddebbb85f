"""A test locustfile (not shipped): a user's own Anthropic Messages calls through the public API: one turn with a
system prompt, then a two-turn history whose first answer is the live reply."""

from locust import task

from vllm_load import LLMUser


class Anthropic(LLMUser):
    @task
    def ask(self) -> None:
        first = self.llm.messages([{"role": "user", "content": self.llm.text(40)}], max_tokens=8,
                                  system="be brief", name="one turn")
        if not first.ok:
            return
        history = [{"role": "user", "content": self.llm.text(30)}, {"role": "assistant", "content": first.text},
                   {"role": "user", "content": self.llm.text(20)}]
        self.llm.messages(history, max_tokens=12, name="two turns")
