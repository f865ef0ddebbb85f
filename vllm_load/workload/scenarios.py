"""Named scenarios: a public workload's rules as one option (``--scenario agentx``), and the run's stamp of whether
it kept them.

A scenario fixes options to the values its rules give, aborts a run whose failed share passes its threshold, and
stamps the run ``scenario_valid``: false when an option it fixes was given another value (each such override
named) or the failed share passed. AgentX follows AIPerf's ``inferencex-agentx-mvp`` as InferenceX runs it
(``aiperf profile --scenario inferencex-agentx-mvp --streaming --use-server-token-count --random-seed 42
--failed-request-threshold 0.05 --trajectory-start-min-ratio 0.25 --trajectory-start-max-ratio 0.75``). AIPerf
0.13.0's own spec (``common/scenario/inferencex_agentx_mvp.py``) locks streaming, ignore_eos, idle gaps capped at
10 s, the first turn's cache bust and a 900 s minimum; the t* range and the failure threshold are the command's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_load.errors import UsageError


@dataclass(frozen=True)
class Scenario:
    name: str
    follows: str  # the public rule it reproduces
    #: option (dest) -> the value the scenario fixes, and why, as the stamp names an override
    fixed: tuple[tuple[str, Any, str], ...]
    failed_share: float  # the run is aborted, and not valid, past this share of failed requests
    needs: tuple[str, ...] = ()  # options that must be given (dest)


AGENTX = Scenario(
    "agentx", "AIPerf's inferencex-agentx-mvp (InferenceX AgentX)",
    fixed=(("session_start", "0.25,0.75", "each session's t* drawn in 25-75 % of its turns"),
           ("session_align", "instant", "every user's t* at one instant"),
           ("max_idle", 10.0, "idle gaps capped at 10 s"),
           ("seed", 42, "random seed 42"),
           ("no_ignore_eos", False, "exact output lengths (ignore_eos)"),
           ("no_continuous_usage", False, "the server's token counts")),
    failed_share=0.05, needs=("sessions",))

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (AGENTX,)}


def scenario_of(name: str) -> Scenario:
    if name not in SCENARIOS:
        raise UsageError(f"--scenario {name!r} is unknown: use one of {', '.join(SCENARIOS)}")
    return SCENARIOS[name]


def apply(name: str, opts: Any, defaults: dict[str, Any]) -> tuple[str, ...]:
    """Set the scenario's values on ``opts`` where the option was left at its default; an option given another value
    is kept, and named in what this returns (the run is then not valid for the scenario). A missing required option
    is one line."""
    scenario = scenario_of(name)
    for dest in scenario.needs:
        if not getattr(opts, dest, None):
            raise UsageError(f"--scenario {name} replays a set: give --{dest.replace('_', '-')} (a published name, e.g. "
                             "semianalysis_cc_traces_weka_062126, or a folder of traces)")
    overrides = []
    for dest, value, why in scenario.fixed:
        given = getattr(opts, dest, defaults.get(dest))
        if given == value:
            continue
        if given == defaults.get(dest):
            setattr(opts, dest, value)
            continue
        flag = "--" + dest.replace("_", "-")
        overrides.append(f"{flag} {given} (the scenario's {value}: {why})")
    return tuple(overrides)


def stamp(name: str, overrides: tuple[str, ...], requests: int, failed: int, aborted: str = "") -> dict:
    """The run's scenario verdict (summary.json's ``scenario``): valid when no option was overridden, the failed
    share stayed within the threshold and the run was not aborted; every reason it is not, named."""
    scenario = scenario_of(name)
    share = failed / requests if requests else 0.0
    reasons = [f"override: {o}" for o in overrides]
    if share > scenario.failed_share:
        reasons.append(f"failed share {share * 100:.1f}% ({failed} of {requests}) over the scenario's "
                       f"{scenario.failed_share * 100:g}%")
    if aborted:  # stopped on a failure: the scenario's abort (its message), or any other
        reasons.append(f"stopped: {aborted}")
    return {"name": name, "follows": scenario.follows, "valid": not reasons, "invalid_reasons": reasons,
            "overrides": list(overrides), "failed_share": share, "failed_threshold": scenario.failed_share}


def describe(s: dict) -> str:
    """The console's line."""
    if s["valid"]:
        return f"{s['name']} ({s['follows']}): VALID (every rule kept; failed share {s['failed_share'] * 100:.1f}%)"
    return f"{s['name']} ({s['follows']}): NOT VALID: " + "; ".join(s["invalid_reasons"])
