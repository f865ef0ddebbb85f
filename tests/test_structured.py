"""Structured output (--response-format): every request asks for JSON (a schema, or any object), every answer is
checked, and the share valid is a metric with its interval and an SLO; ``check:`` checks without asking (the
baseline without guided decoding). The emulator answers a response_format with valid JSON, as guided decoding does."""

from __future__ import annotations

import json

import pytest

from tests.helpers import ROOT, run_in_process
from vllm_load.errors import UsageError
from vllm_load.rundir.reqlog import read_log
from vllm_load.workload.structured import json_valid, parse_response_format

SCHEMA = ROOT / "tests" / "data" / "answer-schema.json"


def test_an_answer_is_valid_when_its_first_object_parses_and_validates():
    schema = SCHEMA.read_text()
    assert json_valid('{"answer": "x", "confidence": 7} and then more', schema)
    assert not json_valid('{"answer": "x", "confidence": 700}', schema)  # beyond the schema's maximum
    assert not json_valid('{"answer": "x"', schema) and not json_valid("the model answers", schema)
    assert json_valid('{"any": 1}', "") and not json_valid("[1, 2]", "")


@pytest.mark.parametrize("text,said", [("yaml", "write json_object or json_schema:FILE"),
                                       ("json_schema:/nonexistent.json", "cannot be read"),
                                       ("json_schema:" + str(ROOT / "setup.py"), "not JSON")])
def test_a_bad_response_format_is_one_line(text, said):
    with pytest.raises(UsageError, match=said):
        parse_response_format(text)


def test_the_body_asks_for_the_schema_and_check_asks_for_nothing():
    asked = parse_response_format(f"json_schema:{SCHEMA}")
    assert asked.body["type"] == "json_schema" and asked.body["json_schema"]["name"] == "answer_schema"
    assert parse_response_format(f"check:json_schema:{SCHEMA}").body is None


@pytest.mark.parametrize("fmt,valid", [(f"json_schema:{SCHEMA}", 1.0), (f"check:json_schema:{SCHEMA}", 0.0)])
def test_guided_answers_are_valid_and_unguided_ones_are_not(tmp_path, fmt, valid):
    """Against the embedded emulator: asked, every answer is a valid instance of the schema (its lengths the model's:
    no ignore_eos sent); checked only, the emulator's words are no JSON: 0 % valid, and valid_output>=99% fails."""
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "60s",
                          "--num-requests", "20", "--response-format", fmt, "--slo", "valid_output>=99%",
                          "--input-tokens", "32", "--output-tokens", "24", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == (0 if valid else 3), res.stdout[-3000:] + res.stderr[-3000:]
    logs = read_log(run_dir / "requests.jsonl")
    assert len(logs) == 20 and all(r["ok"] and r["valid"] is bool(valid) for r in logs)
    s = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert s["validated"] == 20 and s["valid_output"] == valid
    assert f"structured output: {valid * 100:.1f}% of 20 answers valid JSON" in res.stdout
