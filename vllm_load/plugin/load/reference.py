"""--reference N's sender (the feature, its verdict and its options, is ``features/reference.py``): N prompts of the
run's input length, asked at temperature 0 for --reference-tokens tokens each, first alone (one at a time, before any
user starts) and then again and again beside the load, one at a time, until the run ends. Each answer's tokens go
into its request's record (``reference`` in the log): the feature compares every answer beside the load with the same
prompt's answer alone when the run ends, by the log.

Why alone first: a greedy answer that changes with the batch it ran in (lm-evaluation-harness #4019, vLLM's
batch-invariant mode) is only seen against the same prompt with nothing beside it. The alone answers are logged as a
warm-up's are (in no number); those beside the load are measured as any request, under the name ``reference``."""

from __future__ import annotations

import time
from typing import Any

import gevent

from vllm_load.client.stream import build_request
from vllm_load.plugin.lifecycle.run import Run
from vllm_load.plugin.load.users import LLMUser

#: the name the reference requests are measured under
NAME = "reference"


class _Sender(LLMUser):
    """Not one of the load's users: a user object whose ``self.llm`` sends the reference prompts."""

    abstract = True


def before_load(environment: Any, run: Run) -> gevent.Greenlet | None:
    """The alone pass (blocking: no user has started), then a greenlet that asks the prompts beside the load."""
    opts = environment.parsed_options
    count = int(getattr(opts, "reference", 0) or 0)
    gen = run.generator
    if not count or gen is None or gen.requests is None:
        return None
    _Sender.host = gen.plan.host  # as Locust gives the load's classes their host (--host a,b: its round robin's)
    sender = _Sender(environment)
    gen.users_made -= 1  # --host a,b: the replicas' round robin is the load's users'
    llm = sender.llm
    prompts = [[{"role": "user", "content": llm.text(tokens=max(1, llm.input_tokens()))}] for _ in range(count)]
    tokens = int(opts.reference_tokens)
    started = time.perf_counter()
    answered = sum(_ask(sender, i, p, tokens, alone=True).ok for i, p in enumerate(prompts))
    print(f"vllm-load: reference: {answered} of {count} prompts answered alone at temperature 0 "
          f"({time.perf_counter() - started:.1f} s) before the load; asked again beside it", flush=True)
    return gevent.spawn(_beside, sender, prompts, tokens)


def _beside(sender: _Sender, prompts: list[list[dict[str, str]]], tokens: int) -> None:
    """The prompts in turn, one at a time, until the run ends (a drain parks the next send; the run kills this)."""
    while True:
        for i, messages in enumerate(prompts):
            _ask(sender, i, messages, tokens, alone=False)


def _ask(sender: _Sender, index: int, messages: list[dict[str, str]], tokens: int, *, alone: bool) -> Any:
    llm = sender.llm
    src = llm._source()
    ready = build_request("chat", src.plan.model, messages, llm.count_chat(messages), tokens, defaults=src.defaults,
                          extra={"temperature": 0})
    tokenizer = src.tokenizer
    assert tokenizer is not None

    def note(rec: Any, state: Any) -> None:
        ids = src.offload(lambda text: list(tokenizer.encode(text, add_special_tokens=False)), state.content)
        rec.reference = {"i": index, "alone": alone, "ids": ids, "by": "text"}

    return llm.send(ready, name=NAME, warmup=alone, check=note)
