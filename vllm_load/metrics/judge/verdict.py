"""A run's verdict, decided once: its SLO checks, its validity checks (the trust check last) and its exit code, kept
in ``summary.json`` and rendered by every medium (console, summary.md, JUnit, report, web UI, sweep, compare, tune),
none of which judges again. "PASS" and "FAIL" are spelled here only."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from vllm_load.features import FEATURES
from vllm_load.errors import EXIT_ERRORS, EXIT_INVALID, EXIT_OK, EXIT_SLO_MISS, EXIT_UNTRUSTWORTHY
from vllm_load.metrics.judge.client_health import ADVICE, emulator_finding, silent_workers
from vllm_load.metrics.judge.slo import SLO, Check, evaluate
from vllm_load.metrics.summary import RunSummary
from vllm_load.metrics.summary_parts import ClientVerdict

PASS, FAIL = "PASS", "FAIL"
#: the features' validity checks, by name (their lines say them; ``Verdict.invalid`` leaves them out)
FEATURE_CHECKS = frozenset(f.check for f in FEATURES if f.check)


def word(passed: bool) -> str:
    """How every medium writes a check's result."""
    return PASS if passed else FAIL


#: Share of requests whose prompt length may differ from what was asked before the run is invalid
#: (a wrong tokenizer drifts on nearly every request; a right one on none: 0 of 17,856 measured).
DRIFT_LIMIT = 0.01


def validity_checks(summary: Mapping[str, Any], slos: list[SLO], min_requests: int = 1,
                    num_requests: int = 0, strict_load: bool = False) -> list[Check]:
    """What must hold for the numbers to mean anything, SLOs or not: the run measured something, as many requests
    as --num-requests asked (a run that -t ended at 18 of 1,000,000 is not the run asked for), and the prompts it
    meant to send. An ``input_drift`` SLO replaces the default drift check."""
    summary, out = RunSummary.of(summary), []
    if num_requests > 0:
        done = summary.requests
        out.append(Check(f"requests finished >= --num-requests {num_requests}", float(done), done >= num_requests,
                         f"{done} of the {num_requests} requests asked finished" + (
                             "" if done >= num_requests else " before the run ended (-t, or a stop): give it longer, "
                             "or ask for fewer")))
    if min_requests > 0:
        ok = summary.succeeded
        if ok >= min_requests:
            detail = f"{ok} requests succeeded"
        elif not summary.requests:
            detail = f"no request completed: the run measured nothing (--min-requests {min_requests})"
            ready, processes = summary.processes_ready, summary.processes
            if ready is not None and processes and ready < processes:
                detail += (f"; only {ready} of its {processes} load processes were ready when it ended (each loads "
                           "the tokenizer and fills its prompt pools first, and the schedule starts once all are): "
                           "give the run longer (-t), or fewer processes on these cores")
        else:
            detail = (f"only {ok} of {summary.requests} requests succeeded: the run measured "
                      f"{'nothing' if not ok else 'too little'} (--min-requests {min_requests})")
        out.append(Check(f"requests succeeded >= {min_requests}", float(ok), ok >= min_requests, detail))
    if not any(s.metric == "input_drift" for s in slos):
        measured = summary.succeeded - summary.usage_missing
        drifted = summary.input_drift_requests
        share = drifted / measured if measured else 0.0
        passed = share <= DRIFT_LIMIT
        detail = f"{drifted} of {measured} requests with server usage drifted"
        if not passed:
            detail = (f"{drifted} of {measured} requests ({share:.1%}) had a prompt length other than asked (max "
                      f"{summary.input_drift_max_abs} tokens): the tokenizer does not match the server's: pass "
                      "--tokenizer with the server's own (or --slo 'input_drift<=100%' to accept drift)")
        out.append(Check(f"prompt-length drift <= {DRIFT_LIMIT:.0%} of requests", share, passed, detail))
    if strict_load:  # the load delivered was the load asked (metrics/shape/delivered.py): else not the run asked for
        found = summary.delivered or {}
        passed = found.get("as_asked") is not False
        out.append(Check("delivered load as asked (--strict-load)", 1.0 if passed else 0.0, passed,
                         found.get("detail") or "not judged: no constant open-loop rate or steady window to judge"))
    return out


#: how the trust check's detail starts when it found a reason, and ends when --allow-untrustworthy accepted it
UNTRUSTWORTHY, ACCEPTED = "UNTRUSTWORTHY: ", " (accepted with --allow-untrustworthy)"
#: the trust check's name (a JUnit test case of class vllm_load.run, beside the validity checks)
TRUST = "the load generator kept time (trustworthy)"


def judge_emulator(summary: Mapping[str, Any], server: dict | None) -> RunSummary:
    """``summary`` with the embedded emulator's own lateness (``server``: the sidecar's window of its chunks and
    late chunks) joined to the client's verdict (``summary.client``): a starved emulator disowns the run's
    numbers as a starved client would, and every medium says so. Judged once: a summary that has it already
    is returned as it is."""
    summary = RunSummary.of(summary)
    said, severe = emulator_finding((server or {}).get("emulator_chunks"), (server or {}).get("emulator_late_chunks"))
    client = summary.client or ClientVerdict()
    if not said or said in client.reasons or said in client.notes:
        return summary
    if severe:
        joined = ClientVerdict(client, saturated=True, reasons=[said, *client.reasons], cause="emulator",
                               advice=ADVICE["emulator"])
    else:
        joined = ClientVerdict(client, notes=[*client.notes, said])
    return summary.replace(client=joined)


def trust_check(summary: Mapping[str, Any], allow: bool = False) -> Check:
    """Can the numbers be trusted to describe the server? Not when the client could not keep time
    (``summary.client``, with the embedded emulator's own lateness: ``judge_emulator``) or a worker was lost
    mid-run; ``allow`` (--allow-untrustworthy) accepts such a run, and says so."""
    summary = RunSummary.of(summary)
    client = summary.client or ClientVerdict()
    reasons = list(client.reasons)
    lost = summary.workers_lost or []
    if lost:
        at = summary.workers_lost_at or {}
        named = ", ".join(w if w not in at else f"{w} (never reported)" if at[w] is None
                          else f"{w} (last report {at[w]:.1f} s into the run)" for w in lost)
        reasons.append(f"worker(s) lost mid-run, their requests after their last report missing here: {named}")
    silent = silent_workers(summary)
    if silent:
        reasons.append(silent)
    if not reasons:
        return Check(TRUST, 1.0, True, "the load generator kept time" + (
            f" ({len(client.notes)} note(s): {'; '.join(client.notes)})" if client.notes else ""))
    if client.reasons:
        cause, advice = client.cause, client.advice
    elif lost:
        cause, advice = "lost", "see why the worker stopped reporting (its log)"
    else:
        cause, advice = "silent", ("a worker's loop was held for seconds (a blocking call in a task, or a host too busy "
                                   "to run it): see its log, or run the load on a quieter host")
    detail = f"{UNTRUSTWORTHY}{'; '.join(reasons)}. Cause: {cause}: {advice}"
    if allow:
        detail += ACCEPTED
    return Check(TRUST, 0.0, allow, detail)


def exit_code(summary: Mapping[str, Any], checks: list[Check], slos: list[SLO], validity: list[Check] | None = None,
              trust: Check | None = None) -> int:
    """4 when the run is invalid (measured nothing, or the wrong prompts); 5 when it is untrustworthy (and not
    accepted); 3 when an SLO is missed; else 1 when a request failed (unless an error_rate SLO governs); else 0."""
    if validity and any(not c.passed for c in validity):
        return EXIT_INVALID
    if trust is not None and not trust.passed:
        return EXIT_UNTRUSTWORTHY
    if any(not c.passed for c in checks):
        return EXIT_SLO_MISS
    governed = any(s.metric in ("error_rate", "goodput", "good_request_fraction") for s in slos)
    if RunSummary.of(summary).failed and not governed:
        return EXIT_ERRORS
    return EXIT_OK


@dataclass(frozen=True)
class Verdict:
    """What a run (or a sweep step) was judged: ``checks`` the SLOs, ``validity`` what must hold for its numbers to
    mean anything (the trust check last), ``exit_code`` what a gate reads."""

    checks: tuple[Check, ...]
    validity: tuple[Check, ...]
    exit_code: int

    @property
    def slo_passed(self) -> bool | None:
        """True or False when the run has SLOs, None when it has none."""
        return all(c.passed for c in self.checks) if self.checks else None

    @property
    def trust(self) -> Check:
        return self.validity[-1]

    @property
    def valid(self) -> bool:
        return all(c.passed for c in self.validity)

    @property
    def invalid(self) -> list[Check]:
        """The failed validity checks other than trust and the features' own (each feature says its own: a run
        stopped or interrupted): the run measured nothing, or the wrong prompts."""
        return [c for c in self.validity if not c.passed and c.slo != TRUST and c.slo not in FEATURE_CHECKS]

    @property
    def cut(self) -> list[Check]:
        """The features' failed checks: the run was stopped, or interrupted (each feature's lines say it)."""
        return [c for c in self.validity if not c.passed and c.slo in FEATURE_CHECKS]

    @property
    def distrusted(self) -> bool:
        """The trust check found a reason, accepted or not (its detail says so either way)."""
        return self.trust.detail.startswith(UNTRUSTWORTHY)

    @property
    def distrust_reasons(self) -> str:
        """Why the run's numbers cannot be trusted, accepted with --allow-untrustworthy or not ('' when they can)."""
        if not self.distrusted:
            return ""
        return self.trust.detail.removeprefix(UNTRUSTWORTHY).removesuffix(ACCEPTED)

    @property
    def untrustworthy(self) -> str:
        """Why the run's numbers cannot be trusted ('' when they can, or when --allow-untrustworthy accepted them)."""
        return "" if self.trust.passed else self.distrust_reasons

    def to_json(self) -> dict[str, Any]:
        """``summary.json``'s verdict keys (format unchanged since they were first written)."""
        passed = self.slo_passed
        return {"exit_code": self.exit_code, "slo": [c.to_json() for c in self.checks],
                "validity": [c.to_json() for c in self.validity], "valid": self.valid, "trust": self.trust.to_json(),
                "verdict": None if passed is None else ("pass" if passed else "fail")}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Verdict":
        validity = tuple(Check(**c) for c in data.get("validity") or [])
        if not validity or validity[-1].slo != TRUST:  # an older summary.json: its trust check stood apart
            validity += (Check(**data["trust"]) if data.get("trust") else Check(TRUST, 1.0, True, ""),)
        return cls(tuple(Check(**c) for c in data.get("slo") or []), validity, int(data.get("exit_code", 0)))


def _parts(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Each feature's part of the summary, by name (``RunSummary.features``)."""
    return RunSummary.of(summary).features or {}


def feature_lines(summary: Mapping[str, Any], options: Mapping[str, Any] | None) -> list[str]:
    """What each feature says of the run (console, summary.md, the report), in the registry's order."""
    parts = _parts(summary)
    return [line for f in FEATURES if f.name in parts for line in f.lines(parts[f.name], options or {})]


def feature_said(summary: Mapping[str, Any], options: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """The features' lines with the tone the report shows each in ("invalid", "note"), but for those a feature's
    section of the report holds (``feature_sections``)."""
    parts = _parts(summary)
    return [(line, f.tone) for f in FEATURES if f.name in parts and f.section(parts[f.name]) is None
            for line in f.lines(parts[f.name], options or {})]


def feature_sections(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The report's sections of the features that have one: each its id, title, lines and table."""
    parts = _parts(summary)
    return [{**found, "lines": f.lines(parts[f.name], {})} for f in FEATURES if f.name in parts
            and (found := f.section(parts[f.name])) is not None]


def feature_charts(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The charts each feature adds to the report, in the registry's order."""
    parts = _parts(summary)
    return [c for f in FEATURES if f.name in parts for c in f.charts(parts[f.name])]


def feature_keys(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The keys each feature adds at the top of summary.json (a gate reads them without reading the summary)."""
    parts = _parts(summary)
    return {k: v for f in FEATURES for k, v in f.json_keys(parts.get(f.name)).items()}


def feature_checks(summary: Mapping[str, Any], options: Mapping[str, Any] | None) -> list[tuple[Check, int]]:
    """Each feature's validity checks of the run (``vllm_load/features/``), with the exit code each gives."""
    parts = _parts(summary)
    return [found for f in FEATURES if f.name in parts for found in f.checks(parts[f.name], options or {})]


def feature_references(summary: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The references each feature gives relative SLOs (by the SLO's text), from its part of the summary."""
    parts = _parts(summary)
    return {k: v for f in FEATURES if f.name in parts for k, v in f.references(parts[f.name]).items()}


def judge(summary: Mapping[str, Any], slos: list[SLO], server: dict | None = None, min_requests: int = 1,
          allow_untrustworthy: bool = False, num_requests: int = 0, strict_load: bool = False,
          options: Mapping[str, Any] | None = None) -> Verdict:
    """The one place a run is judged (with the emulator's lateness added to the client's: ``judge_emulator``). The
    features' checks come first, and the first that failed gives its own exit code (a run stopped or interrupted
    is that before anything else)."""
    summary = RunSummary.of(summary)
    checks = evaluate(slos, summary, server, feature_references(summary))
    own = feature_checks(summary, options)
    validity = validity_checks(summary, slos, min_requests, num_requests, strict_load)
    summary = judge_emulator(summary, server)
    trust = trust_check(summary, allow_untrustworthy)
    code = next((c for check, c in own if not check.passed), None)
    if code is None:
        code = exit_code(summary, checks, slos, validity, trust)
    return Verdict(tuple(checks), (*(check for check, _ in own), *validity, trust), code)


def render_checks(checks: list[Check] | tuple[Check, ...]) -> str:
    """The SLO verdict on the console: its word, then one line per SLO."""
    if not checks:
        return ""
    width = max(len(c.slo) for c in checks)
    lines = ["SLO verdict: " + word(all(c.passed for c in checks))]
    for c in checks:
        lines.append(f"  {word(c.passed)}  {c.slo.ljust(width)}  {c.detail}")
    return "\n".join(lines)
