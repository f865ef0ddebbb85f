"""Interactive users beside a batch: `locust -f locustfiles/mixed.py --protect interactive [--batch-after 10s]`.

Two classes, as a production fleet serves them: ``interactive`` (short prompts of --input-tokens, short answers of
--output-tokens, vLLM ``priority`` 0, a think time of --think-time between requests) and ``batch`` (long prompts of
--batch-input-tokens, long answers of --batch-output-tokens, ``priority`` 10, no pause), three batch users to each
interactive one. The batch class starts --batch-after seconds into the run: until then the interactive class runs
alone, and ``--protect interactive`` compares its TTFT and ITL p99 then with beside the batch
(``interactive beside the other classes: TTFT p99 +412% …``; SLOs ``ttft_penalty<=50%``, ``itl_penalty<=50%``).

vLLM reads ``priority`` only when it runs ``--scheduling-policy priority`` (lower is served first; the default,
``fcfs``, serves by arrival): the same run against both policies shows what the policy protects.

Written only against vllm-load's public API: copy it to start your own.
"""

from __future__ import annotations

import random
from typing import Any

import gevent
from locust import task

from vllm_load import LLMUser
from vllm_load.workload.lengths import parse_duration, parse_length, parse_seconds

INTERACTIVE_PRIORITY, BATCH_PRIORITY = 0, 10


class Interactive(LLMUser):
    weight = 1
    uses_options = frozenset({"think_time"})

    def on_start(self) -> None:
        self.think = parse_seconds(self.llm.options.think_time, "--think-time")
        self.rng = random.Random()

    @task
    def ask(self) -> None:
        self.llm.chat([{"role": "user", "content": self.llm.text(self.llm.input_tokens())}],
                      max_tokens=self.llm.output_tokens(), name="interactive", priority=INTERACTIVE_PRIORITY)
        gevent.sleep(self.think.sample(self.rng))


class Batch(LLMUser):
    weight = 3
    uses_options = frozenset({"batch_after", "batch_input_tokens", "batch_output_tokens"})

    @classmethod
    def check_options(cls, options: Any) -> None:
        parse_duration(options.batch_after, "--batch-after")  # each raises a one-line UsageError
        parse_length(options.batch_input_tokens, "--batch-input-tokens")
        parse_length(options.batch_output_tokens, "--batch-output-tokens")

    def on_start(self) -> None:
        o = self.llm.options
        self.after = parse_duration(o.batch_after, "--batch-after")
        self.lengths = (parse_length(o.batch_input_tokens, "--batch-input-tokens"),
                        parse_length(o.batch_output_tokens, "--batch-output-tokens"))
        self.rng = random.Random()

    @task
    def work(self) -> None:
        wait = self.after - self.llm.run_seconds()
        if wait > 0:  # the interactive class runs alone until then: its baseline
            gevent.sleep(wait)
        prompt, answer = (spec.sample(self.rng) for spec in self.lengths)
        self.llm.chat([{"role": "user", "content": self.llm.text(prompt)}], max_tokens=answer, name="batch",
                      priority=BATCH_PRIORITY)
