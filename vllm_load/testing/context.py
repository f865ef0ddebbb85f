"""What a run in the test's process borrows from the process for its length: its stdout, stderr and log lines
(captured), its environment variables, argv and working directory (as ``locust`` would have them), and the greenlets
it leaves (none may outlive it)."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
from pathlib import Path
from typing import Iterator

import gevent


def greenlets() -> set:
    """gevent's greenlets alive in this process now."""
    import gc

    return {g for g in gc.get_objects() if isinstance(g, gevent.Greenlet) and not g.dead}



class Capture(io.StringIO):
    def fileno(self) -> int:  # some writers ask (faulthandler, subprocess): they get the real one
        return sys.__stderr__.fileno()


@contextlib.contextmanager
def captured() -> Iterator[tuple[Capture, Capture]]:
    out, err = Capture(), Capture()
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("%(levelname)s/%(name)s: %(message)s"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        yield out, err
    finally:
        sys.stdout, sys.stderr = saved
        root.removeHandler(handler)
        root.setLevel(level)


@contextlib.contextmanager
def environ(env: dict[str, str] | None, argv: list[str], cwd: Path | None) -> Iterator[None]:
    """The run's environment variables (``env``: set; None values: removed), its argv and working directory, for
    its length: the plugin reads each where ``locust`` would."""
    saved_env, saved_argv, saved_cwd = dict(os.environ), sys.argv, os.getcwd()
    for key, value in (env or {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    sys.argv = ["locust", *argv]
    if cwd is not None:
        os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)


