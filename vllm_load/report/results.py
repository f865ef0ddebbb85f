"""The end of a run: its verdict (``metrics/judge/verdict.judge``) written as summary.json/.md and JUnit XML, and said."""

from __future__ import annotations

import html
import re
from pathlib import Path

from vllm_load.metrics.judge.slo import SLO, Check
from vllm_load.metrics.judge.verdict import (  # noqa: F401  (the verdict's parts, where callers found them first)
    DRIFT_LIMIT, TRUST, Verdict, exit_code, feature_keys, feature_lines, judge, judge_emulator,
    render_checks, trust_check, validity_checks, word)
from vllm_load.report.console import render_table
from vllm_load.report.load import load_line
from vllm_load.rundir.files import RunDir


def render_validity(verdict: Verdict) -> str:
    """Console lines for the checks that failed (nothing when the run is valid)."""
    lines = [f"RUN INVALID: {c.detail}" for c in verdict.invalid]  # the features' own failures: their lines say them
    return "\n".join(lines + ([] if verdict.trust.passed else [_untrusted(verdict)]))


def _untrusted(verdict: Verdict, where: str = "above") -> str:
    """The untrustworthy line, with the exit code the run ends with: an invalid run's 4 comes first (the line said
    5 while the process exited 4); ``where``: where the reasons are (the console's are above it, summary.md's
    table below)."""
    if verdict.invalid:
        return f"UNTRUSTWORTHY RUN too (exit code {verdict.exit_code}: the run is invalid, which comes first)"
    return (f"UNTRUSTWORTHY RUN: exit code {verdict.exit_code}, so that a gate does not pass on it (the reasons are "
            f"{where}; --allow-untrustworthy accepts it)")


def _md(text: str) -> str:
    """Text a server may have written (its error's words), as Markdown shows it: no HTML of its own (a ``<script>``
    in an error went into summary.md raw), no table cell broken by a ``|``."""
    return html.escape(str(text), quote=False).replace("|", "\\|")


def summary_markdown(summary: dict, verdict: Verdict, title: str, server: dict | None = None,
                     options: dict | None = None) -> str:
    lines = [f"# {_md(title)}", "", _md(load_line(options, summary)), ""]
    said = feature_lines(summary, options)  # a run stopped or interrupted says so first
    if said:
        lines += [f"**{_md(line.removeprefix('vllm-load: '))}**" for line in said] + [""]
    if verdict.invalid:
        lines += ["**RUN INVALID**", ""] + [f"- {_md(c.detail)}" for c in verdict.invalid] + [""]
    if not verdict.trust.passed:
        lines += [f"**{_md(_untrusted(verdict, 'below'))}**", ""]
    if verdict.checks:
        lines += [f"**SLO verdict: {word(bool(verdict.slo_passed))}**", "", "| SLO | result | detail |", "|---|---|---|"]
        lines += [f"| `{c.slo}` | {word(c.passed)} | {_md(c.detail)} |" for c in verdict.checks]
        lines.append("")
    table = render_table(summary, "LLM metrics", server=server)
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", table)), default=0))  # longer than any inside
    lines += [fence, table, fence, ""]
    return "\n".join(lines)


def finish(run_dir: Path, summary: dict, slos: list[SLO], server: dict | None, title: str,
           junit_path: str = "", min_requests: int = 1, allow_untrustworthy: bool = False,
           num_requests: int = 0, strict_load: bool = False, options: dict | None = None,
           figures: str = "") -> Verdict:
    """Judge the run once and write summary.json / summary.md / junit files into ``run_dir`` (``options`` as
    config.json keeps them: the features' checks read theirs; ``figures``: summary.md's figures section, last)."""
    verdict = judge(summary, slos, server, min_requests, allow_untrustworthy, num_requests, strict_load, options)
    data = {"title": title, **verdict.to_json(), **feature_keys(summary), "summary": summary, "server": server}
    rd = RunDir(run_dir)
    rd.write(rd.summary_json, data, indent=2)
    rd.write(rd.summary_md, summary_markdown(summary, verdict, title, server, options)
             + (f"\n{figures}\n" if figures else ""))
    # always: a gate reads junit.xml from every run, the validity checks its test cases when no SLO was given (it
    # was written only with SLOs or a failed check, and the README listed it for every run)
    xml = junit_xml(list(verdict.checks), validity=list(verdict.validity))
    rd.write(rd.junit, xml)
    if junit_path:
        Path(junit_path).parent.mkdir(parents=True, exist_ok=True)
        Path(junit_path).write_text(xml)
    return verdict


__all__ = ["finish", "exit_code", "junit_xml", "render_checks", "render_validity", "validity_checks"]


def junit_xml(checks: list[Check], suite: str = "vllm-load SLOs", validity: list[Check] | None = None) -> str:
    """One test case per SLO (class vllm_load.metrics.judge.slo) and per validity check (class vllm_load.run)."""
    from xml.sax.saxutils import quoteattr

    cases = [("vllm_load.run", c) for c in validity or []] + [("vllm_load.metrics.judge.slo", c) for c in checks]
    failures = sum(not c.passed for _, c in cases)
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           f"<testsuite name={quoteattr(suite)} tests=\"{len(cases)}\" failures=\"{failures}\" errors=\"0\">"]
    for cls, c in cases:
        out.append(f"  <testcase classname=\"{cls}\" name={quoteattr(c.slo)}>")
        if not c.passed:
            out.append(f"    <failure message={quoteattr(c.detail)}/>")
        out.append("  </testcase>")
    out.append("</testsuite>")
    return "\n".join(out) + "\n"
