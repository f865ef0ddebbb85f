"""Agent-like traffic, a tool-calling loop: `locust -f locustfiles/agent.py [--tool-rounds 2]`.

Each task offers the model a tool with the first user message (--input-tokens). The model calls it
(``tool_choice: required``), the user appends a tool result of --tool-result-tokens tokens and the model
goes on, --tool-rounds times; then it answers in text (``tool_choice: none``) with --output-tokens tokens.
Rows: "tool call 1", "tool call 2", …, "answer". Each request re-sends the growing history.

Written only against vllm-load's public API: copy it to start your own.
"""

from __future__ import annotations

import random
from typing import Any

import gevent
from locust import task

from vllm_load import LLMUser, UsageError
from vllm_load.workload.lengths import parse_length, parse_seconds

TOOLS = [{
    "type": "function",
    "function": {
        "name": "search_documents",
        "description": "Search the knowledge base and return the passages that match the query.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}]


class Agent(LLMUser):
    uses_options = frozenset({"tool_rounds", "tool_result_tokens", "think_time"})

    @classmethod
    def check_options(cls, options: Any) -> None:
        if options.tool_rounds < 1:
            raise UsageError(f"--tool-rounds {options.tool_rounds}: an agent task makes at least 1 tool call")
        if parse_length(options.tool_result_tokens, "--tool-result-tokens").low < 1:
            raise UsageError("--tool-result-tokens must be at least 1")
        parse_seconds(options.think_time, "--think-time")

    def on_start(self) -> None:
        o = self.llm.options
        self.result_tokens = parse_length(o.tool_result_tokens, "--tool-result-tokens")
        self.think = parse_seconds(o.think_time, "--think-time")
        self.rng = random.Random()

    @task
    def solve(self) -> None:
        with self.llm.session():  # one task's calls: one session id (--session-header) a router can pin
            self._solve()

    def _solve(self) -> None:
        history: list[dict] = [{"role": "user", "content": self.llm.text(tokens=self.llm.input_tokens())}]
        for call in range(1, self.llm.options.tool_rounds + 1):
            reply = self.llm.chat(history, tools=TOOLS, tool_choice="required", name=f"tool call {call}")
            if not reply.ok:
                return
            if not reply.tool_calls:  # a model that answered instead of calling: the loop is over
                return
            history.append(reply.message)
            gevent.sleep(self.think.sample(self.rng))
            for tc in reply.tool_calls:
                history.append({"role": "tool", "tool_call_id": tc["id"],
                                "content": self.llm.text(tokens=self.result_tokens.sample(self.rng))})
        self.llm.chat(history, tools=TOOLS, tool_choice="none", max_tokens=self.llm.output_tokens(), name="answer")
