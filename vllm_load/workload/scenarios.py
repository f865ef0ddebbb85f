"""Named scenarios: a public workload's rules as one option (``--scenario agentx``), and the run's stamp of whether
it kept them.

A scenario locks options to the values its rules give (``fixed``: another value given is an override, named, and the
run is not valid), fills in its defaults where an option was left at its own (``defaults``: a value given is the
user's, honoured, as AIPerf honours explicit flags), aborts a run whose failed share passes its threshold, and stamps
the run ``scenario_valid``.

The two AgentX scenarios are read from AIPerf's own code (ai-dynamo/aiperf ``src/aiperf/common/scenario/``):
``agentx-mvp`` is ``inferencex_agentx_mvp.py``'s ScenarioSpec (``require_ignore_eos``, ``require_streaming``: vllm-load
always streams; ``require_cache_bust=FIRST_TURN_PREFIX``, a fresh marker on every play; ``system_idle_gap_cap_seconds=
10.0``; ``forbid_inter_turn_delay_cap``; ``require_loader``: the published with-subagents sets;
``min_benchmark_duration_seconds=900``, ``default_benchmark_duration_seconds=1800``; t* defaults 0.0-1.0; the timing
mode AGENTIC_REPLAY: lanes replay their traces for the whole duration). ``agentx`` is AIPerf 0.14's
``inferencex-agentx`` preset: the MVP's locks unchanged (its test ``test_new_scenario_keeps_mvp_invariants``), and its
defaults (``tests/.../test_agentx_command.py``): 3,600 s, seed 42, ``failed_request_threshold=0.10``, t* 0.25-0.75,
the server's token counts, 8 lanes. The stamp holds the run to what the referee checks: the 900 s minimum, a pinned
(published) corpus, context overflows within 1 %, and a run that can be trusted (an untrustworthy one is never
VALID: ``untrusted``, applied when the run is judged). Not yet carried out: the preset's 10 warm-up requests per lane,
its 1,800 s warm-up grace and its 300 s per-trace idle cap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_load.errors import UsageError


@dataclass(frozen=True)
class Scenario:
    name: str
    follows: str  # the public rule it reproduces
    #: option (dest) -> the value the scenario locks, and why, as the stamp names an override
    fixed: tuple[tuple[str, Any, str], ...]
    failed_share: float  # the run is aborted, and not valid, past this share of failed requests (1: never)
    needs: tuple[str, ...] = ()  # options that must be given (dest)
    needs_why: str = ""  # what the missing option is, in the one line that asks for it
    #: option (dest) -> the value filled in where the option was left at its own default (a value given is honoured)
    defaults: tuple[tuple[str, Any, str], ...] = ()
    #: (most users, seconds): each point's duration floor by its concurrency region (a point then ends on a whole
    #: pass of its --num-requests)
    floors: tuple[tuple[float, float], ...] = ()
    #: the run's own minimum length, seconds (its measured duration; 0: none)
    min_run_s: float = 0.0
    #: the run length the rules default to: a replay that recycles its traces runs until -t, which must be given
    default_run_s: float = 0.0
    #: the corpus must be a published, pinned set (a local folder is the referee's unsafe override)
    pinned_corpus: bool = False
    #: the most requests the server may refuse for the model's context length (1: no limit)
    overflow_share: float = 1.0

    def floor(self, users: float) -> float:
        return next((seconds for most, seconds in self.floors if users <= most), 0.0)


_NEEDS_SET = ("replays a set: give --sessions (a published name, e.g. semianalysis_cc_traces_weka_062126, or a "
              "folder of traces)")
#: inferencex_agentx_mvp.py's locks, as vllm-load's options (streaming is always on here)
_AGENTX_LOCKS = (
    ("no_ignore_eos", False, "exact output lengths (require_ignore_eos)"),
    ("cache_bust", "trajectory", "a fresh marker before each play's first turn (require_cache_bust first_turn_prefix)"),
    ("system_idle_cap", 10.0, "idle time capped at 10 s system-wide, every pending timer shifted together "
                              "(system_idle_gap_cap_seconds)"),
    ("max_idle", float("inf"), "no per-turn idle cap (forbid_inter_turn_delay_cap: clamping parent and subagent "
                               "delays apart distorts their relative timing)"),
    ("recycle", True, "lanes replay their traces from turn 0 for the whole duration (agentic replay)"))

AGENTX_MVP = Scenario(
    "agentx-mvp", "AIPerf's inferencex-agentx-mvp spec (InferenceX AgentX MVP)",
    fixed=_AGENTX_LOCKS,
    defaults=(("session_start", "0,1", "t* anywhere in a trace (default_trajectory_start_*_ratio 0.0-1.0)"),),
    failed_share=1.0, needs=("sessions",), needs_why=_NEEDS_SET,
    # --benchmark-duration at least 900 s (its default 1,800), a pinned with-subagents corpus (a local trace folder
    # needs AIPerf's --unsafe-override, which turns submission_valid false), and submission_valid false above 1 %
    # context-overflow errors
    min_run_s=900.0, default_run_s=1800.0, pinned_corpus=True, overflow_share=0.01)

AGENTX = Scenario(
    "agentx", "AIPerf 0.14's inferencex-agentx preset (InferenceX AgentX)",
    fixed=_AGENTX_LOCKS,
    defaults=(("session_start", "0.25,0.75", "t* in 25-75 % of each trace (trajectory_start_*_ratio)"),
              ("session_align", "instant", "every lane's t* at one instant"),
              ("seed", 42, "random seed 42"),
              ("no_continuous_usage", False, "the server's token counts (use_server_token_count)")),
    failed_share=0.10, needs=("sessions",), needs_why=_NEEDS_SET,
    min_run_s=900.0, default_run_s=3600.0, pinned_corpus=True, overflow_share=0.01)

#: MLPerf Endpoints v1.0, from the endpoints_policies draft (v1.0_rules_dev, as mlcommons/endpoints'
#: docs/pareto_sweep_support.md cites it; the rules may still move): four mandatory concurrency points, Ultra Low
#: (1-32), Low, Medium and High; each at least 600 s (Ultra Low) or 1,200 s of steady state (§6.2), ending on a whole
#: multiple of the dataset (§6.4); TTFT p90 to the first non-empty fragment (§4.1); the detected TPOT plateau the
#: official window (§4.4). A qualification run, not a submission (no accuracy runs, no Offline point, no audit).
MLPERF_ENDPOINTS = Scenario(
    "mlperf-endpoints", "MLPerf Endpoints v1.0 draft rules",
    fixed=(("min_duration", 0.0, "each point at least 600 s (1-32 users) or 1,200 s (above): the rules' minimum"),),
    failed_share=1.0, needs=("num_requests",),
    needs_why="ends each point on whole passes of the dataset: give --num-requests N (the dataset's size)",
    floors=((32, 600.0), (float("inf"), 1200.0)))
#: the mandatory points: how many, and the first one's region
MLPERF_POINTS, ULTRA_LOW = 4, 32

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (AGENTX_MVP, AGENTX, MLPERF_ENDPOINTS)}


def scenario_of(name: str) -> Scenario:
    if name not in SCENARIOS:
        raise UsageError(f"--scenario {name!r} is unknown: use one of {', '.join(SCENARIOS)}")
    return SCENARIOS[name]


def apply(name: str, opts: Any, defaults: dict[str, Any], run_s: float | None = None) -> tuple[str, ...]:
    """Set the scenario's values on ``opts`` where the option was left at its default; an option given another value
    is kept, and named in what this returns (the run is then not valid for the scenario). A missing required option
    is one line, and so is a missing -t (``run_s`` 0; None: not checked here) where the scenario runs for a duration."""
    scenario = scenario_of(name)
    for dest in scenario.needs:
        if not getattr(opts, dest, None):
            raise UsageError(f"--scenario {name} {scenario.needs_why}")
    if scenario.default_run_s and run_s is not None and not run_s:
        raise UsageError(f"--scenario {name} replays its traces for a duration: give -t {scenario.default_run_s:g}s "
                         f"(the rules' default; at least {scenario.min_run_s:g} s for a valid run)")
    for dest, value, _why in scenario.defaults:
        if getattr(opts, dest, defaults.get(dest)) == defaults.get(dest):
            setattr(opts, dest, value)
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


@dataclass(frozen=True)
class Point:
    """One measured point of a floored run (a sweep step, or the run): its users, how long its window lasted, the
    requests it measured against the pass size (--num-requests), and the floor it ran to (the scenario's, or
    --min-duration's: an override the stamp names)."""

    users: float
    seconds: float
    requests: int
    pass_size: int
    floor: float

    def judge(self) -> dict:
        floor = self.floor
        passes = self.requests / self.pass_size if self.pass_size else 0.0
        whole = bool(self.pass_size) and self.requests > 0 and self.requests % self.pass_size == 0
        out = {"users": self.users, "seconds": round(self.seconds, 3), "floor_s": floor, "requests": self.requests,
               "passes": round(passes, 3), "whole_passes": whole}
        reasons = [] if self.seconds >= floor else [f"{self.seconds:.0f} s, under the {floor:g} s floor"]
        if not whole:
            reasons.append(f"{self.requests} requests, not a whole multiple of {self.pass_size}")
        return {**out, "valid": not reasons, "invalid_reasons": reasons}


def point_reasons(points: list[dict]) -> list[str]:
    """MLPerf Endpoints' curve: its mandatory points (four, the first in Ultra Low) and each point's own rules."""
    reasons = [f"point {i} ({p['users']:g} users): {why}" for i, p in enumerate(points) for why in p["invalid_reasons"]]
    if len(points) < MLPERF_POINTS:
        reasons.append(f"{len(points)} point(s): the rules ask for {MLPERF_POINTS} concurrency regions (--sweep "
                       "e.g. 8,64,256,1024)")
    if points and points[0]["users"] > ULTRA_LOW:
        reasons.append(f"no Ultra Low point (1-{ULTRA_LOW} users): the first is {points[0]['users']:g}")
    return reasons


#: how a server says a request is longer than its model's context (vLLM: "This model's maximum context length is N
#: tokens. However, you requested …"; OpenAI's "context_length_exceeded")
_OVERFLOW = ("maximum context length", "context_length_exceeded", "context length")


def overflows(errors: dict[str, int] | None) -> int:
    """The failed requests the server refused for the model's context length, by their reasons' kinds."""
    return sum(n for kind, n in (errors or {}).items() if any(m in kind.lower() for m in _OVERFLOW))


def stamp(name: str, overrides: tuple[str, ...], requests: int, failed: int, aborted: str = "",
          points: list[Point] | None = None, seconds: float = 0.0, corpus: str = "", overflowed: int = 0) -> dict:
    """The run's scenario verdict (summary.json's ``scenario``): valid when no option was overridden, the failed
    share stayed within the threshold, the run was not aborted, it lasted the scenario's minimum (``seconds``: its
    measured duration), its corpus is the published set the rules pin (``corpus``: --sessions), and (a floored
    scenario) every point kept its floor and whole passes; every reason it is not, named, and every rule it kept
    (``kept``). Whether the run could be trusted is judged after it (``untrusted``): an untrustworthy run is never
    valid."""
    scenario = scenario_of(name)
    share = failed / requests if requests else 0.0
    reasons = [f"override: {o}" for o in overrides]
    kept = [f"{len(scenario.fixed)} options as the rules fix them"] if not overrides else []
    if scenario.min_run_s:
        if seconds < scenario.min_run_s:
            reasons.append(f"{seconds:.0f} s, under the {scenario.min_run_s:g} s the rules ask (-t "
                           f"{scenario.min_run_s:g}s or more)")
        else:
            kept.append(f"{seconds:.0f} s, at least {scenario.min_run_s:g} s")
    if scenario.pinned_corpus and corpus:
        from vllm_load.workload.inputs.public_sets import is_published

        if is_published(corpus):
            kept.append(f"the published corpus {corpus}")
        else:
            reasons.append(f"an unpinned local corpus ({corpus}): the rules pin a published set (AIPerf runs a local "
                           "folder only with --unsafe-override, which makes submission_valid false)")
    judged = [p.judge() for p in points or ()]
    if scenario.floors:
        reasons += point_reasons(judged)
    if share > scenario.failed_share:
        reasons.append(f"failed share {share * 100:.1f}% ({failed} of {requests}) over the scenario's "
                       f"{scenario.failed_share * 100:g}%")
    elif scenario.failed_share < 1:
        kept.append(f"failed share {share * 100:.1f}% within {scenario.failed_share * 100:g}%")
    if scenario.overflow_share < 1:
        over = overflowed / requests if requests else 0.0
        if over > scenario.overflow_share:
            reasons.append(f"context overflow: {overflowed} of {requests} requests ({over * 100:.1f}%) refused for the "
                           f"model's context length, over the rules' {scenario.overflow_share * 100:g}%")
        else:
            kept.append(f"context overflows {over * 100:.1f}% within {scenario.overflow_share * 100:g}%")
    if aborted:  # stopped on a failure: the scenario's abort (its message), or any other
        reasons.append(f"stopped: {aborted}")
    if judged and not any(p["invalid_reasons"] for p in judged):
        kept.append(f"{len(judged)} points, each floor and whole passes kept")
    out = {"name": name, "follows": scenario.follows, "valid": not reasons, "invalid_reasons": reasons,
           "overrides": list(overrides), "failed_share": share, "failed_threshold": scenario.failed_share,
           "kept": kept}
    return {**out, "points": judged} if scenario.floors else out


def untrusted(s: dict, why: str) -> dict:
    """The stamp of a run that could not be trusted (the client could not keep time, a worker was lost): never
    valid, whatever else it kept (it was stamped VALID on a run that itself exited 5)."""
    reason = f"the run is untrustworthy ({why})"
    if reason in s.get("invalid_reasons", []):
        return s
    return {**s, "valid": False, "invalid_reasons": [*s.get("invalid_reasons", []), reason]}


def describe(s: dict) -> str:
    """The console's line: VALID with the rules it kept, or every reason it is not."""
    if s["valid"]:
        kept = "; ".join(s.get("kept") or []) or (
            f"{len(s['points'])} points, each floor and whole passes kept" if s.get("points") else
            f"failed share {s['failed_share'] * 100:.1f}%")
        return f"{s['name']} ({s['follows']}): VALID (every rule kept: {kept})"
    return f"{s['name']} ({s['follows']}): NOT VALID: " + "; ".join(s["invalid_reasons"])
