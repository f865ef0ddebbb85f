"""Multi-turn conversations: `locust -f locustfiles/multiturn.py [--turns 3] [--dataset sharegpt.json]`.

Each task is one conversation: a first user message of --input-tokens tokens, --turns replies of
--output-tokens tokens, and between them a user message of --turn-input-tokens tokens after --think-time.
Every turn re-sends the whole history, as a chat client does, so the server's prefix cache can reuse it:
TTFT per turn ("turn 1", "turn 2", …) shows what that reuse buys, and the server's prefix-cache hit rate
(sidecar) and the per-request cached tokens (usage, when the server reports them) show how much was reused.
With --dataset (ShareGPT) the user turns come from the file, the assistant turns from the live replies.

Written only against vllm-load's public API: copy it to start your own.
"""

from __future__ import annotations

import random
from typing import Any

import gevent
from locust import task

from vllm_load import LLMUser, UsageError
from vllm_load.workload.lengths import parse_length, parse_seconds


class Conversation(LLMUser):
    uses_options = frozenset({"turns", "turn_input_tokens", "think_time"})

    @classmethod
    def check_options(cls, options: Any) -> None:
        if options.turns < 1:
            raise UsageError(f"--turns {options.turns}: a conversation has at least 1 turn")
        if parse_length(options.turn_input_tokens, "--turn-input-tokens").low < 1:
            raise UsageError("--turn-input-tokens must be at least 1")
        parse_seconds(options.think_time, "--think-time")

    def on_start(self) -> None:
        o = self.llm.options
        self.turn_input = parse_length(o.turn_input_tokens, "--turn-input-tokens")
        self.think = parse_seconds(o.think_time, "--think-time")
        self.rng = random.Random()

    @task
    def talk(self) -> None:
        with self.llm.session():  # one conversation: one session id (--session-header) a router can pin
            self._talk()

    def _talk(self) -> None:
        o = self.llm.options
        if o.dataset:
            user_turns = self.llm.conversation()[: o.turns]
        else:
            user_turns = [self.llm.text(tokens=self.llm.input_tokens())]
        history = [{"role": "user", "content": user_turns[0]}]
        turns = len(user_turns) if o.dataset else o.turns
        for turn in range(1, turns + 1):
            reply = self.llm.chat(history, max_tokens=self.llm.output_tokens(), name=f"turn {turn}")
            if not reply.ok or turn == turns:
                return
            gevent.sleep(self.think.sample(self.rng))
            nxt = user_turns[turn] if o.dataset else self.llm.text(tokens=self.turn_input.sample(self.rng))
            history += [reply.message, {"role": "user", "content": nxt}]
