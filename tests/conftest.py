"""Shared fixtures: the emulator and the sidecar as real processes on 127.0.0.1 (helpers in tests/helpers.py)."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from tests.helpers import Proc


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
