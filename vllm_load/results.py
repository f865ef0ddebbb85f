"""The end of a run: SLO verdict, summary files, JUnit XML, report, and the process exit code."""

from __future__ import annotations

import json
from pathlib import Path

from vllm_load.console import render_table
from vllm_load.errors import EXIT_ERRORS, EXIT_OK, EXIT_SLO_MISS
from vllm_load.slo import SLO, Check, evaluate, junit_xml, render_checks


def exit_code(summary: dict, checks: list[Check], slos: list[SLO]) -> int:
    """3 when an SLO is missed; else 1 when a request failed (unless an error_rate SLO governs); else 0."""
    if any(not c.passed for c in checks):
        return EXIT_SLO_MISS
    if summary["failed"] and not any(s.metric in ("error_rate", "goodput") for s in slos):
        return EXIT_ERRORS
    return EXIT_OK


def summary_markdown(summary: dict, checks: list[Check], title: str) -> str:
    lines = [f"# {title}", ""]
    if checks:
        verdict = "PASS" if all(c.passed for c in checks) else "FAIL"
        lines += [f"**SLO verdict: {verdict}**", "", "| SLO | result | detail |", "|---|---|---|"]
        lines += [f"| `{c.slo}` | {'PASS' if c.passed else 'FAIL'} | {c.detail} |" for c in checks]
        lines.append("")
    lines += ["```", render_table(summary, "LLM metrics"), "```", ""]
    return "\n".join(lines)


def finish(run_dir: Path, summary: dict, slos: list[SLO], server: dict | None, title: str,
           junit_path: str = "") -> tuple[int, list[Check]]:
    """Write summary.json / summary.md / slo + junit files into ``run_dir``; return (exit code, checks)."""
    checks = evaluate(slos, summary, server)
    code = exit_code(summary, checks, slos)
    data = {"title": title, "exit_code": code, "summary": summary, "server": server,
            "slo": [c.to_json() for c in checks],
            "verdict": None if not checks else ("pass" if all(c.passed for c in checks) else "fail")}
    (run_dir / "summary.json").write_text(json.dumps(data, indent=2))
    (run_dir / "summary.md").write_text(summary_markdown(summary, checks, title))
    if checks:
        xml = junit_xml(checks)
        (run_dir / "junit.xml").write_text(xml)
        if junit_path:
            Path(junit_path).parent.mkdir(parents=True, exist_ok=True)
            Path(junit_path).write_text(xml)
    return code, checks


__all__ = ["finish", "exit_code", "render_checks"]
