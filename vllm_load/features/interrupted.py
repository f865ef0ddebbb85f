"""A run ended by a signal before what it was asked (-t, --num-requests) says so everywhere and fails its gate.

Why: Ctrl-C at 10 s of ``-t 40s``, or a CI master pod evicted (SIGTERM) early, printed the whole block, ``exit code
0`` and a 10 s summary: a gate cut short passed. Such a run is judged first (exit code 7, ``EXIT_INTERRUPTED``) unless
``--allow-interrupted`` accepts it; a run with neither -t nor --num-requests ends by a signal as designed and is
not interrupted."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_load.errors import EXIT_INTERRUPTED
from vllm_load.check import Check
from vllm_load.feature_spec import Feature, RunEnd
from vllm_load.option_spec import Option, group

#: its validity check's name (a JUnit case of class vllm_load.run)
CHECK = "the run ran as long as asked (not interrupted)"
#: a signal this close to -t's end is -t's own stop racing it, not an interruption
SLACK_S = 0.05


def _asked(end: RunEnd) -> str:
    if end.asked_requests:
        return f"--num-requests {end.asked_requests}"
    return f"-t {end.asked_seconds:g}s" if end.asked_seconds else ""


class Interrupted(Feature):
    name = "interrupted"
    check = CHECK
    options = group(
        "SLOs and gates",
        Option("--allow-interrupted", False, "accept a run a signal (Ctrl-C, SIGTERM) ended before its -t or "
               "--num-requests: exit by the rest of the verdict instead of with code 7 (it still says it was "
               "interrupted)", action="store_true"),
    )

    def summarise(self, end: RunEnd) -> dict[str, Any] | None:
        if end.signal is None:
            return None
        by, wall = end.signal
        at = max(0.0, wall - end.start_wall)
        if end.asked_requests:
            cut = end.requests < end.asked_requests
        else:
            cut = bool(end.asked_seconds) and at < end.asked_seconds - SLACK_S
        return {"interrupted": cut, "by": by, "at_s": round(at, 3), "asked": _asked(end)}

    def checks(self, part: Mapping[str, Any], options: Mapping[str, Any]) -> list[tuple[Check, int]]:
        if not part.get("interrupted"):
            return []
        allow = bool(options.get("allow_interrupted"))
        return [(Check(CHECK, float(part.get("at_s") or 0.0), allow, _said(part, allow)), EXIT_INTERRUPTED)]

    def lines(self, part: Mapping[str, Any], options: Mapping[str, Any]) -> list[str]:
        if not part.get("interrupted"):
            return []
        return [f"vllm-load: INTERRUPTED: {_said(part, bool(options.get('allow_interrupted')))}"]

    def json_keys(self, part: Mapping[str, Any] | None) -> dict[str, Any]:
        return {"interrupted": bool(part and part.get("interrupted"))}


def _said(part: Mapping[str, Any], allow: bool) -> str:
    return (f"{part.get('by')} ended the run at {float(part.get('at_s') or 0):.1f} s of {part.get('asked')}: not the run "
            "asked" + (" (accepted with --allow-interrupted)" if allow else
                       f" (exit code {EXIT_INTERRUPTED}; --allow-interrupted accepts it)"))


FEATURE = Interrupted()
