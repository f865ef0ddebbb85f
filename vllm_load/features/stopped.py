"""A run the tool stopped itself (a failure every request would repeat, a whole-fleet outage past --stop-on-outage,
a file it could not write) says in every output that it was stopped, why, and with which exit code.

Why: the stop was a console line only; ``summary.json`` said ``exit_code: 3`` for a run whose process exited 1, and
no file said it had been stopped. The code is decided here, once, so the summary and the process agree."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_load.check import Check
from vllm_load.feature_spec import Feature, RunEnd
from vllm_load.redact import printable

CHECK = "the run was not stopped early"


class Stopped(Feature):
    name = "stopped"
    check = CHECK

    def summarise(self, end: RunEnd) -> dict[str, Any] | None:
        if not end.stopped:
            return None
        return {"why": printable(end.stopped), "code": int(end.stopped_code)}

    def checks(self, part: Mapping[str, Any], options: Mapping[str, Any]) -> list[tuple[Check, int]]:
        return [(Check(CHECK, 0.0, False, f"the run was stopped: {part.get('why')}"), int(part.get("code") or 1))]

    def lines(self, part: Mapping[str, Any], options: Mapping[str, Any]) -> list[str]:
        return [f"vllm-load: the run was stopped: {part.get('why')} (exit code {part.get('code')})"]

    def json_keys(self, part: Mapping[str, Any] | None) -> dict[str, Any]:
        return {"stopped": (part or {}).get("why") or None}


FEATURE = Stopped()
