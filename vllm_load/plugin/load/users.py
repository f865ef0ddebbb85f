"""Locust users that stream OpenAI requests: ``LLMUser`` (write your own tasks with ``self.llm``) and the
built-in ``ChatUser`` / ``CompletionsUser``, which are users of that same API.

Closed loop (the default): Locust's own: a task, the user's ``wait_time``, the next task; every request
counts from its send. Open loop (``--request-rate``): each arrival of this user's share of the run's rate
starts one task in a greenlet of its own, whatever the server does, and the task's first request counts
from the arrival's intended time (no coordinated omission); later requests of the same task (a
conversation's next turns) count from their own sends.
"""

from __future__ import annotations

import functools
import random
import logging
import time
import traceback
from typing import Any, Callable

import gevent
from gevent.pool import Pool
from locust import constant, task
from locust.contrib.fasthttp import FastHttpUser
from locust.exception import StopUser
from locust.user.task import TaskSet

from vllm_load.plugin.lifecycle import listeners  # noqa: F401  (importing it registers the plugin's listeners)
from vllm_load.plugin.load.generator import Generator
from vllm_load.plugin.load.open_loop import ScheduleEnd
from vllm_load.plugin.requests.llm import LLM, Due
from vllm_load.plugin.lifecycle.process import generator_of
from vllm_load.client import rxstamp
from vllm_load.workload.prompt_pool import END

logger = logging.getLogger(__name__)


def _run(task_: Any, user: Any) -> None:
    if isinstance(task_, type) and issubclass(task_, TaskSet):
        task_(user).run()
    else:
        task_(user)


def _dispatching(task_: Any) -> Callable[[Any], None]:
    """Wrap one of an LLMUser's tasks: in a closed loop it runs as Locust runs it; once the run has an open-loop
    rate, the first call becomes the user's arrival loop, which starts the (unwrapped) tasks itself."""
    if getattr(task_, "_vllm_load_inner", None) is not None:
        return task_

    def run(user: Any) -> None:
        gen = generator_of(user.environment)
        if gen is not None and not gen.draining and gen.open_loop():
            user._open_loop(gen)
        else:
            _run(task_, user)

    if not isinstance(task_, type):
        functools.update_wrapper(run, task_)
    run._vllm_load_inner = task_  # type: ignore[attr-defined]
    return run


class LLMUser(FastHttpUser):
    """Subclass it and write tasks that call ``self.llm`` (``text``, ``chat``, ``complete``, ``send``)."""

    abstract = True
    wait_time = constant(0)
    concurrency = 1
    network_timeout = 600.0
    connection_timeout = 30.0
    #: chunks timed by the kernel's receive stamps (False: when the loop read them, for comparison)
    kernel_stamps = True
    #: the locustfile-specific options (--turns, --sweep, …; ``Option.locustfiles``) this class reads: given to
    #: a run none of whose classes reads them, they are refused instead of being silently ignored
    uses_options: frozenset[str] = frozenset()

    @classmethod
    def check_options(cls, options: Any) -> None:
        """Called once at start-up with Locust's parsed options: raise ``vllm_load.UsageError`` for bad input
        (one line, exit 2, before any load). Override it to check a locustfile's own options."""

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        cls.tasks = [_dispatching(t) for t in cls.tasks]

    def __init__(self, environment: Any) -> None:
        gen = generator_of(environment)
        #: --host a,b: the replica this user sends every request to (None: the run's one target)
        self.llm_target = gen.target_for_new_user() if gen is not None else None
        if self.llm_target is not None:
            self.host = self.llm_target  # before Locust's session is made for it
        super().__init__(environment)
        self.llm = LLM(self)
        if self.client_pool is None and self.kernel_stamps:  # a pool the user shares between users stays as given
            rxstamp.install(self.client)  # chunks timed by the kernel's receive stamps, not the loop's wake-ups

    def run(self) -> None:
        try:
            super().run()
        finally:  # however the user ends (stopped, killed, a fault): its direct connections close with it
            self.llm.close()

    def _open_loop(self, gen: Generator) -> None:
        """This user's arrivals, each starting one task in its own greenlet (at most --max-concurrency at once),
        until the run drains (then the user waits for Locust's stop, which ends the arrivals too). A sweep
        step that changes the rate wakes a gap drawn at the old rate and redraws."""
        pool = Pool(max(1, int(gen.opts.max_concurrency)))
        tasks = [getattr(t, "_vllm_load_inner", t) for t in self.tasks]
        try:
            while not gen.draining:
                rate_changed = gen.rate_changed
                # the run's next arrival of this process's share, on the run's epoch (a re-estimated offset, or
                # a sweep step's new rate, is in the next one taken)
                due = Due(gen.take_arrival(), gen.schedule_start())
                delay = due.intended - time.perf_counter()
                if delay > 0 and rate_changed.wait(delay):
                    continue  # a sweep step's new rate: its own sequence from its start
                if gen.draining:
                    break
                pool.wait_available()
                pool.spawn(self._arrival, functools.partial(_run, random.choice(tasks), self), due, gen.schedule_end)
            gen.park()  # the drain waits for the requests in flight; the arrivals' next requests park
        finally:
            # Locust's stop kills this greenlet once: the arrivals go with it (a join here would wait for ever
            # on an arrival parked at the drain, and Locust's stop with it)
            pool.kill()

    def _arrival(self, work: Callable[[], Any], due: Due, schedule_end: ScheduleEnd | None = None) -> None:
        """One arrival (open loop, or a trace's row): its work, whose first request counts from ``due``, with an
        error reported as Locust reports a task's (and a rate schedule's end told when it ended)."""
        self.llm.start_due(due)
        try:
            work()
        except StopUser:
            pass  # ends this arrival's task; the arrivals go on
        except Exception as exc:
            self.environment.events.user_error.fire(user_instance=self, exception=exc, tb=exc.__traceback__)
            logger.error("%s\n%s", exc, traceback.format_exc())
        finally:
            self.llm.end_due()
            if schedule_end is not None:
                schedule_end.task_ended()


class _WorkloadUser(LLMUser):
    """Sends the run's own workload (--input-tokens, --output-tokens, --dataset …) on one API."""

    abstract = True
    api = "chat"

    @task
    def generate(self) -> None:
        gen = generator_of(self.environment)
        if gen is not None and gen.opts.trace:
            self._replay(gen)
        self.llm.send(self.llm.prepared(self.api))

    def _replay(self, gen: Generator) -> None:
        """--trace: this process's rows, each sent at its due time from the run's start (several users share
        the rows in order), each timed from that intended start; then wait for the run's end."""
        pool = Pool(max(1, int(gen.opts.max_concurrency)))
        run_start = gen.schedule_start()  # the run's epoch: every process's rows on one clock
        try:
            while not gen.draining:
                ready = self.llm.prepared(self.api)
                if ready is END or gen.draining:
                    break
                run_start = gen.schedule_start()  # the epoch as the offset was last estimated
                due = run_start + (ready.due or 0.0)
                delay = due - time.perf_counter()
                if delay > 0:
                    gevent.sleep(delay)
                if gen.draining:
                    break
                pool.wait_available()
                pool.spawn(self._arrival, functools.partial(self._send_row, gen, ready), Due(due, run_start))
            gen.park()
        finally:
            pool.kill()

    def _send_row(self, gen: Generator, ready: Any) -> None:
        gen.requests.trace_row_sent()
        self.llm.send(ready)


class ChatUser(_WorkloadUser):
    abstract = False
    api = "chat"
    uses_options = frozenset({"images_per_request", "image_size", "audio_seconds", "images_from", "audio_from",
                              "videos_per_request", "video_frames", "video_size", "videos_from"})


class CompletionsUser(_WorkloadUser):
    abstract = False
    api = "completions"


class ResponsesUser(_WorkloadUser):
    """/v1/responses (the Responses API), streamed: the run's workload as input items, timed like chat."""

    abstract = False
    api = "responses"


class MessagesUser(_WorkloadUser):
    """/v1/messages (Anthropic's Messages API, as vLLM serves it), streamed: the run's workload as messages (the
    system prompt in ``system``), timed like chat; the answer is at most --output-tokens long (no ignore_eos)."""

    abstract = False
    api = "messages"


class TranscriptionUser(_WorkloadUser):
    """/v1/audio/transcriptions, streamed: a unique clip of --audio-seconds (or --audio-from's next file) per
    request, timed like chat (the first text, every gap), its real-time factor the E2E over the clip's length."""

    abstract = False
    api = "transcription"
    uses_options = frozenset({"audio_seconds", "audio_from"})


class EmbeddingsUser(_WorkloadUser):
    """/v1/embeddings: --batch-size unique texts of --input-tokens each per request."""

    abstract = False
    api = "embeddings"
    uses_options = frozenset({"batch_size"})


class RerankUser(_WorkloadUser):
    """/v1/rerank: a unique query against --batch-size unique documents, each of --input-tokens."""

    abstract = False
    api = "rerank"
    uses_options = frozenset({"batch_size"})
