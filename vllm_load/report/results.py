"""The end of a run: SLO verdict, run validity, summary files, JUnit XML, and the process exit code."""

from __future__ import annotations

from pathlib import Path

from vllm_load.metrics.client_health import ADVICE, emulator_finding, silent_workers
from vllm_load.metrics.summary import RunSummary
from vllm_load.report.console import render_table
from vllm_load.rundir.files import RunDir, write_json
from vllm_load.errors import EXIT_ERRORS, EXIT_INVALID, EXIT_OK, EXIT_SLO_MISS, EXIT_UNTRUSTWORTHY
from vllm_load.metrics.slo import SLO, Check, evaluate, junit_xml, render_checks

#: Share of requests whose prompt length may differ from what was asked before the run is invalid
#: (a wrong tokenizer drifts on nearly every request; a right one on none: 0 of 17,856 measured).
DRIFT_LIMIT = 0.01


def validity_checks(summary: RunSummary, slos: list[SLO], min_requests: int = 1) -> list[Check]:
    """What must hold for the numbers to mean anything, SLOs or not: the run measured something, and
    it measured the prompts it meant to send. An ``input_drift`` SLO replaces the default drift check."""
    out: list[Check] = []
    if min_requests > 0:
        ok = summary["succeeded"]
        if ok >= min_requests:
            detail = f"{ok} requests succeeded"
        elif not summary["requests"]:
            detail = f"no request completed: the run measured nothing (--min-requests {min_requests})"
            ready, processes = summary.get("processes_ready"), summary.get("processes")
            if ready is not None and processes and ready < processes:
                detail += (f"; only {ready} of its {processes} load processes were ready when it ended (each loads "
                           "the tokenizer and fills its prompt pools first, and the schedule starts once all are): "
                           "give the run longer (-t), or fewer processes on these cores")
        else:
            detail = (f"only {ok} of {summary['requests']} requests succeeded: the run measured "
                      f"{'nothing' if not ok else 'too little'} (--min-requests {min_requests})")
        out.append(Check(f"requests succeeded >= {min_requests}", float(ok), ok >= min_requests, detail))
    if not any(s.metric == "input_drift" for s in slos):
        measured = summary["succeeded"] - summary["usage_missing"]
        drifted = summary["input_drift_requests"]
        share = drifted / measured if measured else 0.0
        passed = share <= DRIFT_LIMIT
        detail = f"{drifted} of {measured} requests with server usage drifted"
        if not passed:
            detail = (f"{drifted} of {measured} requests ({share:.1%}) had a prompt length other than asked (max "
                      f"{summary['input_drift_max_abs']} tokens): the tokenizer does not match the server's: pass "
                      "--tokenizer with the server's own (or --slo 'input_drift<=100%' to accept drift)")
        out.append(Check(f"prompt-length drift <= {DRIFT_LIMIT:.0%} of requests", share, passed, detail))
    return out


#: the trust check's name (a JUnit test case of class vllm_load.run, beside the validity checks)
TRUST = "the load generator kept time (trustworthy)"


def judge_emulator(summary: dict, server: dict | None) -> None:
    """The embedded emulator's own lateness (``server``: the sidecar's window of its chunks and late chunks) joins
    the client's verdict (``summary["client"]``): a starved emulator disowns the run's numbers as a starved client
    would, and every medium says so."""
    said, severe = emulator_finding((server or {}).get("emulator_chunks"), (server or {}).get("emulator_late_chunks"))
    if not said:
        return
    client = summary.setdefault("client", {})
    if severe:
        client.update(saturated=True, reasons=[said, *(client.get("reasons") or [])], cause="emulator",
                      advice=ADVICE["emulator"])
    else:
        client["notes"] = [*(client.get("notes") or []), said]


def trust_check(summary: dict, allow: bool = False) -> Check:
    """Can the numbers be trusted to describe the server? Not when the client could not keep time
    (``summary["client"]``, with the embedded emulator's own lateness: ``judge_emulator``) or a worker was lost
    mid-run; ``allow`` (--allow-untrustworthy) accepts such a run, and says so."""
    client = summary.get("client") or {}
    reasons = list(client.get("reasons") or [])
    lost = summary.get("workers_lost") or []
    if lost:
        at = summary.get("workers_lost_at") or {}
        named = ", ".join(w if w not in at else f"{w} (never reported)" if at[w] is None
                          else f"{w} (last report {at[w]:.1f} s into the run)" for w in lost)
        reasons.append(f"worker(s) lost mid-run, their requests after their last report missing here: {named}")
    silent = silent_workers(summary)
    if silent:
        reasons.append(silent)
    if not reasons:
        return Check(TRUST, 1.0, True, "the load generator kept time" + (
            f" ({len(client['notes'])} note(s): {'; '.join(client['notes'])})" if client.get("notes") else ""))
    if client.get("reasons"):
        cause, advice = client.get("cause"), client.get("advice")
    elif lost:
        cause, advice = "lost", "see why the worker stopped reporting (its log)"
    else:
        cause, advice = "silent", ("a worker's loop was held for seconds (a blocking call in a task, or a host too busy "
                                   "to run it): see its log, or run the load on a quieter host")
    detail = f"UNTRUSTWORTHY: {'; '.join(reasons)}. Cause: {cause}: {advice}"
    if allow:
        detail += " (accepted with --allow-untrustworthy)"
    return Check(TRUST, 0.0, allow, detail)


def exit_code(summary: dict, checks: list[Check], slos: list[SLO], validity: list[Check] | None = None,
              trust: Check | None = None) -> int:
    """4 when the run is invalid (measured nothing, or the wrong prompts); 5 when it is untrustworthy (and not
    accepted); 3 when an SLO is missed; else 1 when a request failed (unless an error_rate SLO governs); else 0."""
    if validity and any(not c.passed for c in validity):
        return EXIT_INVALID
    if trust is not None and not trust.passed:
        return EXIT_UNTRUSTWORTHY
    if any(not c.passed for c in checks):
        return EXIT_SLO_MISS
    if summary["failed"] and not any(s.metric in ("error_rate", "goodput", "good_request_fraction") for s in slos):
        return EXIT_ERRORS
    return EXIT_OK


def render_validity(validity: list[Check]) -> str:
    """Console lines for the checks that failed (nothing when the run is valid)."""
    failed = [c for c in validity if not c.passed]
    return "\n".join(f"RUN INVALID: {c.detail}" if c.slo != TRUST else
                     "UNTRUSTWORTHY RUN: exit code 5, so that a gate does not pass on it (the reasons are above; "
                     "--allow-untrustworthy accepts it)" for c in failed)


def summary_markdown(summary: dict, checks: list[Check], title: str, server: dict | None = None,
                     validity: list[Check] | None = None) -> str:
    lines = [f"# {title}", ""]
    bad = [c for c in validity or [] if not c.passed and c.slo != TRUST]
    if bad:
        lines += ["**RUN INVALID**", ""] + [f"- {c.detail}" for c in bad] + [""]
    if any(not c.passed and c.slo == TRUST for c in validity or []):
        lines += ["**UNTRUSTWORTHY RUN** (exit code 5; `--allow-untrustworthy` accepts it)", ""]
    if checks:
        verdict = "PASS" if all(c.passed for c in checks) else "FAIL"
        lines += [f"**SLO verdict: {verdict}**", "", "| SLO | result | detail |", "|---|---|---|"]
        lines += [f"| `{c.slo}` | {'PASS' if c.passed else 'FAIL'} | {c.detail} |" for c in checks]
        lines.append("")
    lines += ["```", render_table(summary, "LLM metrics", server=server), "```", ""]
    return "\n".join(lines)


def finish(run_dir: Path, summary: dict, slos: list[SLO], server: dict | None, title: str,
           junit_path: str = "", min_requests: int = 1, allow_untrustworthy: bool = False
           ) -> tuple[int, list[Check], list[Check]]:
    """Write summary.json / summary.md / junit files into ``run_dir``; return (exit code, SLO checks,
    validity checks, the trust check last among them)."""
    checks = evaluate(slos, summary, server)
    validity = validity_checks(summary, slos, min_requests)
    judge_emulator(summary, server)
    trust = trust_check(summary, allow_untrustworthy)
    code = exit_code(summary, checks, slos, validity, trust)
    validity = [*validity, trust]
    data = {"title": title, "exit_code": code, "summary": summary, "server": server,
            "slo": [c.to_json() for c in checks], "validity": [c.to_json() for c in validity],
            "valid": all(c.passed for c in validity), "trust": trust.to_json(),
            "verdict": None if not checks else ("pass" if all(c.passed for c in checks) else "fail")}
    rd = RunDir(run_dir)
    write_json(rd.summary_json, data, indent=2)
    rd.summary_md.write_text(summary_markdown(summary, checks, title, server, validity))
    if checks or junit_path or any(not c.passed for c in validity):
        xml = junit_xml(checks, validity=validity)
        rd.junit.write_text(xml)
        if junit_path:
            Path(junit_path).parent.mkdir(parents=True, exist_ok=True)
            Path(junit_path).write_text(xml)
    return code, checks, validity


__all__ = ["finish", "exit_code", "render_checks", "render_validity", "validity_checks"]
