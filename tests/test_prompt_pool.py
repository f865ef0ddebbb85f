"""The prompt pool hands out prepared items in order and surfaces a producer failure to every user."""

import itertools

import pytest

from vllm_load.errors import UsageError
from vllm_load.prompt_pool import PromptPool


def test_items_come_in_order_from_the_producer_thread():
    counter = itertools.count()
    pool = PromptPool(lambda: next(counter), size=4)
    try:
        assert [pool.get() for _ in range(10)] == list(range(10))
    finally:
        pool.close()


def test_a_failure_reaches_every_user():
    def make():
        raise UsageError("dataset record too long")

    pool = PromptPool(make, size=2)
    try:
        for _ in range(3):
            with pytest.raises(UsageError, match="too long"):
                pool.get()
    finally:
        pool.close()
