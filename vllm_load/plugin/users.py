"""Locust users that stream OpenAI requests: chat completions and completions."""

from __future__ import annotations

import random
import time
from typing import Any

import gevent
from gevent.pool import Pool
from locust import constant, task
from locust.contrib.fasthttp import FastHttpUser

from vllm_load.plugin import listeners  # noqa: F401  (importing it registers the plugin's listeners)
from vllm_load.plugin.state import STATE
from vllm_load.client import rxstamp
from vllm_load.client.stream import StreamCancelled, stream_request
from vllm_load.workload.prompt_pool import PromptError
from vllm_load.client.record import RequestRecord
from vllm_load.plugin.generator import Generator


#: Open loop: requests sent within this many seconds of a schedule's start (a run's, or a sweep step's
#: new rate) have their send lag judged apart from the steady state (connections opening, users spawning).
STARTUP_S = 2.0
#: first wait after a connection failure (closed loop), doubled per further failure up to --retry-backoff-max
BACKOFF_START = 0.05


class LLMUser(FastHttpUser):
    """Closed loop: each user keeps one streaming request in flight. Open loop (--request-rate):
    each user sends at its share of the total rate, whatever the server does, timing each request
    from its intended send time (no coordinated omission)."""

    abstract = True
    api = "chat"
    wait_time = constant(0)
    concurrency = 1
    network_timeout = 600.0
    connection_timeout = 30.0

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        self._failures = 0  # connection failures in a row (backoff)
        if self.client_pool is None:  # a pool the user shares between users stays as given
            rxstamp.install(self.client)  # chunks timed by the kernel's receive stamps, not the loop's wake-ups

    @task
    def generate(self) -> None:
        rt = STATE.generator
        if rt is None or rt.draining:  # no run (the target failed its check), or the run is ending:
            Generator.park()  # start no new request, wait for Locust to stop this user
        if rt.current_rate() > 0:
            self._open_loop(rt)
        else:
            rec = self._one_request(rt, None)
            delay = self._backoff(rec, rt.plan.backoff_max) if rec is not None else 0.0
            if delay > 0:
                gevent.sleep(delay)

    def _backoff(self, rec: Any, cap: float) -> float:
        """Closed loop: how long to wait before the next request. Against a server that is gone, users
        retrying at once made ~900 failed requests/s and a 7 MB log in 16 s; now each user backs off
        from 50 ms, doubling up to ``cap``, with jitter, and starts over at the next success. A 429/503's
        Retry-After is honoured up to ``cap``; other HTTP errors are the server's answers: no wait."""
        if rec.connection_failed:
            self._failures += 1
            return min(cap, BACKOFF_START * 2 ** min(self._failures - 1, 30)) * random.uniform(0.5, 1.0)
        self._failures = 0
        return min(cap, rec.retry_after) if rec.retry_after else 0.0

    def _open_loop(self, rt: Any) -> None:
        arrivals = rt.arrival_process()
        pool = Pool(max(1, int(rt.opts.max_concurrency)))
        next_at = begun = time.perf_counter()
        run_start = next_at - (time.time() - rt.start_wall)  # the run's start on this clock
        try:
            while not rt.draining:
                arrivals.rate = rt.current_rate() / rt.total_users()
                next_at += arrivals.next_gap(next_at - run_start)
                rate_changed = rt.rate_changed
                delay = next_at - time.perf_counter()
                if delay > 0 and rate_changed.wait(delay):
                    # a sweep step changed the rate during a gap drawn at the old one: redraw from now
                    next_at = begun = time.perf_counter()
                    continue
                if rt.draining:
                    break
                pool.wait_available()
                pool.spawn(self._one_request, rt, next_at, begun)
        finally:
            pool.join()
        rt.park()

    def _one_request(self, rt: Any, intended_start: float | None, schedule_start: float | None = None
                     ) -> RequestRecord | None:
        step = rt.step
        rt.begin_request()  # counted from here: a drain waits for it even while it waits for a prompt
        try:
            ready = rt.next_request(self.api)  # built in the prompt thread: body bytes and asked lengths
        except PromptError:  # the pool told the plugin once, which stops the run: no error storm here
            rt.end_request()
            rt.park()
        except BaseException:
            rt.end_request()
            raise
        if rt.draining:  # the run ended while this request waited for its prompt: it was never sent
            rt.end_request()
            return None
        tok = rt.tokenizer
        try:
            rec = stream_request(
                self.client,
                ready,
                rt.headers,
                worker=rt.worker_id,
                intended_start=intended_start,
                count_output=(lambda text: len(tok.encode(text, add_special_tokens=False))) if tok else None,
                step=step,
                # sent (not due) in the schedule's first seconds: a client that fell behind for good sends its
                # early-due requests late, and those count as steady state
                startup=schedule_start is not None and time.perf_counter() - schedule_start < STARTUP_S,
            )
        except StreamCancelled as stop:  # stopped mid-stream: counted as failed, then the stop goes on
            rt.on_record(stop.record)
            raise
        rt.on_record(rec)
        return rec


class ChatUser(LLMUser):
    abstract = False
    api = "chat"


class CompletionsUser(LLMUser):
    abstract = False
    api = "completions"
