"""What each action of a fault plan did to the requests (``plugin/watch/fault_plan.py``), from the request logs: the verdict
an operator asks for before a rollout, "how many requests do we lose, which sessions move, how long until latency
is back within the SLO?".

Per action, at its start t0 (wall clock, as the logs' starts):

- ``in_flight``: the requests running at t0, and what became of each (finished, failed, cancelled);
- ``recovery_s``: from t0 to the end of the last completion that kept a window of ``WINDOW_S`` (of completions, slid by
  ``STEP_S``) outside the run's SLOs: its error rate within ``error_rate`` (0 without that SLO), its TTFT and E2E
  p99 within theirs; 0 when none after t0 was; None when no request succeeded after it (``recovery_evidence`` says
  what the figure rests on, or why there is none);
- ``lost_requests``: the failures among the requests in flight at t0 or started before the recovery (until the end
  of the run when it never came), cancellations by the run's own end left out;
- ``rehomed_sessions``: sessions a turn of which, from t0 to the next action, went to another replica than the
  session's turn before (``rehomed``; the replica each request was grouped under, ``routing.Replicas``:
  ``--capture-header``'s, the replica's span, or ``--host a,b``'s target; an answer behind a router with neither
  has no known home and is left out);
- ``router`` (with ``--router-metrics``): the router's own counters' increase from t0 to the next action (the
  run's end): retries, requests given up, each worker's failures and breaker (``metrics/fleet/router_counters.py``);
- ``goodput_during_fault``: the share of requests started from t0 to the recovery that succeeded (and met the
  per-request SLOs, when there are any).

The run's figures are each action's worst (most lost, longest recovery, most moved, least goodput): what the SLOs
``lost_requests``, ``recovery.seconds``, ``rehomed_sessions`` and ``goodput_during_fault`` judge.
"""

from __future__ import annotations

import bisect
import math
from typing import Any

from vllm_load.metric_table import E2E, TTFT
from vllm_load.metrics.records import measured, nearest_rank
from vllm_load.metrics.fleet.router_counters import text as router_text

#: the sliding window the recovery is judged in, and its step (seconds)
WINDOW_S, STEP_S = 5.0, 0.5
#: the SLOs these figures are judged by (metrics/judge/slo.py)
METRICS = ("lost_requests", "recovery.seconds", "rehomed_sessions", "goodput_during_fault")


def _failed(r: dict) -> bool:
    return not r["ok"] and not r.get("cancelled")


def _within(window: list[dict], limits: dict[str, float]) -> bool:
    if not window:
        return False  # nothing served: the fleet is not back
    failed = sum(_failed(r) for r in window)
    if failed / len(window) > limits.get("error_rate", 0.0):
        return False
    for metric in (TTFT, E2E):
        if metric in limits:
            values = [r[metric] for r in window if r["ok"] and r.get(metric) is not None]
            if values and nearest_rank(sorted(values), 99.0) > limits[metric]:
                return False
    return True


def _end(r: dict) -> float:
    return float(r["start"]) + float(r.get(E2E) or 0.0)


def _bad(window: list[dict], limits: dict[str, float]) -> list[dict]:
    """The completions that make a window of completions fail the run's limits (none: it is within them): its
    failures past the error rate allowed, its answers past a p99 limit."""
    out: list[dict] = []
    failed = [r for r in window if _failed(r)]
    if failed and len(failed) / len(window) > limits.get("error_rate", 0.0):
        out += failed
    for metric in (TTFT, E2E):
        if metric in limits:
            values = sorted(r[metric] for r in window if r["ok"] and r.get(metric) is not None)
            if values and nearest_rank(values, 99.0) > limits[metric]:
                out += [r for r in window if r["ok"] and (r.get(metric) or 0.0) > limits[metric]]
    return out


def recovery(logs: list[dict], t0: float, limits: dict[str, float]) -> tuple[float | None, str]:
    """When the fleet was back after an action at ``t0``, judged by the evidence of completions (each request when
    it ended), and what that rests on. A window of ``WINDOW_S`` is not recovered only where failures or completions
    past the run's limits are in it; a window in which nothing ended is no evidence either way (a lull in starts, or
    long requests in flight that later succeed, once counted as "not recovered": a clean drain-restart-undrain was
    "recovered in 57.5 s"). The moment is the end of the last bad completion (``t0`` when there is none), provided a
    good one ended after it; (None, why) when none did."""
    after = sorted((r for r in logs if _end(r) >= t0), key=_end)
    if not after:
        return None, "cannot judge: no request ended after the action"
    ends = [_end(r) for r in after]
    last_bad: dict | None = None
    s = t0
    while s <= ends[-1] + 1e-9:
        window = after[bisect.bisect_left(ends, s):bisect.bisect_left(ends, s + WINDOW_S)]
        bad = _bad(window, limits) if window else []
        if bad:
            worst = max(bad, key=_end)
            last_bad = worst if last_bad is None or _end(worst) > _end(last_bad) else last_bad
        s += STEP_S
    back = t0 if last_bad is None else _end(last_bad)
    good = [r for r in after if _end(r) > back and r["ok"]]
    if not good:
        return None, ("not recovered before the run ended: no request succeeded after its last failure"
                      if last_bad is not None else "cannot judge: no request succeeded after the action")
    if last_bad is not None and ends[-1] - back < WINDOW_S:  # no whole clean window after it: not over, as known
        return None, (f"not recovered before the run ended: its failures went on into the run's last "
                      f"{WINDOW_S:g} s")
    what = ("no failure or answer past the limits ended after the action" if last_bad is None else
            f"its last {'failure' if _failed(last_bad) else 'answer past the limits'} ended "
            f"{_end(last_bad) - t0:.1f} s after it")
    judged = "" if any(m in limits for m in (TTFT, E2E)) else (  # a server frozen 4 s "recovered in 0.0 s"
        "; failures only: slow answers are judged with --slo ttft.p99<=... or e2e.p99<=...")
    return back, f"{what}; {len(good)} requests succeeded after that{judged}"


def recovered_at(logs: list[dict], t0: float, limits: dict[str, float]) -> float | None:
    """The moment the fleet was back after ``t0`` (``recovery``); None when it was not, or cannot be judged."""
    return recovery(logs, t0, limits)[0]


def rehomed(logs: list[dict], t0: float, until: float) -> set[str]:
    """The sessions a turn of which, started from ``t0`` to ``until``, was served by another replica than the
    session's turn before it (each answer's known home: ``target``, the replica ``routing.Replicas`` named). A
    session sent back to a replica started again counts where it moved, however long after ``t0`` that was: a
    kill-and-restart behind a router moved two sessions 20 s after the start, which "served by one replica before
    t0 and another after" never saw (all their turns were after it). ``logs``: by their start, as ``disruption``
    sorted them once for every action."""
    last: dict[str, str] = {}
    moved: set[str] = set()
    for r in logs:
        session, home = r.get("session"), r.get("target")
        if not (session and home and r["ok"]):
            continue
        if t0 <= r["start"] < until and last.get(session, home) != home:
            moved.add(session)
        last[session] = home
    return moved


def judge_action(logs: list[dict], action: dict, limits: dict[str, float],
                 until_next: float = math.inf) -> dict[str, Any]:
    """One action's verdict; ``until_next``: the next action's start (its sessions re-homed are its own)."""
    t0 = float(action["start"])
    running = [r for r in logs if r["start"] < t0 < r["start"] + (r.get(E2E) or 0.0)]
    back, evidence = recovery(logs, t0, limits)
    until = back if back is not None else math.inf
    during = [r for r in logs if t0 <= r["start"] < until]
    seen = {id(r) for r in running}
    lost = sum(_failed(r) for r in running) + sum(_failed(r) for r in during if id(r) not in seen)
    good = [r for r in during if r["ok"] and r.get("good") is not False]
    moved = len(rehomed(logs, t0, until_next))
    router = {k: action[k] for k in ("router", "router_error") if k in action}  # --router-metrics' increase
    return {"label": action.get("label", ""), "start": t0, "ok": action.get("ok"), **router,
            "in_flight": {"requests": len(running), "finished": sum(r["ok"] for r in running),
                          "failed": sum(_failed(r) for r in running),
                          "cancelled": sum(bool(r.get("cancelled")) for r in running)},
            "lost_requests": lost, "recovery_s": None if back is None else max(0.0, back - t0),
            "recovery_evidence": evidence,
            "rehomed_sessions": moved,
            "goodput_during_fault": len(good) / len(during) if during else None}


def limits_of(slos: list[Any]) -> dict[str, float]:
    """The run's SLOs a window is judged by: ``error_rate``, ``ttft.p99``, ``e2e.p99`` (upper bounds, whole run)."""
    limits: dict[str, float] = {}
    for s in slos:
        if s.op in ("<=", "<") and s.name is None and (s.metric == "error_rate" or
                                                       (s.metric in (TTFT, E2E) and s.stat == "p99")):
            limits[s.metric] = min(s.threshold, limits.get(s.metric, math.inf))
    return limits


def disruption(logs: list[dict], actions: list[dict], limits: dict[str, float]) -> dict[str, Any] | None:
    """Each action's verdict and the run's worst figures (see the module); None without actions."""
    if not actions:
        return None
    kept = sorted((r for r in logs if measured(r)), key=lambda r: r["start"])
    starts = [float(a["start"]) for a in actions]
    each = [judge_action(kept, a, limits, min((t for t in starts if t > float(a["start"])), default=math.inf))
            for a in actions]
    recoveries = [a["recovery_s"] for a in each]
    goodputs = [a["goodput_during_fault"] for a in each if a["goodput_during_fault"] is not None]
    return {"actions": each, "lost_requests": max(a["lost_requests"] for a in each),
            "recovery_s": None if None in recoveries else max(recoveries),  # type: ignore[type-var]
            "rehomed_sessions": max(a["rehomed_sessions"] for a in each),
            "goodput_during_fault": min(goodputs) if goodputs else None, "window_s": WINDOW_S}


def describe(d: dict[str, Any]) -> list[str]:
    """The console's and the report's lines: one per action."""
    lines = []
    for a in d["actions"]:
        f = a["in_flight"]
        evidence = a.get("recovery_evidence") or ""
        back = (evidence.split(":")[0] if evidence else "not recovered before the run ended") \
            if a["recovery_s"] is None else f"recovered in {a['recovery_s']:.1f} s ({evidence})" if evidence else \
            f"recovered in {a['recovery_s']:.1f} s"
        goodput = "" if a["goodput_during_fault"] is None else \
            f", goodput {a['goodput_during_fault'] * 100:.0f}% until then"
        lines.append(f"{a['label']}{'' if a['ok'] is not False else ' (the action FAILED)'}: {f['requests']} in "
                     f"flight ({f['finished']} finished, {f['failed']} failed, {f['cancelled']} cancelled), "
                     f"{a['lost_requests']} lost, {back}{goodput}, {a['rehomed_sessions']} sessions re-homed"
                     + (f"; the router: {router_text(a['router'])}" if a.get("router") else "")
                     + (f"; the router: {a['router_error']}" if a.get("router_error") else ""))
    return lines
