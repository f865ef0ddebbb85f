"""Shared fixtures: the emulator and the sidecar as real processes on 127.0.0.1 (helpers in tests/helpers.py)."""

from __future__ import annotations

import subprocess
from typing import Any

import locust  # noqa: F401  (first: see below)
import pytest

from tests.helpers import Proc

# Importing Locust monkey-patches the process (gevent). The whole suite did it while collecting (test_busy_host imports
# the plugin), before any test ran; a subset without that module imported it mid-run, after ssl was in use, and the
# patch recursed in SSLContext (test_sweep's check of Locust's private call failed after test_reset and
# test_security). Imported here first, every selection of tests runs as the whole suite does.


def _factory(*module_args: str):
    """Fixture body: yields ``start(*extra, stderr=...)`` for processes of one kind, stops them all after."""
    procs: list[Proc] = []

    def start(*extra: str, stderr: Any = subprocess.PIPE) -> Proc:
        proc = Proc([*module_args, *extra], stderr=stderr)
        procs.append(proc)
        return proc

    yield start
    for p in procs:
        p.stop()


@pytest.fixture
def emulator_factory():
    yield from _factory("-m", "server.emulator", "--port", "0")


@pytest.fixture
def sidecar_factory():
    yield from _factory("-m", "server.sidecar", "--listen", "127.0.0.1:0")


#: the modules whose tests start real vLLMs, swarms of processes, namespaces, capacity searches or long runs: the
#: full suite's bulk (`python -m pytest -q -m 'not slow' tests` leaves them out while developing)
SLOW_MODULES = frozenset({
    "test_real_vllm", "test_real_vllm_pooling", "test_real_vllm_reasoning", "test_real_vllm_tune",
    "test_real_vllm_vision", "test_saturation", "test_tune", "test_netns", "test_process_faults", "test_busy_host",
    "test_faults", "test_compose", "test_kubernetes", "test_packaging", "test_webui", "test_sweep",
    "test_security", "test_router", "test_transformers_serve", "test_real_vllm_timing", "test_real_vllm_fleet",
})


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    for item in items:
        if item.module.__name__.rsplit(".", 1)[-1] in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
