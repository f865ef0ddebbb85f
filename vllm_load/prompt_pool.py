"""Prompts prepared ahead, off the event loop.

Building and verifying a prompt is CPU work (a 32k-token prompt takes ~200 ms). Done inline in a
user's greenlet it would freeze every other stream's timing for that long (measured: 830 ms of loop
stall for 5 prompts of 32k tokens). Here a single native thread (gevent's threadpool) builds them
ahead into a bounded queue; the tokenizer's Rust side releases the GIL, so the loop stalls at most
about one GIL switch interval (measured 5.6 ms at 32k tokens, 1 ms at 1k).
"""

from __future__ import annotations

from typing import Any, Callable

import gevent
from gevent.queue import Queue
from gevent.threadpool import ThreadPool


class PromptPool:
    """A bounded queue of ready requests, refilled by one producer thread."""

    def __init__(self, make: Callable[[], Any], size: int = 32) -> None:
        self.make = make
        self.queue: Queue = Queue(maxsize=max(1, size))
        self.threads = ThreadPool(1)  # one thread: the factory's sequence numbers stay ordered
        # several prompts per hand-off: each thread round trip costs the loop a wake-up and a lock
        self.batch = max(1, min(8, size // 4))
        self.error: BaseException | None = None
        self.producer = gevent.spawn(self._produce)

    def _produce(self) -> None:
        while True:
            try:
                items = self.threads.spawn(self._make_batch).get()
            except Exception as exc:  # a bad dataset record, say: surface it to the users
                self.error = exc
                self.queue.put(exc)
                return
            for item in items:
                self.queue.put(item)

    def _make_batch(self) -> list[Any]:
        return [self.make() for _ in range(self.batch)]

    def get(self) -> Any:
        item = self.queue.get()
        if isinstance(item, BaseException):
            self.queue.put(item)  # every user sees the same failure
            raise item
        return item

    def close(self) -> None:
        self.producer.kill(block=False)
        self.threads.kill()
