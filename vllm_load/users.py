"""Locust users that stream OpenAI requests: chat completions and completions."""

from __future__ import annotations

from locust import constant, task
from locust.contrib.fasthttp import FastHttpUser
from locust.exception import StopUser

from vllm_load import locust_plugin
from vllm_load.client import build_body, stream_request


class LLMUser(FastHttpUser):
    """Closed loop: each user keeps one streaming request in flight."""

    abstract = True
    api = "chat"
    wait_time = constant(0)
    concurrency = 1
    network_timeout = 600.0
    connection_timeout = 30.0

    @task
    def generate(self) -> None:
        rt = locust_plugin.runtime()
        if rt.draining:  # the run is ending: let in-flight streams finish, start no new one
            raise StopUser()
        prompt, max_tokens = rt.next_request(self.api)
        body = build_body(self.api, rt.opts.model, prompt, max_tokens, ignore_eos=not rt.opts.no_ignore_eos)
        tok = rt.tokenizer
        rt.begin_request()
        stream_request(
            self.client,
            self.api,
            body,
            rt.headers,
            input_tokens_asked=prompt.tokens,
            output_tokens_asked=None if rt.opts.no_ignore_eos else max_tokens,
            worker=rt.worker_id,
            count_output=(lambda text: len(tok.encode(text, add_special_tokens=False))) if tok else None,
            on_record=rt.on_record,
        )


class ChatUser(LLMUser):
    abstract = False
    api = "chat"


class CompletionsUser(LLMUser):
    abstract = False
    api = "completions"
