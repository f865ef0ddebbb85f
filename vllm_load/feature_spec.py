"""The seam a feature plugs into: one module of ``vllm_load/features/`` declares its options, what it adds to a run's
summary, how it judges the run and what it says, and the hubs (options, the collector, the verdict, the console,
summary.md, the report) loop over the registry (``features.FEATURES``) instead of naming it.

Why a seam: features used to be written into ten hub modules each (a median of 9.5 modules a feature), so no one
could read a feature in one place, and every hub grew with every feature. Kept as small as the option table: a
feature is a plain object with these attributes; nothing is generated.

A feature's part of the summary sits under its name in ``RunSummary.features`` (``summary.features["interrupted"]``),
so the summary's own field list names no feature; ``summary.json`` keeps it there as JSON."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_load.check import Check
from vllm_load.option_spec import Option


@dataclass(frozen=True)
class RunEnd:
    """What the collector knows at a run's end that a feature may summarise (typed, so that a feature reads no
    collector, runner or controller): the options, the run's clock, what was asked and how it ended."""

    options: Any  # Locust's parsed options (argparse's Namespace, or a shim with the same attributes)
    start_wall: float  # the load's start (the run's clock's 0), wall clock
    end_wall: float  # the run's end, wall clock
    requests: int  # measured requests that completed
    asked_seconds: float  # -t in seconds (0: none)
    asked_requests: int  # --num-requests (0: none)
    signal: tuple[str, float] | None  # the first stopping signal the process took (name, wall clock), if any
    stopped: str  # why the run was stopped on a failure ('' when it was not)
    stopped_code: int  # and with which exit code
    faults: tuple[dict[str, Any], ...] = ()  # the fault plan's actions as they ran (and those that never began)


class Feature:
    """One feature's hooks; a feature overrides those it has. Every hook is a pure function of what it is handed."""

    #: its key in ``RunSummary.features`` and its name in the registry
    name: str = ""
    #: its options (each names its group); ``options.OPTIONS`` appends them
    options: tuple[Option, ...] = ()
    #: the name of its validity check, if it has one (a JUnit case of class vllm_load.run); its ``lines`` say it,
    #: so the generic "RUN INVALID" lines leave it out
    check: str = ""
    #: the modules (paths under vllm_load/) that carry out what its options ask where only another layer can (the
    #: plugin, which alone touches Locust): they may name its flags; no hub is one
    parts: tuple[str, ...] = ()

    def summarise(self, end: RunEnd) -> dict[str, Any] | None:
        """Its part of the summary (JSON-able), computed once at the run's end; None: it has nothing to say."""
        return None

    def checks(self, part: Mapping[str, Any], options: Mapping[str, Any]) -> list[tuple[Check, int]]:
        """Its validity checks of the run and the exit code each gives when it fails (judged before every other
        check, in the registry's order); ``options`` as config.json keeps them."""
        return []

    def lines(self, part: Mapping[str, Any], options: Mapping[str, Any]) -> list[str]:
        """What it says on the console, in summary.md and in the report (one line each, no trailing newline)."""
        return []

    def json_keys(self, part: Mapping[str, Any] | None) -> dict[str, Any]:
        """Keys it adds at the top of summary.json beside the verdict's (a gate reads them without the summary)."""
        return {}
