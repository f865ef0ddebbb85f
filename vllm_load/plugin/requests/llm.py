"""``self.llm``: what a user's task calls to send LLM requests, measured exactly like the built-in users'.

Every request of a run goes through ``LLM.send``: the built-in users send the run's workload
(``prepared``: the prompt pool's exact-length prompts), a user's own task sends its own messages
(``chat`` / ``complete``, counted first under the run's tokenizer). Either way the request is timed by the
kernel's receive stamps from its send (or, in an open loop, from its intended start), recorded into the
process's stats (per ``name=`` too), the per-request log and Locust's own table, and drained at the stop.
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any, Callable

import gevent
from gevent import getcurrent

from vllm_load.client.exchange import JsonBody, Transport
from vllm_load.client.apis.pooling import POOLING, pooling_request
from vllm_load.client.reply import Reply
from vllm_load.client.apis.messages import MessagesState, messages_request
from vllm_load.client.apis.responses import ResponsesState, responses_request
from vllm_load.client.sse import StreamState
from vllm_load.client.tool_integrity import with_text
from vllm_load.client.trace_context import HEADER, new_traceparent
from vllm_load.client.stream import Placement, ReadyRequest, StreamCancelled, build_request, stream_request
from vllm_load.plugin.load.generator import Generator
from vllm_load.plugin.requests.llm_media import MediaCalls
from vllm_load.plugin.requests.llm_pooling import PoolingCalls
from vllm_load.plugin.requests.llm_speech import SpeechCalls
from vllm_load.plugin.requests.llm_sessions import Due, SessionCalls
from vllm_load.plugin.requests.llm_checks import check_max_tokens, check_messages, split_media
from vllm_load.plugin.requests.request_source import RequestSource
from vllm_load.plugin.lifecycle.process import generator_of
from vllm_load.plugin.requests.transport_session import transport_for
from vllm_load.workload.graded import grade
from vllm_load.workload.prompt_pool import PromptError

#: Open loop: requests sent within this many seconds of a schedule's start (a run's, or a sweep step's
#: new rate) have their send lag judged apart from the steady state (connections opening, users spawning).
STARTUP_S = 2.0
#: the request types whose streams are named events, not chat chunks
STATES: dict[str, type[StreamState]] = {"responses": ResponsesState, "messages": MessagesState}
#: first wait after a connection failure (closed loop), doubled per further failure up to --retry-backoff-max
BACKOFF_START = 0.05


class LLM(PoolingCalls, SpeechCalls, MediaCalls, SessionCalls):
    """The LLM client of one Locust user (``self.llm``)."""

    def __init__(self, user: Any) -> None:
        self._user = user
        self._due: dict[Any, Due] = {}  # greenlet -> its task's intended start (open loop)
        self._sessions: dict[Any, str] = {}  # greenlet -> the session id its requests carry (``session``)
        self._replica_header: str | None = None  # --capture-header's first name, lower-case ('': none): _served_by
        self._failures = 0  # connection failures in a row (closed-loop backoff)
        #: what carries its requests, per replica (chosen at the first request to it; the user's host is set by then)
        self._transports: dict[str | None, Transport] = {}
        #: the replica this user sends to when --host names several (its records are grouped under it)
        self._target: str | None = getattr(user, "llm_target", None)

    # -- what a task reads ------------------------------------------------------------------------------
    @property
    def options(self) -> Any:
        """Locust's parsed options, vllm-load's and a locustfile's own (``@events.init_command_line_parser``)."""
        return self._user.environment.parsed_options

    @property
    def model(self) -> str:
        return self._source().plan.model

    def text(self, tokens: int) -> str:
        """Text of exactly ``tokens`` tokens under the run's tokenizer when it stands as one message's content,
        unique per call (digest words of the run's salt, this process and a sequence number): no two texts
        share a prefix the server could cache."""
        if int(tokens) < 1:
            raise ValueError(f"self.llm.text(tokens={tokens}): ask for at least 1 token")
        return self._source().text(int(tokens))

    def run_seconds(self) -> float:
        """Seconds since the run's start on its one clock (every process's): a class that joins later waits on it."""
        return time.perf_counter() - self._generator().schedule_start()

    def input_tokens(self) -> int:
        """A length drawn from --input-tokens (N, LOW-HIGH, normal:MEAN,STD), seeded per process."""
        src = self._source()
        assert src.input_spec is not None
        return src.input_spec.sample(src.rng)

    def output_tokens(self) -> int:
        """A length drawn from --output-tokens (default 64)."""
        src = self._source()
        assert src.output_spec is not None
        return src.output_spec.sample(src.rng)

    def conversation(self) -> list[str]:
        """The user turns of the next conversation of --dataset (a ShareGPT file: every human turn), the
        first made unique to this run; the assistant turns come from the live replies."""
        return self._source().conversation()

    def count_chat(self, messages: list[dict[str, Any]], tools: list | None = None) -> int:
        """The prompt tokens of these messages as the server counts them (chat template, generation prompt); a
        conversation's next turn counted from its counted history (``workload/history.py``)."""
        src = self._source()
        return src.offload(src.history.count_chat, messages, tools)

    def count_prompt(self, prompt: str) -> int:
        """The prompt tokens of a completion prompt as the server counts them (special tokens included)."""
        src = self._source()
        assert src.tokenizer is not None
        return src.offload(src.tokenizer.count_completion, prompt)

    # -- what a task sends -------------------------------------------------------------------------------
    def chat(self, messages: list[dict[str, Any]], *, max_tokens: int | None = None, name: str | None = None,
             headers: dict[str, str] | None = None, **body: Any) -> Reply:
        """One streaming chat completion. ``max_tokens=N`` asks for exactly N tokens (``ignore_eos``, as the
        built-in users; pass ``ignore_eos=False`` to make it a cap); ``None`` lets the model stop on its own.
        ``body`` keys are merged into the request (``tools``, ``tool_choice``, ``temperature``, ``model`` …)
        over --extra-body; without ``model`` the run's models take turns (--model a,b). A content list with
        images or audio (``self.llm.image()``, ``self.llm.audio()``) is counted by its text exactly; the server's
        count beyond it is the media's (``media_tokens`` in the log and summary)."""
        check_messages(messages)
        src = self._source()
        text_only, media = split_media(messages)
        tokens = self.count_chat(text_only, body.get("tools"))
        check_max_tokens("chat", max_tokens, tokens, src.plan.max_model_len)
        model, group = (body.pop("model"), None) if "model" in body else src.next_model()
        ready = build_request("chat", model, messages, tokens, max_tokens, defaults=src.defaults, extra=body,
                              group=group)
        return self.send(dataclasses.replace(ready, media=media) if media else ready, name=name, headers=headers)

    def complete(self, prompt: str, *, max_tokens: int | None = None, name: str | None = None,
                 headers: dict[str, str] | None = None, **body: Any) -> Reply:
        """One streaming completion of ``prompt``; ``max_tokens`` and ``body`` as in ``chat``."""
        if not isinstance(prompt, str):
            raise TypeError(f"self.llm.complete(prompt): the prompt must be a str, got {type(prompt).__name__}")
        src = self._source()
        tokens = self.count_prompt(prompt)
        check_max_tokens("complete", max_tokens, tokens, src.plan.max_model_len)
        model, group = (body.pop("model"), None) if "model" in body else src.next_model()
        ready = build_request("completions", model, prompt, tokens, max_tokens,
                              defaults=src.defaults, extra=body, group=group)
        return self.send(ready, name=name, headers=headers)

    def respond(self, input: str | list[dict[str, Any]], *, max_output_tokens: int | None = None,  # noqa: A002
                name: str | None = None, headers: dict[str, str] | None = None, **body: Any) -> Reply:
        """One streaming Responses API request (``/v1/responses``): ``input`` is a string or a list of
        messages (``{"role", "content"}``), counted first as vLLM counts a Responses input; ``max_output_tokens=N``
        asks for exactly N tokens (``ignore_eos``), ``None`` lets the model stop. Timed like ``chat`` (TTFT,
        TTFO, every gap, tokens checked against the usage of ``response.completed``)."""
        messages = [{"role": "user", "content": input}] if isinstance(input, str) else input
        check_messages(messages, "respond(input)")
        src = self._source()
        assert src.tokenizer is not None
        if body.get("instructions"):
            counted = [{"role": "system", "content": body["instructions"]}, *messages]
        else:
            counted = messages
        tokens = src.offload(src.tokenizer.count_responses, counted, body.get("tools"))
        check_max_tokens("respond", max_output_tokens, tokens, src.plan.max_model_len)
        model, group = (body.pop("model"), None) if "model" in body else src.next_model()
        return self.send(responses_request(model, input, tokens, max_output_tokens, defaults=src.defaults,
                                           extra=body, group=group), name=name, headers=headers)

    def messages(self, messages: list[dict[str, Any]], *, max_tokens: int, system: str | None = None,
                 name: str | None = None, headers: dict[str, str] | None = None, **body: Any) -> Reply:
        """One streaming Anthropic Messages request (``/v1/messages``): ``messages`` as chat's (roles user and
        assistant, string contents), ``system`` Anthropic's system prompt, ``max_tokens`` its required cap (no
        ``ignore_eos``: the model may stop before it), ``tools`` Anthropic's (``name``, ``description``,
        ``input_schema``). Counted as vLLM counts it (the chat request it converts it to); timed like ``chat``
        (TTFT, TTFO from a thinking block, gaps, the usage of ``message_delta``)."""
        check_messages(messages, "messages(messages)")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ValueError(f"self.llm.messages(max_tokens={max_tokens!r}): the Messages API needs a positive int")
        src = self._source()
        counted = [{"role": "system", "content": system}, *messages] if system else messages
        text_only, _ = split_media(counted)
        tools = [{"type": "function", "function": {"name": t.get("name"), "description": t.get("description"),
                                                   "parameters": t.get("input_schema")}}
                 for t in body.get("tools") or ()]
        tokens = self.count_chat(text_only, tools or None)
        check_max_tokens("messages", max_tokens, tokens, src.plan.max_model_len)
        model, group = (body.pop("model"), None) if "model" in body else src.next_model()
        if system:
            body["system"] = system
        return self.send(messages_request(model, messages, tokens, max_tokens, defaults=src.defaults, extra=body,
                                          group=group), name=name, headers=headers)

    def prepared(self, api: str = "chat") -> ReadyRequest:
        """The next request of the run's own workload (--input-tokens, --output-tokens, --dataset, …), built
        ahead by the prompt thread: what the built-in users send."""
        src = self._source()
        try:
            return src.next_request(api)
        except PromptError:  # the pool told the plugin once, which stops the run: no error storm here
            Generator.park()
            raise  # not reached

    def send(self, ready: ReadyRequest, *, name: str | None = None, headers: dict[str, str] | None = None,
             warmup: bool = False, check: Callable[[Any, StreamState], None] | None = None) -> Reply:
        """Send one ready request and record it: the one request path of every user. ``headers`` go with it
        (over the run's, and over the session's id); ``warmup``: logged, in no number (a session's cache-warming
        turn); ``check(record, stream)``: the caller's look at a whole answer before its record is kept (and logged)."""
        gen = self._generator()
        due = self._due.pop(getcurrent(), None)
        target = self._route(gen)
        gen.begin_request()  # counted from here: a drain waits for it
        state: StreamState | JsonBody = (JsonBody() if ready.api in POOLING or not ready.streamed else
                                         STATES.get(ready.api, StreamState)())
        if isinstance(state, StreamState) and gen.requests is not None:
            state.cancel_after = gen.requests.cancel_after()  # --cancel: this one given up mid-answer, or not
        try:
            transport = self._transports.get(target) or self._open(target)
            own = self._own_headers(gen.session_header, {**gen.class_headers.get(name or "", {}), **(headers or {})})
            at = Placement(worker=gen.worker_id, intended_start=due.intended if due else None, step=gen.step,
                           # sent (not due) in the schedule's first seconds: a client that fell behind for good
                           # sends its early-due requests late, and those count as steady state
                           startup=due is not None and time.perf_counter() - due.schedule_start < STARTUP_S,
                           name=name)
            if isinstance(state, JsonBody):
                rec = pooling_request(transport, ready, gen.headers, at, body=state, own=own)
            else:
                rec = stream_request(transport, ready, gen.headers, at, state=state, own=own,
                                     count_output=gen.requests.count_output if gen.requests else None)
        except StreamCancelled as stop:  # stopped mid-stream: recorded, then the stop goes on
            self._cancelled(gen, stop.record, target)
            raise
        except BaseException:
            gen.end_request(sent=False)
            raise
        rec.target, rec.session = self._served_by(rec, target), self._sessions.get(getcurrent())
        rec.warmup = rec.warmup or warmup
        if rec.ok and isinstance(state, StreamState) and gen.requests is not None:
            self._check_answer(gen.requests, ready, rec, state, check)
        gen.on_record(rec)
        if due is None:  # closed loop: back off from a server that is gone, failing, or asked us to wait
            self._back_off(gen, rec)
        return Reply.of(rec, state) if isinstance(state, StreamState) else Reply.of_json(rec, state.data)

    # -- internals --------------------------------------------------------------------------------------
    @staticmethod
    def _check_answer(src: RequestSource, ready: ReadyRequest, rec: Any, state: StreamState,
                      check: Callable[[Any, StreamState], None] | None) -> None:
        """An answer's content judged: a graded item right or wrong (--accuracy), the JSON asked for valid or not
        (--response-format), and the caller's own check."""
        if rec.integrity is not None and src.tokenizer is not None:  # tools offered: the answer's text checked too
            rec.integrity = with_text(rec.integrity, state.content, "".join(state.reasoning_parts),
                                      src.tokenizer.special_texts)
        if ready.graded is not None:
            rec.graded, rec.correct = ready.graded, grade(ready.graded, state.content, ready.expected or "")
        elif src.response_format is not None:
            rec.valid = src.response_format.valid(state.content)
        if check is not None:
            check(rec, state)

    def _own_headers(self, session_header: str, headers: dict[str, str] | None) -> dict[str, str]:
        """This request's own header fields: a new traceparent (the server's span carries its trace id), the
        session's id, then the caller's (its own trace context stands)."""
        own = {HEADER: new_traceparent()}
        session = self._sessions.get(getcurrent())
        if session is not None:
            own[session_header] = session
        if headers:
            if any(k.lower() == HEADER for k in headers):
                del own[HEADER]
            own.update(headers)
        return own

    def _route(self, gen: Generator) -> str | None:
        """Its own replica (--host a,b), or another while a fault plan drains its own (waiting while every one
        is drained); None with one target."""
        return gen.drained.route(self._target) if self._target is not None else None

    def _open(self, target: str | None) -> Transport:
        transport = self._transports[target] = transport_for(self._user, target)
        return transport

    def _cancelled(self, gen: Generator, rec: Any, target: str | None) -> None:
        rec.target, rec.session = target, self._sessions.get(getcurrent())
        # before the end's drain was over: the load shape removed this user (a ramp down, a new user count; a ramp's
        # last tick can land during the drain on a busy host), which says nothing of the server; past the drain, the
        # server did not finish it in time: a failure
        rec.removed = not gen.drain_over
        gen.on_record(rec)

    def _back_off(self, gen: Generator, rec: Any) -> None:
        delay = self._backoff(rec, gen.plan.backoff_max)
        if delay > 0:
            gen.stats.backoffs += 1
            gen.stats.backoff_ms += int(delay * 1000)
            gevent.sleep(delay)

    def _served_by(self, rec: Any, target: str | None) -> str | None:
        """The replica a request's metrics are grouped under: the one its answer named (--capture-header's first
        name: a fleet behind a router), else the ``target`` it was sent to (--host a,b)."""
        if self._replica_header is None:  # decided once per user: its run's options do not change under it
            names = getattr(self.options, "capture_header", None) or ()
            self._replica_header = str(names[0]).strip().lower() if names else ""
        named = rec.headers.get(self._replica_header) if self._replica_header and rec.headers else None
        return named or target

    def close(self) -> None:
        """Close this user's direct connections (Locust's session closes its own)."""
        for transport in self._transports.values():
            transport.close()

    def _source(self) -> RequestSource:
        """What this process sends (the run's tokenizer, prompt pools, helper thread)."""
        source = self._generator().requests
        assert source is not None
        return source

    def _live_generator(self) -> Generator | None:
        """This process's generator as it is (None: none), without waiting: for code that must not park."""
        return generator_of(self._user.environment)

    def _generator(self) -> Generator:
        """This process's generator; none (the target failed its check) or draining: wait for the stop."""
        gen = generator_of(self._user.environment)
        if gen is None or gen.draining:
            Generator.park()
        assert gen is not None
        return gen

    def _backoff(self, rec: Any, cap: float) -> float:
        """How long a closed-loop user waits before its next request. Against a server that is gone, users
        retrying at once made ~900 failed requests/s and a 7 MB log in 16 s; a 503 without Retry-After was
        retried at ~1,250 requests/s by 2 users. Now after a connection failure, a 5xx or a broken stream
        (a protocol error on a 200), or a 429 without Retry-After, each user backs off from 50 ms, doubling
        up to ``cap``, with jitter, and starts over at the next success. A Retry-After is honoured up to
        ``cap``; a 4xx is the server's answer to this request: no wait."""
        if rec.retry_after:
            self._failures = 0
            return min(cap, rec.retry_after)
        if rec.connection_failed or (not rec.ok and (rec.status >= 500 or rec.status in (200, 429))):
            self._failures += 1
            return min(cap, BACKOFF_START * 2 ** min(self._failures - 1, 30)) * random.uniform(0.5, 1.0)
        self._failures = 0
        return 0.0

    def start_due(self, due: Due) -> None:
        """Open loop: the calling greenlet's first request counts from ``due``."""
        self._due[getcurrent()] = due

    def end_due(self) -> None:
        self._due.pop(getcurrent(), None)
