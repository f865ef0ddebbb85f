"""The prompt pool hands out prepared items in order and surfaces a producer failure to every user."""

import itertools
import sys
import traceback

import pytest

from vllm_load.errors import UsageError
from vllm_load.workload.prompt_pool import PromptError, PromptPool


class NativeGate:
    """Holds the producer's native thread until the test opens it. A gevent Event waited on in that thread raised
    gevent's "This operation would block forever" (its hub had nothing else to run) whenever the thread reached it
    before the test set it: the fast selection's flake of issue 76. A native lock blocks the thread itself."""

    def __init__(self) -> None:
        import gevent.monkey

        self._lock = gevent.monkey.get_original("_thread", "allocate_lock")()
        self._lock.acquire()

    def wait(self) -> None:
        self._lock.acquire()
        self._lock.release()

    def set(self) -> None:
        self._lock.release()


def test_items_come_in_order_from_the_producer_thread():
    counter = itertools.count()
    pool = PromptPool(lambda: next(counter), size=4)
    try:
        assert [pool.get() for _ in range(10)] == list(range(10))
    finally:
        pool.close()


def test_gets_that_wait_for_a_refill_get_the_items_in_the_order_they_came():
    """A busy host: three greenlets find the pool empty and wait; the refill lands and, before gevent has run the
    waiters, a fourth get comes (a greenlet scheduled earlier in the same turn of the loop). It waits behind them,
    so the n-th get of a seeded run has the n-th draw: taking the refill first, it once gave a seeded run's
    lengths to other arrivals."""
    import gevent
    gate = NativeGate()  # holds the producer's second batch: the test lands it itself
    counter = itertools.count()

    def make():
        n = next(counter)
        if n == 4:  # the second batch (the first is 4, a quarter of the 16) never comes from the thread
            gate.wait()
        return n

    got: list[tuple[str, int]] = []
    pool = PromptPool(make, size=16)
    try:
        pool.ready.wait(timeout=10)
        got += [("early", pool.get()) for _ in range(4)]  # the first batch: the pool is empty now
        waiters = [gevent.spawn(lambda n=n: got.append((f"w{n}", pool.get()))) for n in range(3)]
        gevent.sleep(0)  # each has found it empty and waits
        pool.items.extend([10, 11, 12, 13])  # the refill lands, as the producer lands it ...
        pool._filled()
        got.append(("new", pool.get()))  # ... and a get comes before the waiters have run
        gevent.joinall(waiters, timeout=10)
    finally:
        gate.set()
        pool.close()
    assert got == [("early", 0), ("early", 1), ("early", 2), ("early", 3), ("w0", 10), ("w1", 11), ("w2", 12),
                   ("new", 13)]


def test_a_get_killed_while_it_waits_does_not_hold_the_line():
    import gevent
    gate = NativeGate()
    counter = itertools.count()
    def make():
        if next(counter) >= 4:  # the second batch waits for the test
            gate.wait()
        return "x"

    pool = PromptPool(make, size=16)
    try:
        pool.ready.wait(timeout=10)
        [pool.get() for _ in range(4)]
        first, second = gevent.spawn(pool.get), gevent.spawn(pool.get)
        gevent.sleep(0)
        first.kill()  # a user stopped while it waited
        gate.set()
        assert second.get(timeout=10) == "x" and list(pool.waiting) == []
    finally:
        pool.close()


def test_a_failure_reaches_every_user_once_told_and_without_a_growing_traceback():
    def make():
        raise UsageError("dataset record too long")

    told = []
    pool = PromptPool(make, size=2, on_error=told.append)
    try:
        depths = []
        for _ in range(5):
            with pytest.raises(PromptError, match="too long") as err:
                pool.get()
            depths.append(len(traceback.format_exception(err.value)))
        # the plugin is told once (it stops the run); every user gets the one-line reason
        assert len(told) == 1 and isinstance(told[0], UsageError)
        # a fresh exception per raise: re-raising one stored object grew its traceback every time
        assert len(set(depths)) == 1, depths
    finally:
        pool.close()


def test_after_the_first_small_batch_the_thread_refills_what_the_queue_lacks_in_one_hand_off(monkeypatch):
    counts = []
    real = PromptPool._make_batch
    monkeypatch.setattr(PromptPool, "_make_batch", lambda self, count: counts.append(count) or real(self, count))
    counter = itertools.count()
    pool = PromptPool(lambda: next(counter), size=32)
    try:
        assert [pool.get() for _ in range(200)] == list(range(200))  # in order, whatever the batch sizes
    finally:
        pool.close()
    assert counts[0] == pool.batch == 8  # users wait for the first batch: it stays small
    # later ones refill at least a batch: one thread hand-off per 8 requests or more, not one per get
    assert all(pool.batch <= c <= pool.size for c in counts[1:]), counts
    assert len(counts) <= 1 + 200 // pool.batch + 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sets a thread's nice value per thread")
def test_token_threads_yield_the_core_to_the_event_loop():
    # the prompt thread shares a core with the loop: below the loop's priority, the kernel hands the core to the
    # loop when both want it (measured: loop stalls over 2 ms fell from 17 to 1-4 in 10 s at 2,500 requests/s)
    import os
    import threading

    from vllm_load.workload.prompt_pool import TOKEN_THREAD_NICE, token_thread
    pool = token_thread()
    try:
        here = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        there = pool.spawn(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())).get()
        assert there == min(19, here + TOKEN_THREAD_NICE) and there > here
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == here  # the loop's thread is as it was
    finally:
        pool.kill()
