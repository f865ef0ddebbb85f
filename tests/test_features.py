"""The feature seam (``vllm_load/feature_spec.py``, ``vllm_load/features/``): each feature in one module, the hubs
looping over the registry, and the first features judged through it (a run stopped, a run interrupted)."""

from __future__ import annotations

import json
import ast
import re
from argparse import Namespace
from pathlib import Path

import pytest

from vllm_load.errors import EXIT_ERRORS, EXIT_INTERRUPTED, EXIT_OK, EXIT_SLO_MISS
from vllm_load.feature_spec import RunEnd
from vllm_load.features import FEATURES
from vllm_load.features.interrupted import CHECK as INTERRUPTED
from vllm_load.metrics.judge.slo import parse_slo_option
from vllm_load.metrics.summary import RunSummary
from vllm_load.metrics.judge.verdict import feature_keys, feature_lines, judge
from vllm_load.report.results import render_validity

PKG = Path(__file__).resolve().parents[1] / "vllm_load"


def _end(signal=None, asked_s=40.0, asked_n=0, requests=50, stopped="", code=0) -> RunEnd:
    return RunEnd(Namespace(), 1000.0, 1010.0, requests, asked_s, asked_n, signal, stopped, code)


def _summary(**features) -> RunSummary:
    parts = {f.name: p for f in FEATURES if (p := f.summarise(features.get(f.name, _end()))) is not None}
    return RunSummary(requests=50, succeeded=50, failed=0, usage_missing=0, input_drift_requests=0,
                      features=parts or None)


def test_each_feature_has_its_own_name_module_and_options():
    names = [f.name for f in FEATURES]
    assert len(set(names)) == len(names) and all(names)
    modules = {type(f).__module__ for f in FEATURES}
    assert len(modules) == len(FEATURES) and all(m.startswith("vllm_load.features.") for m in modules)


#: the modules every feature used to be written into (issue 70): they loop over the registry and name no feature
HUBS = ("options.py", "plugin/prepare/validate.py", "plugin/requests/request_source.py", "plugin/load/generator.py", "plugin/requests/llm.py",
        "plugin/lifecycle/collector.py", "metrics/summary.py", "metrics/judge/verdict.py", "report/console.py", "report/html.py",
        "report/compare.py", "report/results.py", "plugin/lifecycle/end_of_run.py")


def test_no_module_but_a_features_own_parts_imports_a_feature_module():
    """The hubs loop over the registry (``vllm_load.features``); a feature module is imported by the registry and by
    the parts it declares (the plugin's side of it), never by a hub."""
    feature_modules = {p.stem for p in (PKG / "features").glob("*.py") if p.stem != "__init__"}
    parts = {part for f in FEATURES for part in f.parts}
    assert not parts & set(HUBS) and all((PKG / part).exists() for part in parts)
    offenders = []
    for path in PKG.rglob("*.py"):
        if path.parent == PKG / "features" or str(path.relative_to(PKG)) in parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                named = {node.module.split(".")[2]} if node.module.startswith("vllm_load.features.") else (
                    {a.name for a in node.names} & feature_modules if node.module == "vllm_load.features" else set())
                offenders += [f"{path.relative_to(PKG)} -> {n}" for n in named]
    assert offenders == []


def test_a_features_option_flags_are_written_in_its_module_only():
    flags = {o.flag for f in FEATURES for o in f.options}
    assert flags  # --allow-interrupted at least
    offenders = []
    for f in FEATURES:
        own = {PKG / "features" / (type(f).__module__.rsplit(".", 1)[1] + ".py"), *(PKG / part for part in f.parts)}
        offenders += [f"{p.relative_to(PKG)}: {o.flag}" for o in f.options for p in PKG.rglob("*.py")
                      if p not in own and re.search(re.escape(o.flag) + r"\b", p.read_text())]
    assert offenders == []


@pytest.mark.parametrize("end,cut", [
    (_end(("SIGINT", 1010.0)), True),  # 10 s of -t 40s
    (_end(("SIGTERM", 1039.99)), False),  # -t's own stop racing the signal
    (_end(("SIGTERM", 1045.0)), False),  # after -t
    (_end(("SIGINT", 1010.0), asked_s=0.0), False),  # no -t, no --num-requests: a signal is how such a run ends
    (_end(("SIGINT", 1010.0), asked_s=0.0, asked_n=100, requests=40), True),
    (_end(("SIGINT", 1010.0), asked_s=0.0, asked_n=40, requests=40), False),
])
def test_a_run_is_interrupted_when_a_signal_ended_it_before_what_it_was_asked(end, cut):
    part = next(f for f in FEATURES if f.name == "interrupted").summarise(end)
    assert part is not None and part["interrupted"] is cut
    summary = _summary(interrupted=end)
    verdict = judge(summary, [], options={})
    assert verdict.exit_code == (EXIT_INTERRUPTED if cut else EXIT_OK)
    assert feature_keys(summary)["interrupted"] is cut
    assert any("INTERRUPTED" in line for line in feature_lines(summary, {})) is cut


def test_an_interrupted_run_fails_first_and_is_accepted_only_when_asked():
    summary = _summary(interrupted=_end(("SIGINT", 1010.0))).replace(failed=3, succeeded=47)
    slos = parse_slo_option(["ttft.p99<=1ms"])
    verdict = judge(summary, slos, options={})
    assert verdict.exit_code == EXIT_INTERRUPTED  # before the missed SLO and the failed requests
    check = next(c for c in verdict.validity if c.slo == INTERRUPTED)
    assert not check.passed and "SIGINT ended the run at 10.0 s of -t 40s" in check.detail
    assert "RUN INVALID" not in render_validity(verdict)  # the feature says its own line
    accepted = judge(summary, slos, options={"allow_interrupted": True})
    assert accepted.exit_code == EXIT_SLO_MISS and "accepted with --allow-interrupted" in " ".join(
        feature_lines(summary, {"allow_interrupted": True}))


def test_a_stopped_run_has_the_stops_code_in_its_summary_as_its_process_exits():
    """--stop-on-outage exited 1 while summary.json said 3 and no file said the run had been stopped."""
    summary = _summary(stopped=_end(stopped="server unreachable since 3.0 s: stopping the run", code=EXIT_ERRORS))
    verdict = judge(summary, parse_slo_option(["ttft.p99<=1ms"]), options={})
    assert verdict.exit_code == EXIT_ERRORS
    assert feature_keys(summary)["stopped"].startswith("server unreachable")
    assert feature_lines(summary, {}) == [
        "vllm-load: the run was stopped: server unreachable since 3.0 s: stopping the run (exit code 1)"]


def test_a_peers_stop_reason_is_printed_without_its_control_characters():
    summary = _summary(stopped=_end(stopped="boom\x1b[2J\x1b[31m\rforged", code=2))
    line = feature_lines(summary, {})[0]
    assert "\x1b" not in line and "\r" not in line and "\\x1b[2J" in line


def test_the_parts_survive_summary_json():
    summary = _summary(interrupted=_end(("SIGINT", 1010.0)))
    again = RunSummary.from_json(summary.to_json())
    assert again.features == summary.features and judge(again, [], options={}).exit_code == EXIT_INTERRUPTED


def test_fault_actions_that_failed_never_ran_or_were_cut_make_the_run_invalid():
    """A failed action exited 0; one planned after -t never ran and nothing said so."""
    from vllm_load.errors import EXIT_INVALID

    faults = ({"label": "kill at 3 s: kill -9 1", "start": 3.0, "end": 3.1, "ok": True, "late_s": 0.0, "late": False},
              {"label": "undrain at 45 s: http://r2", "start": 47.0, "end": 47.0, "ok": True, "late_s": 2.0, "late": True})
    clean = RunEnd(Namespace(), 0.0, 60.0, 50, 60.0, 0, None, "", 0, faults)
    summary = _summary(fault_actions=clean)
    assert judge(summary, [], options={}).exit_code == EXIT_OK
    assert feature_lines(summary, {}) == ["vllm-load: fault plan: LATE undrain at 45 s: http://r2"]
    broken = faults + ({"label": "exec at 5 s: false", "start": 5.0, "end": 5.0, "ok": False, "detail": "exit 1"},
                       {"label": "start at 70 s: x", "start": None, "end": None, "ok": None,
                        "detail": "never ran: planned after the run's end (60.0 s)"},
                       {"label": "restart at 50 s: y", "start": 50.0, "end": None, "ok": None})
    summary = _summary(fault_actions=RunEnd(Namespace(), 0.0, 60.0, 50, 60.0, 0, None, "", 0, broken))
    verdict = judge(summary, [], options={})
    assert verdict.exit_code == EXIT_INVALID
    said = "\n".join(feature_lines(summary, {}))
    assert "FAILED exec at 5 s: false: exit 1" in said and "planned after the run's end" in said
    assert "restart at 50 s: y: cut by the run's end" in said and "RUN INVALID" in said


def test_the_routing_verdict_is_a_feature_read_from_an_older_summary_too(tmp_path):
    """The routing verdict moved onto the seam (issue 70): its part sits under the features, its SLO metrics are
    the feature's, a summary written before keeps its top-level part there, and the report shows its line and its
    table of replicas in its own section (not as a banner at the top)."""
    from tests.test_report import make_run_dir
    from vllm_load.metrics.judge.slo import FEATURE_METRICS, RUN_METRICS, evaluate, parse_slo_option
    from vllm_load.metrics.summary import upgrade_summary
    from vllm_load.report.html import build

    part = {"source": "the x-replica response header", "replicas": {"r1": {"requests": 3, "failed": 0,
            "input_tokens": 300, "cached_tokens": 32}, "r2": {"requests": 1, "failed": 1, "input_tokens": 100}},
            "replica_imbalance": 1.5, "sessions": 2, "sticky_sessions": 1, "session_stickiness": 0.5,
            "cache_hits_achievable": 64, "cache_hits_achieved": 32, "cache_hits_of_achievable": 0.5,
            "cache_hits_source": "the answers' cached tokens", "cache_block": 16}
    assert {"session_stickiness", "cache_hits_of_achievable", "replica_imbalance"} <= set(FEATURE_METRICS)
    assert not {"session_stickiness", "cache_hits_of_achievable", "replica_imbalance"} & set(RUN_METRICS)
    old = upgrade_summary({"requests": 4, "routing": part})
    assert "routing" not in old and old["features"]["routing"] == part
    sticky, = evaluate(parse_slo_option(["session_stickiness>=100%"]), old)
    assert not sticky.passed and sticky.value == 0.5
    run = make_run_dir(tmp_path / "run")
    data = json.loads((run / "llm_stats.json").read_text())
    data["summary"]["routing"] = part  # as a run of the last version wrote it
    (run / "llm_stats.json").write_text(json.dumps(data))
    (run / "config.json").write_text(json.dumps({**json.loads((run / "config.json").read_text()),
                                                 "options": {"capture_header": ["x-replica"]}}))
    page = build(run).report.read_text()
    assert "id='routing-replicas'" in page and "<td>r1</td>" in page and "<td>not known</td>" in page
    line = page.split("id='routing-line'>")[1].split("</p>")[0]
    assert line.startswith("routing (") and "1 of 2 sessions kept on one replica (50%)" in line
    assert "feature-line'>routing (" not in page  # its line is in its section, not a banner
