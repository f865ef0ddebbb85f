"""Accuracy under load (--accuracy KIND:FILE[:SHARE]): a graded share of a run's chat requests, each answer graded
(GSM8K's number, MMLU's letter, a JSON schema), accuracy per set with its 95 % interval, an SLO on it; the emulator
answers a set right at a set rate, so the grader and the interval are checked exactly."""

from __future__ import annotations

import json

import pytest

from tests.helpers import ROOT, run_in_process
from vllm_load.errors import UsageError
from vllm_load.rundir.reqlog import read_log
from vllm_load.metrics.judge.repeats import wilson
from vllm_load.workload.graded import GradedMix, GradedSet, grade, gsm8k_number, load_set, mmlu_letter, parse_accuracy

DATA = ROOT / "tests" / "data"


@pytest.mark.parametrize("reply,number", [("so 3 + 4 = 7.\n#### 7", "7"), ("The answer is 1,250 dollars", "1250"),
                                          ("#### 12.0", "12"), ("no digits here", None),
                                          ("first 3, then 5, finally 9", "9")])
def test_gsm8k_takes_the_number_after_the_marks_else_the_last(reply, number):
    assert gsm8k_number(reply) == number


@pytest.mark.parametrize("reply,letter", [("The answer is C.", "C"), ("(b)", "B"), ("D", "D"),
                                          ("answer: A because", "A"), ("I cannot tell", None)])
def test_mmlu_takes_the_letter_given(reply, letter):
    assert mmlu_letter(reply) == letter


def test_a_json_answer_is_right_when_it_validates():
    schema = json.dumps({"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}})
    assert grade("json", 'Here: {"n": 3} done', schema) and not grade("json", '{"n": "3"}', schema)
    assert not grade("json", "{not json", schema) and not grade("json", "nothing", schema)


def test_the_sets_read_in_their_public_formats():
    gsm = load_set("gsm8k", str(DATA / "gsm8k-mini.jsonl"))
    assert len(gsm) == 20 and gsm[0].expected == "64" and gsm[0].prompt.endswith("after '####'.")
    mmlu = load_set("mmlu", str(DATA / "mmlu-mini.jsonl"))
    assert mmlu[0].expected == "D" and "\nD. 22\n" in mmlu[0].prompt and grade("mmlu", mmlu[0].example, "D")


@pytest.mark.parametrize("values,said", [(["trivia:x.jsonl"], "KIND one of gsm8k, mmlu, json"),
                                         (["gsm8k:x.jsonl:1.5"], "above 0 and below 1"),
                                         (["gsm8k:a:0.6", "mmlu:b:0.5"], "add up to 1 or more"),
                                         (["gsm8k:a", "gsm8k:b"], "names a kind twice")])
def test_bad_accuracy_options_are_one_line(values, said):
    with pytest.raises(UsageError, match=said):
        parse_accuracy(values)


def test_a_bad_set_file_is_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "no answer"}\n')
    with pytest.raises(UsageError, match=r"item 1: a gsm8k item lacks answer"):
        load_set("gsm8k", str(bad))


def test_a_process_deals_each_sets_share_exactly_interleaved():
    mix = GradedMix([GradedSet("gsm8k", str(DATA / "gsm8k-mini.jsonl"), 0.2),
                     GradedSet("mmlu", str(DATA / "mmlu-mini.jsonl"), 0.1)], "seed")
    picks = [mix.next() for _ in range(100)]
    kinds = [p.kind if p else None for p in picks]
    assert kinds.count("gsm8k") == 20 and kinds.count("mmlu") == 10 and kinds.count(None) == 70
    assert max(len(run) for run in "".join("g" if k else "." for k in kinds).split(".")) <= 2  # interleaved


def test_the_interval_is_wilsons():
    low, high = wilson(70, 100)
    assert (round(low, 4), round(high, 4)) == (0.6041, 0.7811)
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == 1.0


def test_a_model_right_70_percent_of_the_time_measures_70_percent_under_load(tmp_path):
    """The embedded emulator answers 70 % of the graded items right (interleaved), while it serves the run's own
    workload too: 50 graded requests of 100 read 70 % exactly, with Wilson's interval; accuracy[gsm8k]>=0.8 fails
    the run with one line, and the answers' lengths are the model's (no ignore_eos for a graded request)."""
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "4", "-r", "4", "-t", "120s",
                          "--num-requests", "100", "--accuracy", f"gsm8k:{DATA / 'gsm8k-mini.jsonl'}:0.5",
                          "--emulator-graded-correct", "0.7", "--slo", "accuracy[gsm8k]>=0.8",
                          "--input-tokens", "32", "--output-tokens", "16", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 3, res.stdout[-3000:] + res.stderr[-3000:]
    logs = read_log(run_dir / "requests.jsonl")
    graded = [r for r in logs if r["graded"] == "gsm8k"]
    assert len(graded) == 50 and all(r["ok"] and r["name"] == "gsm8k" for r in graded)
    assert sum(r["correct"] for r in graded) == 35 and all(r["correct"] is None for r in logs if not r["graded"])
    assert all(r["output_tokens"] < 16 and r["finish_reason"] == "stop" for r in graded)  # the model stopped
    s = json.loads((run_dir / "summary.json").read_text())
    named = s["summary"]["names"]["gsm8k"]
    assert named["accuracy"] == 0.7 and named["graded"] == 50
    assert named["accuracy_ci"] == pytest.approx(list(wilson(35, 50)))
    low, high = wilson(35, 50)
    assert (f"accuracy [gsm8k]: 70.0% (35 of 50 graded answers right; 95% interval {low * 100:.1f}-{high * 100:.1f}%)"
            in res.stdout)
    assert "FAIL  accuracy[gsm8k]>=0.8" in res.stdout and s["slo"][0]["passed"] is False


def test_compare_shows_each_shared_sets_accuracy_and_whether_their_intervals_part():
    from vllm_load.metrics.summary import RunSummary, accuracy_rows

    def run(right: int) -> RunSummary:
        named = {"graded": 100, "accuracy": right / 100, "accuracy_ci": list(wilson(right, 100))}
        return RunSummary.of({"names": {"gsm8k": named, "chat": {"requests": 3}}})

    rows = accuracy_rows(run(90), run(50))
    assert [(r["metric"], r["a"], r["b"], r["significant"]) for r in rows] == [("accuracy[gsm8k]", 90.0, 50.0, True)]
    assert accuracy_rows(run(70), run(74))[0]["significant"] is False  # within each other's interval
