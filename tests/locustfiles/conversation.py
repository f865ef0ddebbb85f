"""A test locustfile written only against vllm-load's public API (not shipped): --turns-turn conversations,
a first message of --input-tokens tokens, later ones of --turn-input-tokens, answers of 12 tokens, one name
per turn."""

from locust import task

from vllm_load import LLMUser


class Conversation(LLMUser):
    uses_options = frozenset({"turns", "turn_input_tokens"})  # vllm-load's options of multiturn.py it reads
    @task
    def talk(self) -> None:
        history = [{"role": "user", "content": self.llm.text(tokens=self.llm.input_tokens())}]
        turns = self.llm.options.turns
        for turn in range(1, turns + 1):
            reply = self.llm.chat(history, max_tokens=12, name=f"turn {turn}")
            if not reply.ok:
                return
            assert reply.output_tokens == 12 and reply.text and reply.message["role"] == "assistant"
            history += [reply.message, {"role": "user", "content": self.llm.text(tokens=int(self.llm.options.turn_input_tokens))}]
