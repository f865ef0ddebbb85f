"""The greedy reference check (--reference N, features/reference.py) against what is known to be true: the emulator's
diverge fault parts an answer from its prompt's answer alone at a set token, only while at least N requests run
(``--fault diverge:1 --faults-from 8 --diverge-at 5``), and counts each in ``vllm_emulator:diverged_answers_total``.
The verdict is held to that counter, to the emulator's set position, and to an independent comparison of the logged
answers."""

import json
import urllib.request

import pytest

from server.emulator.plan import answer_words
from tests.helpers import ROOT, run_in_process
from vllm_load.errors import EXIT_BAD_INPUT, EXIT_OK, EXIT_SLO_MISS
from vllm_load.features.reference import FEATURE, first_divergence, in_flight_at

CHAT = str(ROOT / "locustfiles" / "chat.py")


def test_the_emulators_diverged_words_part_at_the_set_token_and_only_there():
    import itertools

    alone = list(itertools.islice(answer_words(), 40))
    parted = list(itertools.islice(answer_words(5), 40))
    assert alone[:5] == parted[:5] and all(a != b for a, b in zip(alone[5:], parted[5:]))


@pytest.mark.parametrize("a, b, at", [([1, 2, 3], [1, 2, 3], None), ([1, 2, 3], [1, 9, 3], 1), ([1, 2], [1, 2, 3], 2),
                                      ([], [], None), ([4], [5], 0)])
def test_the_first_divergence_is_the_first_token_that_differs(a, b, at):
    assert first_divergence(a, b) == at


def test_in_flight_counts_the_requests_started_and_not_ended():
    logs = [{"start": 0.0, "e2e": 2.0}, {"start": 1.0, "e2e": 0.5}, {"start": 3.0, "e2e": 1.0}]
    flight = in_flight_at(logs)
    assert [flight(t) for t in (0.0, 1.2, 1.6, 2.5, 3.0)] == [1, 2, 1, 0, 1]


def _ref(i, alone, ids, start, e2e=0.1, step=None):
    return {"start": start, "e2e": e2e, "ok": True, "step": step, "reference": {"i": i, "alone": alone, "ids": ids,
                                                                                 "by": "text"}}


def test_the_part_counts_identical_and_diverged_answers_and_where_they_parted():
    logs = [_ref(0, True, [1, 2, 3, 4], 0.0), _ref(1, True, [5, 6, 7, 8], 1.0)]
    logs += [_ref(0, False, [1, 2, 3, 4], 10.0), _ref(1, False, [5, 6, 0, 0], 11.0)]
    logs += [{"start": 10.95, "e2e": 1.0, "ok": True}] * 3  # three of the load's requests beside the second
    part = FEATURE.from_logs(logs, {})
    assert part["compared"] == 2 and part["identical"] == 1 and part["share"] == 0.5
    assert part["first_divergence"]["min"] == 2 and part["diverged_from"] == 4 and part["identical_up_to"] == 1
    assert FEATURE.slo_value(part, "reference_identical", None) == (0.5, "")
    lines = FEATURE.lines(part, {})
    assert lines[0].startswith("reference: 1 of 2 answers beside the load identical to the same prompt alone (50.0 %")
    assert lines[1] == "reference: 1 diverged, first at token 2 (median 2, last 2), from 4 requests in flight, " \
                       "identical up to 1"
    assert FEATURE.json_keys(part) == {"reference_identical": 0.5}


@pytest.mark.parametrize("args, said", [(["--reference", "-1"], "--reference -1: ask 1 to 1000 prompts"),
                                        (["--reference", "4", "--reference-tokens", "1"], "at least 2 tokens"),
                                        (["--reference", "4", "--processes", "2"], "runs in one process"),
                                        (["--reference", "4", "--num-requests", "9"], "end the run by -t")])
def test_bad_reference_options_are_one_line_and_exit_2(tmp_path, args, said):
    res = run_in_process(["-f", CHAT, "--headless", "-u", "1", "-t", "2s", "--no-history", *args], tmp_path)
    assert res.code == EXIT_BAD_INPUT and said in res.stdout + res.stderr


def _diverged(url: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm_emulator:diverged_answers_total"))


def _independent(logs):
    """The logged answers compared here, apart from the feature's code: (identical, diverged positions)."""
    alone = {r["reference"]["i"]: r["reference"]["ids"] for r in logs if r.get("reference") and r["reference"]["alone"]}
    same, at = 0, []
    for r in logs:
        if r.get("reference") and not r["reference"]["alone"]:
            a, b = alone[r["reference"]["i"]], r["reference"]["ids"]
            parted = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
            same += not parted and len(a) == len(b)
            at += parted[:1]
    return same, at


def test_identical_alone_and_diverged_under_load_where_the_emulator_parted_them(tmp_path, emulator_factory):
    emu = emulator_factory("--fault", "diverge:1", "--faults-from", "8", "--diverge-at", "5", "--ttft", "0.02",
                           "--itl", "0.005")
    args = ["-f", CHAT, "--headless", "-t", "4s", "--host", emu.url, "--reference", "4", "--output-tokens", "16",
            "--slo", "reference_identical>=100%", "--no-history"]
    for d in ("alone", "busy"):
        (tmp_path / d).mkdir()
    quiet = run_in_process([*args, "-u", "1", "-r", "1"], tmp_path / "alone")
    data = json.loads((tmp_path / "alone" / quiet.run_dir / "summary.json").read_text())
    part = data["summary"]["features"]["reference"]
    assert quiet.code == EXIT_OK and part["compared"] >= 4 and part["identical"] == part["compared"], quiet.stdout[-2000:]
    assert _diverged(emu.url) == 0  # 2 requests at most ran at once: the server parted none
    busy = run_in_process([*args, "-u", "16", "-r", "16"], tmp_path / "busy")
    run_dir = tmp_path / "busy" / busy.run_dir
    data = json.loads((run_dir / "summary.json").read_text())
    part = data["summary"]["features"]["reference"]
    logs = [json.loads(x) for x in (run_dir / "requests.jsonl").read_text().splitlines()]
    same, at = _independent(logs)
    assert busy.code == EXIT_SLO_MISS and part["identical"] == same and part["compared"] - same == len(at) > 0
    # where the server parted them: every diverged answer's text parts at the 5th word (one token each here)
    assert set(at) == {5} and part["first_divergence"]["min"] == part["first_divergence"]["max"] == 5
    # the server parted every reference answer it ran beside 7 others: each diverged answer is one it counted
    assert _diverged(emu.url) >= part["compared"] - part["identical"]
    # the requests in flight are the log's: counted here apart from the feature, at each compared answer's send.
    # The server parts an answer by its own count at the 5th token, later than the send (a busy host's ramp put 4
    # in flight at one send that 8 had joined by then): the client's count at the send is a lower bound, no switch
    alone = {r["reference"]["i"]: r["reference"]["ids"] for r in logs if r.get("reference") and r["reference"]["alone"]}
    parted = [r["start"] for r in logs if r.get("reference") and not r["reference"]["alone"]
              and r["reference"]["ids"] != alone[r["reference"]["i"]]]
    assert part["diverged_from"] == min(sum(q["start"] <= t < q["start"] + q["e2e"] for q in logs) for t in parted) >= 2
    assert data["reference_identical"] == part["share"] and not data["slo"][0]["passed"]
    assert "answers beside the load identical to the same prompt alone" in busy.stdout
