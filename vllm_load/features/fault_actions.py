"""A fault plan whose actions did not all run as planned says so, and the run is not the fault test it asked.

Why: a fault planned after -t never ran and nothing said so; a failed action (a kill that found no process, a
restart whose command exited 1) still exited 0; an action cut by the run's end kept ``ok: null`` in summary.json
only. Each action's planned and actual start are in its record (``plugin/watch/fault_plan.py``); here the run is judged
on them: any action that failed, never began or was cut makes it invalid (exit 4), and late ones are said."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_load.check import Check
from vllm_load.errors import EXIT_INVALID
from vllm_load.feature_spec import Feature, RunEnd

CHECK = "every fault action ran as planned"


class FaultActions(Feature):
    name = "fault_actions"
    check = CHECK

    def summarise(self, end: RunEnd) -> dict[str, Any] | None:
        if not end.faults:
            return None
        part: dict[str, list[str]] = {"failed": [], "never_ran": [], "cut": [], "late": []}
        for f in end.faults:
            label = str(f.get("label", ""))
            if f.get("start") is None:
                part["never_ran"].append(f"{label}: {f.get('detail', '')}")
            elif f.get("end") is None:
                part["cut"].append(f"{label}: cut by the run's end before it finished")
            elif f.get("ok") is False:
                part["failed"].append(f"{label}: {f.get('detail', '')}".rstrip(": "))
            if f.get("late"):  # over fault_plan.LATE_S after its planned time
                part["late"].append(label)
        return part

    def checks(self, part: Mapping[str, Any], options: Mapping[str, Any]) -> list[tuple[Check, int]]:
        wrong = _wrong(part)
        if not wrong:
            return [(Check(CHECK, 1.0, True, "every action began and ended" + (
                f" ({len(part['late'])} late: {'; '.join(part['late'])})" if part.get("late") else "")), 0)]
        return [(Check(CHECK, 0.0, False, "; ".join(wrong)), EXIT_INVALID)]

    def lines(self, part: Mapping[str, Any], options: Mapping[str, Any]) -> list[str]:
        out = [f"vllm-load: fault plan: FAILED {x}" for x in part.get("failed", [])]
        out += [f"vllm-load: fault plan: {x}" for x in (*part.get("never_ran", []), *part.get("cut", []))]
        out += [f"vllm-load: fault plan: LATE {x}" for x in part.get("late", [])]
        if _wrong(part):
            out.append(f"vllm-load: RUN INVALID: not every fault action ran as planned (exit code {EXIT_INVALID})")
        return out


def _wrong(part: Mapping[str, Any]) -> list[str]:
    """The actions that did not run as planned: failed, never began, cut by the run's end."""
    return [*part.get("failed", []), *part.get("never_ran", []), *part.get("cut", [])]


FEATURE = FaultActions()
