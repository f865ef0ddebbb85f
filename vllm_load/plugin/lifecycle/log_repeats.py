"""Bounded logs: an error that repeats on every task iteration is logged once, then only counted.

Locust logs every exception a task raises with its full traceback. A task that fails the same way on
every iteration (closed loop, no wait time) wrote 1.0 M log lines, 55 MB, in 20 s and held the client at
>= 90 % CPU. Here the first occurrence is logged as it is, later ones only at the 10th, 100th, 1000th …
as one line with the running count: the log grows with the logarithm of the count, and Locust's own
error table still counts every occurrence.
"""

from __future__ import annotations

import logging
from collections import Counter

#: loggers whose records are deduplicated: Locust's task and user runners (root: on_stop failures)
LOGGERS = ("locust.user.task", "locust.user.users", "root")
#: distinct errors remembered; past this the oldest counts are forgotten (memory stays bounded)
MAX_KEYS = 10_000


class RepeatFilter(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()

    @staticmethod
    def key(record: logging.LogRecord) -> str:
        """What makes two records "the same error": the exception's type and message, not its traceback."""
        if record.args and isinstance(record.args, tuple) and isinstance(record.args[0], BaseException):
            exc = record.args[0]
            return f"{type(exc).__name__}: {exc}"[:500]
        return record.getMessage().split("\n", 1)[0][:500]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = self.key(record)
        if key not in self.counts and len(self.counts) >= MAX_KEYS:
            self.counts.clear()
        self.counts[key] += 1
        n = self.counts[key]
        if n == 1:
            return True
        if _power_of_ten(n):
            record.msg, record.args, record.exc_info, record.exc_text = (
                "%s (the same error %d times so far; logged at every power of ten)", (key, n), None, None)
            return True
        return False


def _power_of_ten(n: int) -> bool:
    while n >= 10 and n % 10 == 0:
        n //= 10
    return n == 1


_FILTER = RepeatFilter()


def install() -> RepeatFilter:
    """Attach the one filter to Locust's task loggers (idempotent)."""
    for name in LOGGERS:
        logger = logging.getLogger() if name == "root" else logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    return _FILTER


#: Locust's lines that alarm or repeat for nothing in vllm-load's runs: (role, logger, message start)
QUIET = (
    # a master says this ~1 s after the spawn, before its workers' first reports (every 3 s) arrive; when they
    # never do, the run's own verdict says how many load processes were ready
    ("master", "locust.runners", "Spawning is complete and report waittime is expired, but not all reports"),
    # each worker of --processes says it too: with the master's, three "Shutting down (exit code 0)" lines
    ("worker", "locust.main", "Shutting down (exit code 0)"),
    ("worker", "locust.runners", "Got quit message from master, shutting down"),
)


#: Locust says where its web UI is before its init runs (the tokenizer, the embedded emulator: ~20 s on a busy host),
#: and a browser opened on it then found nothing; the process says it itself once the port accepts connections
#: (``startup.announce_web_ui``). Dropped from import on: Locust logs it before any role is known.
EARLY = ("locust.main", "Starting web interface at")


class QuietFilter(logging.Filter):
    def __init__(self, starts: tuple[str, ...]) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno <= logging.INFO and record.getMessage().startswith(self.starts))


def quiet_early() -> None:
    """Drop ``EARLY`` (idempotent); at import, before Locust builds its web UI."""
    _add_quiet(EARLY[0], (EARLY[1],))


def quiet(role: str) -> None:
    """Drop, in this process's role, the Locust lines ``QUIET`` names (idempotent)."""
    for name in {logger for r, logger, _ in QUIET if r == role}:
        _add_quiet(name, tuple(m for r, n, m in QUIET if r == role and n == name))


def _add_quiet(name: str, starts: tuple[str, ...]) -> None:
    """One ``QuietFilter`` per logger and message set: ``locust.main`` carries two (the early web UI line for every
    role, a worker's "Shutting down"), and a check for any QuietFilter there once skipped the second."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, QuietFilter) and f.starts == starts for f in logger.filters):
        logger.addFilter(QuietFilter(starts))
