"""The README's first command, run as written, prints what the README shows and leaves what it says (issue 76 item 2:
its sample had drifted: lines differed and several were missing)."""

from __future__ import annotations

import json

import pytest

from tests import readme_sample as rs


def test_the_sample_is_read_and_its_lines_kinds_ignore_the_numbers():
    readme = rs.README.read_text()
    assert rs.command_one(readme)[:3] == [".venv/bin/locust", "-f", "locustfiles/chat.py"]
    lines = rs.sample(readme)
    assert lines[0].startswith(rs.FIRST) and lines[-1].startswith("next: ")
    assert rs.kind("TTFT (ms)    432   96.17") == rs.kind("TTFT (ms)    36  36.94") == "TTFT (ms) #"
    assert rs.kind("requests 432  succeeded 432") == "requests # succeeded"
    assert rs.kind("history: run 20261203-141629-ee1599 recorded") == "history: run #"
    assert rs.with_sample(readme, lines) == readme  # writing the same sample back changes nothing


@pytest.mark.quiet_cores  # the command's run judges its own timekeeping: on a busy host it says so (exit 5)
def test_readme_command_one_prints_the_readmes_sample_and_leaves_its_figures(tmp_path):
    """README command 1's locust part, as written (30 s against the embedded emulator), in a fresh folder: exit 0,
    its block has the sample's lines in the sample's order (each the same kind of line: the numbers are the run's),
    no line Locust prints for a run without -t, and the figures the README names beside the report."""
    readme = rs.README.read_text()
    res = rs.run_command(rs.command_one(readme), tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    got = rs.block(res.stdout)
    assert rs.kinds(got) == rs.kinds(rs.sample(readme)), (
        "README.md's sample is not what command 1 prints: run .venv/bin/python -m tests.readme_sample\n"
        + "\n".join(got))
    assert "No run time limit set" not in res.stdout + res.stderr
    assert "target: built-in EMULATOR, not a real vLLM" in got[0]
    run_dir = next(tmp_path.glob("reports/2*"))
    assert f"vllm-load: report reports/{run_dir.name}/report.html (exit code 0)" in got
    assert "recorded in reports/history.sqlite" in "\n".join(got)  # said from the working folder, as the report
    figures = run_dir / "figures"
    assert {p.suffix for p in figures.iterdir()} == {".png", ".svg"}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["summary"]["requests"] > 0
