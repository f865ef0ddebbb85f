"""Errors that stop a run before it starts, and the process exit codes that CI reads."""

from __future__ import annotations

import sys

#: Exit codes, documented in docs/gates.md: 0 pass, 1 requests failed, 2 bad input, 3 SLO missed,
#: 4 the run is invalid (it measured nothing, or prompts of other lengths than asked), 5 the run is
#: untrustworthy (the load generator could not keep time, or lost a worker) unless --allow-untrustworthy, 6 the run's files
#: could not be written (disk full, permissions): the verdict was printed, the run directory is incomplete; 7 the run
#: was interrupted (a signal ended it before its -t or --num-requests; features/interrupted.py).
EXIT_OK = 0
EXIT_ERRORS = 1
EXIT_BAD_INPUT = 2
EXIT_SLO_MISS = 3
EXIT_INVALID = 4
EXIT_UNTRUSTWORTHY = 5
EXIT_OUTPUT = 6
EXIT_INTERRUPTED = 7


class OutputError(Exception):
    """A file of the run could not be written; the message is one line naming the file and the cause."""

    @classmethod
    def of(cls, exc: OSError, what: str, advice: str = "free space or pick another --run-dir") -> OutputError:
        where = f" {exc.filename}" if getattr(exc, "filename", None) else ""
        return cls(f"cannot write {what}{where}: {exc.strerror or exc}: {advice}")


class UsageError(Exception):
    """Bad input: the message is one line that says what is wrong and how to fix it."""


def die(message: str) -> None:
    """Print one line on stderr and leave with the bad-input code."""
    sys.stderr.write(f"vllm-load: error: {message}\n")
    sys.stderr.flush()
    raise SystemExit(EXIT_BAD_INPUT)
