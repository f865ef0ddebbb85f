"""The seam a feature plugs into: one module of ``vllm_load/features/`` declares its options, what it adds to a run's
summary, how it judges the run and what it says, and the hubs (options, the collector, the verdict, the console,
summary.md, the report) loop over the registry (``features.FEATURES``) instead of naming it.

Why a seam: features used to be written into ten hub modules each (a median of 9.5 modules a feature), so no one
could read a feature in one place, and every hub grew with every feature. Kept as small as the option table: a
feature is a plain object with these attributes; nothing is generated.

A feature's part of the summary sits under its name in ``RunSummary.features`` (``summary.features["interrupted"]``),
so the summary's own field list names no feature; ``summary.json`` keeps it there as JSON.

A feature module sits on the ground floor (the option table reads it) and so imports nothing above it. What a
feature must do with the layers above (open a store, read the run directory) it names as a hook, ``"module:function"``
in its own mechanism's package, which the hub that calls it (the plugin, above every such package) imports when the
run reaches it: ``at_end`` in place of ``summarise``, ``after_run`` once the run's files are written."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
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
    summary: Mapping[str, Any] | None = None  # the run's summary as measured (before the features' parts)
    run_dir: str = ""  # the run directory (its config.json written at the start)


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
    #: how the report shows its lines: "invalid" (a run stopped or cut short: red) or "note" (information)
    tone: str = "invalid"
    #: ``"module:function(RunEnd) -> part | None"``: its part computed by its mechanism, above the seam (what
    #: ``summarise`` does by default); the collector calls it on the master (or the one process) at the run's end
    at_end: str = ""
    #: ``"module:function(logs: list[dict], options: Mapping) -> part | None"``: its part from the request logs by its
    #: mechanism above the seam (what ``from_logs`` does by default), made once at the run's end by ``report/analyses``
    at_logs: str = ""
    #: ``"module:function(environment, run) -> greenlet | None"``: what it sends itself, once this process's generator
    #: is ready and before any user starts (a local runner); a greenlet it leaves running beside the load is killed
    #: with the run
    before_load: str = ""
    #: ``"module:function(run_dir: str, exit_code: int, options: Mapping) -> list[str]"``: what it does once the run's
    #: files and exit code are final (lines said on the console); called on the master at the end of a run
    after_run: str = ""

    def hook(self, which: str) -> Callable[..., Any] | None:
        """Its ``at_end``, ``at_logs``, ``before_load`` or ``after_run`` function (None: it has none)."""
        target = getattr(self, which)
        if not target:
            return None
        module, _, name = target.partition(":")
        return getattr(importlib.import_module(module), name)

    def validate(self, options: Any) -> None:
        """Refuse bad values of its options before the run (``errors.UsageError``: one line, exit 2)."""

    def summarise(self, end: RunEnd) -> dict[str, Any] | None:
        """Its part of the summary (JSON-able), computed once at the run's end; None: it has nothing to say. By
        default its ``at_end`` hook's, if it names one."""
        hook = self.hook("at_end")
        return hook(end) if hook is not None else None

    #: the SLO metrics it measures (name -> unit, as ``metrics/judge/slo.RUN_METRICS``): ``integrity>=99.9%``
    slo_metrics: Mapping[str, str] = {}

    def from_logs(self, logs: list[dict[str, Any]], options: Mapping[str, Any],
                  measured: Mapping[str, Any] | None = None,
                  server: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        """Its part from the run's request logs (every process's, every request), made once when the run ends
        (``report/analyses.complete``): exact across workers, as the logs are; ``measured``: its part as
        ``summarise`` made it at the run's end (what only the running process could read), which this replaces;
        ``server``: the server's side over the run (``metrics/fleet/server.server_summary``: its KV block, its
        counters), None without a sidecar. None: nothing to say. By default its ``at_logs`` hook's, if it names
        one."""
        hook = self.hook("at_logs")
        return hook(logs, options) if hook is not None else None

    def slo_value(self, part: Mapping[str, Any], metric: str, name: str | None) -> tuple[float | None, str]:
        """One of its ``slo_metrics`` as measured (``name``: of the requests of that name=), or None and why not
        (``part`` is empty where the run has none of it)."""
        return None, "not measured"

    def compare_rows(self, a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> list[dict[str, Any]]:
        """Its rows in ``vllm-load compare`` (A's part against B's): each {metric, title, unit, a, b, delta, pct,
        significant}, as the comparison's rate rows."""
        return []

    def checks(self, part: Mapping[str, Any], options: Mapping[str, Any]) -> list[tuple[Check, int]]:
        """Its validity checks of the run and the exit code each gives when it fails (judged before every other
        check, in the registry's order); ``options`` as config.json keeps them."""
        return []

    def lines(self, part: Mapping[str, Any], options: Mapping[str, Any]) -> list[str]:
        """What it says on the console, in summary.md and in the report (one line each, no trailing newline)."""
        return []

    def section(self, part: Mapping[str, Any]) -> dict[str, Any] | None:
        """A section of the report of its own (its ``id``, ``title``, a table's ``head``, ``rows`` and ``table_id``), where the
        report shows its lines too (not as a banner at the top); None: it has none."""
        return None

    def charts(self, part: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Charts it adds to the report (``report/charts.chart``'s form: id, title, axis labels, x, named series)."""
        return []

    def references(self, part: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
        """The references relative SLOs are judged by (``ttft.p99<=baseline*1.10``), by the SLO's text: its
        ``baseline`` value (None, with ``why``, when there is none), ``spread`` and what it rests on (``said``)."""
        return {}

    def json_keys(self, part: Mapping[str, Any] | None) -> dict[str, Any]:
        """Keys it adds at the top of summary.json beside the verdict's (a gate reads them without the summary)."""
        return {}
