"""The tune's child processes (servers, sidecars, probes): started without a signal losing them, stopped with
all they started.

SIGTERM and SIGINT during a tune are raised where the tune is, so that each ``finally`` stops what it started,
except while a child is being spawned. A signal landing inside ``subprocess.Popen`` (between the fork and the
assignment of its result) left a started process nobody held: CI once found the tune's sidecar alive after a
SIGTERM sent the moment the probe's fork appeared. ``spawning()`` holds the signal until the child is held."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


class Stopped(BaseException):
    """SIGTERM, raised where the tune is so that each ``finally`` stops what it started."""


@dataclass
class _Held:
    depth: int = 0  # spawning() sections open
    pending: int = 0  # the signal that arrived inside one, raised when the outermost closes


HELD = _Held()


def _raise(signum: int) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Stopped()


def _handler(signum: int, _frame: object) -> None:
    if HELD.depth:
        HELD.pending = HELD.pending or signum
        return
    _raise(signum)


@contextmanager
def installed() -> Iterator[None]:
    """The tune's handlers for SIGTERM (whose default would skip every ``finally``) and SIGINT, restored after."""
    previous = {s: signal.signal(s, _handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        HELD.depth, HELD.pending = 0, 0


@contextmanager
def spawning() -> Iterator[None]:
    """Hold SIGTERM/SIGINT until the block ends (the block assigns the child it starts to whoever stops it)."""
    HELD.depth += 1
    try:
        yield
    finally:
        HELD.depth -= 1
        if not HELD.depth and HELD.pending:
            signum, HELD.pending = HELD.pending, 0
            _raise(signum)


def stop_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM to the process group ``proc`` leads, SIGKILL after ``grace`` seconds for whatever of it is still
    there. Done when the group is empty, not when its leader is: a leader's own children can outlive it by a
    moment (vLLM's engine processes), and a test that looked right after found them."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        if _emptied(proc, wait):
            break
    try:
        proc.wait(timeout=0.1)  # reaped in any case (a killed leader is gone within the kill's 5 s)
    except subprocess.TimeoutExpired:
        pass


def _emptied(proc: subprocess.Popen, wait: float) -> bool:
    deadline = time.monotonic() + wait
    try:
        proc.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        return False
    while True:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)  # no event tells that a group emptied; its members are not our children
