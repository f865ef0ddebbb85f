"""Prompts prepared ahead, off the event loop.

Building and verifying a prompt is CPU work (a 32k-token prompt takes ~200 ms). Done inline in a
user's greenlet it would freeze every other stream's timing for that long (measured: 830 ms of loop
stall for 5 prompts of 32k tokens). Here a single native thread (gevent's threadpool) builds them
ahead into a bounded queue; the tokenizer's Rust side releases the GIL, so the loop stalls at most
about one GIL switch interval (measured 5.6 ms at 32k tokens, 1 ms at 1k).

A prompt that cannot be built (a length below the template's minimum, a bad record) would fail the
same way for every later request: the pool stops, tells ``on_error`` once (the plugin stops the run
with that one line) and every ``get`` raises ``PromptError`` from then on.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import deque
from typing import Any, Callable

import gevent
import gevent.event
from gevent.threadpool import ThreadPool


#: the token threads' nice value. They share a core with the event loop; at the loop's own priority the
#: kernel let them keep it while the loop waited: at 256 streams turning over 2,500 requests/s on one core,
#: 17 loop stalls over 2 ms in 10 s and p99.9 2.5-3.0 ms, against 1-2 and 1.85 ms at nice 10. When the
#: loop is saturated, prompts then come late and the run says so (the client's own CPU check).
TOKEN_THREAD_NICE = 10


def yield_the_core() -> None:
    """Lower the calling thread's priority below the event loop's (Linux sets it per thread)."""
    if sys.platform.startswith("linux"):
        tid = threading.get_native_id()
        try:  # relative to what it inherited (a run under `nice` stays below it)
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + TOKEN_THREAD_NICE))
        except OSError:
            pass


def token_thread(yield_now: bool = True) -> ThreadPool:
    """One native thread for work off the event loop (prompts, users' token work, the request log), at a lower
    priority than the loop (``yield_now=False``: from when its owner says, see ``PromptPool``)."""
    pool = ThreadPool(1)
    if yield_now:
        pool.spawn(yield_the_core)  # its first task: one thread, so every later one runs at that priority
    return pool


class PromptError(Exception):
    """The pool cannot build prompts any more; the message is the first failure's, one line."""


#: what ``get`` returns once ``make`` raised StopIteration (a trace's last row was handed out)
END = object()


class PromptPool:
    """Ready items in a deque, refilled by one producer thread in batches of ``batch`` or more.

    A ``get`` pops one item (O(1), no switch). A gevent Queue bounded at the pool's size woke the blocked
    producer greenlet at every get to put one more item, and handed the thread batches of one or two.
    A refill starts once ``batch`` items are missing (8 at the default size): the thread holds the GIL while
    it builds, and refills of half the pool (16) showed more loop stalls over 2 ms in turnover.py (11-12
    against 4-8 in 5 s windows, noisy); 8 at a time costs the loop one hand-off per 8 requests."""

    def __init__(self, make: Callable[[], Any], size: int = 32,
                 on_error: Callable[[BaseException], None] | None = None) -> None:
        self.make = make
        self.size = max(1, size)
        self.items: deque[Any] = deque()  # ready items; END or the failure stays last, for every later get
        self.batch = max(1, min(8, self.size // 4))  # the first batch, and the least a refill makes
        self.low = self.size - self.batch  # at most this many left: the producer refills up to size
        # one thread: the factory's sequence numbers stay ordered. Its first batch (the tokenizer's word list,
        # the template probes) runs at the loop's priority, before anything is timed: at nice 10 beside 10 CPU
        # hogs on 2 cores it got ~1 % of a core, and a 12 s run of `--processes 2` sent nothing.
        self.threads = token_thread(yield_now=False)
        self.error: BaseException | None = None
        self.on_error = on_error
        self.ready = gevent.event.Event()  # set once the first prompts (or the failure) are in the pool
        # the gets that found the pool empty, in their order: each is handed an item in turn, and a later get
        # waits behind them (a newcomer taking the refill first gave a seeded run's lengths to other arrivals)
        self.waiting: deque[gevent.event.Event] = deque()
        self.wanted = gevent.event.Event()  # set when the pool fell to its low mark
        self.producer = gevent.spawn(self._produce)

    def _produce(self) -> None:
        first = True
        while True:
            count = self.batch if first else self.size - len(self.items)
            items = self.threads.spawn(self._make_batch, count).get()
            if first:
                self.threads.spawn(yield_the_core)
            if isinstance(items, tuple):  # the source ended: what was made, then END for every later get
                self.items.extend(items)
                self.items.append(END)
                self._filled()
                return
            if isinstance(items, Exception):  # a bad dataset record, a length below the minimum: fatal for the run
                self.error = items
                self.items.append(items)
                self._filled()
                if self.on_error is not None:
                    self.on_error(items)
                return
            self.items.extend(items)
            self._filled()
            first = False
            if len(self.items) > self.low:
                self.wanted.clear()
                self.wanted.wait()

    def _filled(self) -> None:
        self._hand_on()
        self.ready.set()

    def _hand_on(self) -> None:
        """The first waiting get's turn, when there is an item (or the end) for it."""
        if self.waiting and self.items:
            self.waiting[0].set()

    def _make_batch(self, count: int) -> list[Any] | tuple | Exception:
        made: list[Any] = []
        try:
            for _ in range(count):
                made.append(self.make())
            return made
        except StopIteration:
            return tuple(made)
        except Exception as exc:  # returned, not raised: gevent's threadpool would print its traceback
            return exc

    def get(self) -> Any:
        """The next item, in the order the gets came: the n-th get of a seeded run has the n-th draw."""
        items = self.items
        if not items or self.waiting:
            self._wait_turn()
        try:
            item = items[0]
            if item is END:  # stays: every user sees the end
                return END
            if isinstance(item, BaseException):  # stays: every user sees the same failure
                # a new exception each time: re-raising the stored one would grow its traceback by a frame
                # group per raise (measured: 55 MB of log in 20 s)
                raise PromptError(str(item).splitlines()[0] if str(item) else type(item).__name__) from None
            items.popleft()
            if len(items) <= self.low and not self.wanted.is_set():
                self.wanted.set()
            return item
        finally:  # the next waiting get's turn, if there is an item (or the end) for it
            self._hand_on()

    def _wait_turn(self) -> None:
        turn = gevent.event.Event()
        self.waiting.append(turn)
        if not self.items:
            self.wanted.set()
        try:
            turn.wait()
        except BaseException:  # killed while waiting (a user stopped): the next in line is not held by it
            self.waiting.remove(turn)
            self._hand_on()
            raise
        assert self.waiting[0] is turn
        self.waiting.popleft()

    def close(self) -> None:
        self.producer.kill(block=False)
        self.threads.kill()
