"""Answers intact under load, tool calls: each answer to a request that offered tools is checked (a name it offered,
arguments that parse and fit the tool's schema, no empty call delta; no call markup left in its content, its tags
balanced, no special token of the tokenizer in its content), and the run's share is judged against the
truth. The emulator breaks tool calls only while 8 requests run (``--fault bad-tool:0.3 --faults-from 8``) and
counts each breakage by kind (``vllm_emulator:bad_tool_calls_total``): alone every call is whole; at 16 users the
violations equal the emulator's own count, kind by kind, and ``integrity>=99%`` fails."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.helpers import ROOT, run_in_process
from vllm_load.client.tool_integrity import (EMPTY_DELTA, MARKUP_IN_CONTENT, NO_NAME, NOT_JSON, OFF_SCHEMA,
                                            NO_CALL, SPECIAL_TOKEN, UNBALANCED, UNKNOWN_TOOL, check, check_text,
                                            with_text)
from vllm_load.errors import EXIT_OK, EXIT_SLO_MISS
from vllm_load.features.integrity import FEATURE
from vllm_load.metrics.judge.slo import parse_slo, parse_slo_option
from vllm_load.metrics.judge.verdict import judge

AGENT = str(ROOT / "locustfiles" / "agent.py")
TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]


def _call(name: str, arguments: str) -> dict:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize("calls,empty,found", [
    ([_call("search", '{"query": "x"}')], 0, []),
    ([_call("fetch", '{"query": "x"}')], 0, [UNKNOWN_TOOL]),
    ([_call("search", '{"query": "x"')], 0, [NOT_JSON]),
    ([_call("search", '{"q": 1}')], 0, [OFF_SCHEMA]),
    ([_call("", "{}")], 0, [NO_NAME]),
    ([_call("search", '{"query": "x"}')], 2, [EMPTY_DELTA]),
    ([_call("search", '{"query": "x"}'), _call("fetch", "{}")], 0, [UNKNOWN_TOOL]),
    ([], 0, []),
])
def test_each_violation_is_named(calls, empty, found):
    assert check(TOOLS, calls, empty) == found


def test_a_required_call_missing_is_a_fault_unless_it_came_as_markup():
    assert check(TOOLS, [], 0, required=True) == [NO_CALL]
    assert check(TOOLS, [_call("search", '{"query": "x"}')], 0, required=True) == []
    assert with_text([NO_CALL], '<tool_call>{"name": "search"}</tool_call>', "", ()) == [MARKUP_IN_CONTENT]
    assert with_text([NO_CALL], "no call here", "", ()) == [NO_CALL]


@pytest.mark.parametrize("content,reasoning,found", [
    ("The weather is fine.", "", []),
    ("", "<think>plan</think>", []),
    ('<tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call>', "", [MARKUP_IN_CONTENT]),
    ('[TOOL_CALLS][{"name": "search"}]', "", [MARKUP_IN_CONTENT]),
    ("<think>still thinking", "", [UNBALANCED]),
    ("", "I think</think>", [UNBALANCED]),
    ("done</s>", "", [SPECIAL_TOKEN]),
    ("a <s> in prose", "", [SPECIAL_TOKEN]),
    ("<tool_call>{}", "", [MARKUP_IN_CONTENT, UNBALANCED]),
])
def test_an_answers_text_beside_its_calls_is_checked(content, reasoning, found):
    assert check_text(content, reasoning, ("</s>", "<s>", "<unk>")) == found


def test_the_share_per_name_its_interval_and_the_slo():
    logs = ([{"name": "call", "integrity": []}] * 90 + [{"name": "call", "integrity": [UNKNOWN_TOOL]}] * 10 +
            [{"name": "answer", "integrity": []}] * 50 + [{"name": "plain"}] * 7)  # no tools: not checked
    part = FEATURE.from_logs(logs, {})
    assert (part["checked"], part["whole"], part["kinds"]) == (150, 140, {UNKNOWN_TOOL: 10})
    lo, hi = part["interval"]
    assert lo < 140 / 150 < hi and (lo, hi) == pytest.approx((0.8817, 0.9636), abs=1e-3)  # Wilson, 95 %
    assert part["names"]["call"]["share"] == 0.9 and part["names"]["answer"]["share"] == 1.0
    summary = {"requests": 157, "succeeded": 157, "failed": 0, "usage_missing": 0, "input_drift_requests": 0,
               "features": {"integrity": part}}
    verdict = judge(summary, parse_slo_option(["integrity>=95%", "integrity[answer]>=99.9%"]))
    assert [c.passed for c in verdict.checks] == [False, True] and verdict.exit_code == EXIT_SLO_MISS
    assert verdict.checks[0].detail == "measured 93.33%"
    with pytest.raises(Exception, match="takes no .p99"):
        parse_slo("integrity.p99>=99%")
    assert FEATURE.lines(part, {})[0].startswith("integrity: 140 of 150 answers to requests with tools whole (calls and text) (93.3 %, 95 % "
                                                 "interval 88.2-96.3 %): 10 unknown_tool")


def _violations(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm_emulator:bad_tool_calls_total{"):
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            out[kind] = out.get(kind, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def test_tool_calls_whole_alone_and_broken_under_load_as_the_emulator_counted(tmp_path, emulator_factory):
    emu = emulator_factory("--fault", "bad-tool:0.3", "--faults-from", "8", "--seed", "3", "--ttft", "0.02",
                           "--itl", "0.005")
    args = ["-f", AGENT, "--headless", "--host", emu.url, "--slo", "integrity>=99%", "--no-history"]
    for d in ("alone", "busy"):
        (tmp_path / d).mkdir()
    alone = run_in_process([*args, "-t", "2s", "-u", "1", "-r", "1"], tmp_path / "alone")  # whole: a few suffice
    data = json.loads((tmp_path / "alone" / alone.run_dir / "summary.json").read_text())
    part = data["summary"]["features"]["integrity"]
    assert alone.code == EXIT_OK and part["checked"] > 0 and part["whole"] == part["checked"]
    assert _violations(emu.url) == {}  # alone, the server broke none
    busy = run_in_process([*args, "-t", "5s", "-u", "16", "-r", "16"], tmp_path / "busy")
    run_dir = tmp_path / "busy" / busy.run_dir
    data = json.loads((run_dir / "summary.json").read_text())
    part = data["summary"]["features"]["integrity"]
    truth = _violations(emu.url)
    assert sum(truth.values()) > 0 and busy.code == EXIT_SLO_MISS, busy.stdout[-2000:]
    assert part["kinds"] == {k: int(v) for k, v in truth.items()}  # kind by kind, as the server counted
    assert part["checked"] - part["whole"] == sum(truth.values())  # each broken call one broken answer
    logs = [json.loads(x) for x in (run_dir / "requests.jsonl").read_text().splitlines()]
    assert sum(1 for r in logs if r.get("integrity")) == sum(truth.values())  # and so the request log says
    assert data["integrity"] == part["share"] and not data["slo"][0]["passed"]
    assert "integrity: " in busy.stdout and "answers to requests with tools whole (calls and text)" in busy.stdout


def test_compare_puts_the_share_of_a_and_b_side_by_side():
    a = FEATURE.from_logs([{"integrity": []}] * 200, {})
    b = FEATURE.from_logs([{"integrity": []}] * 160 + [{"integrity": [NOT_JSON]}] * 40, {})
    (row,) = FEATURE.compare_rows(a, b)
    assert (row["a"], row["b"], row["significant"]) == (100.0, 80.0, True)
    (same,) = FEATURE.compare_rows(b, b)
    assert not same["significant"] and FEATURE.compare_rows(a, None) == []
