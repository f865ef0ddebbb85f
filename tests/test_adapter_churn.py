"""Adapter churn (features/adapter_churn.py) against what is known to be true: the emulator's LoRA slots
(``--max-loras N``) load an adapter not loaded (the least recently used one evicted), each load costing the request
``--lora-load-seconds`` and counted in ``vllm_emulator:lora_loads_total{lora_name}``; it says its slots in vLLM's
``vllm:lora_requests_info{max_lora}``. The verdict's loads are held to that counter, adapter by adapter."""

import json
import urllib.request

import pytest

from tests.helpers import ROOT, run_in_process
from vllm_load.errors import EXIT_BAD_INPUT, EXIT_OK, EXIT_SLO_MISS
from vllm_load.features.adapter_churn import FEATURE, cold_requests

CHAT = str(ROOT / "locustfiles" / "chat.py")
ADAPTERS = ("a", "b", "c", "d")


def test_the_lru_model_loads_an_adapter_evicted_or_never_loaded():
    logs = [{"name": n, "start": float(i)} for i, n in enumerate("aabacbba")]
    assert cold_requests(logs, {"a", "b", "c"}, 2) == [True, False, True, False, True, True, False, True]
    assert cold_requests(logs, {"a", "b", "c"}, 3) == [True, False, True, False, True, False, False, False]


def _loads(url: str) -> dict[str, int]:
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    out: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("vllm_emulator:lora_loads_total{"):
            out[line.split('lora_name="', 1)[1].split('"', 1)[0]] = int(float(line.rsplit(" ", 1)[1]))
    return out


def _run(tmp_path, emu, name, *extra, seconds: str = "5s"):
    (tmp_path / name).mkdir()
    res = run_in_process(["-f", CHAT, "--headless", "-t", seconds, "--host", emu.url, "--tokenizer",
                          "builtin:mistral-7b-v0.1", "--output-tokens", "8", "--no-history", *extra], tmp_path / name)
    data = json.loads((tmp_path / name / res.run_dir / "summary.json").read_text())
    return res, data, data["summary"]["features"].get("adapter_churn")


@pytest.mark.parametrize("slots, mix, users", [(1, "base,a,b,c,d", "4"), (2, "base:0.2,a:0.4,b:0.2,c:0.1,d:0.1", "1")])
def test_four_adapters_over_fewer_slots_load_as_often_as_the_server_loaded_them(tmp_path, emulator_factory, slots,
                                                                                mix, users):
    emu = emulator_factory("--model", "base", "--tokenizer", "builtin:mistral-7b-v0.1", "--lora-modules", *ADAPTERS,
                           "--max-loras", str(slots), "--lora-load-seconds", "0.15", "--ttft", "0.02", "--itl", "0.005")
    res, data, part = _run(tmp_path, emu, "run", "-u", users, "-r", users, "--model", mix, "--slo", "lora_penalty<=50%")
    assert part["slots"] == slots and part["slots_from"] == "the server's vllm:lora_requests_info", part
    truth = _loads(emu.url)
    model = {n: a["loads"] for n, a in part["adapters"].items()}
    assert set(truth) == set(ADAPTERS) and part["base"] == "base"
    if users == "1":  # one request at a time: the log's order is the server's, and the model its count exactly
        assert model == truth
    else:  # 4 at once: two sent together may reach the server in the other order (seen: 1 load of 92 apart)
        assert all(abs(model[n] - truth[n]) <= 1 for n in ADAPTERS), (model, truth)
        assert abs(part["loads"] - sum(truth.values())) <= 0.03 * sum(truth.values()), (model, truth)
    for a in part["adapters"].values():  # a load costs its request 150 ms: the loaded ones' TTFT shows it
        assert a["cold_ttft_p50"] >= 0.15 and (a["warm_ttft_p50"] is None or a["warm_ttft_p50"] < 0.15)
    assert part["penalty"] > 0.5 and res.code == EXIT_SLO_MISS and data["lora_penalty"] == part["penalty"]
    assert f"4 adapters over {slots} slot(s) (the server's vllm:lora_requests_info)" in res.stdout
    if slots == 2:  # the hot adapter stays loaded most of the time: fewer loads than requests
        assert 0 < part["adapters"]["a"]["loads"] < part["adapters"]["a"]["requests"]


def test_as_many_slots_as_adapters_is_no_churn_and_a_server_that_says_none_takes_max_loras(tmp_path, emulator_factory):
    emu = emulator_factory("--model", "base", "--tokenizer", "builtin:mistral-7b-v0.1", "--lora-modules", *ADAPTERS,
                           "--ttft", "0.02", "--itl", "0.005")  # no slots: it says none
    res, _, part = _run(tmp_path, emu, "said", "-u", "2", "-r", "2", "--model", "base,a,b,c,d", "--max-loras", "2",
                        seconds="2s")  # what the slots are said to be needs a few requests, not a churn's count
    assert res.code == EXIT_OK and part["slots"] == 2 and part["slots_from"] == "--max-loras 2"
    res, _, part = _run(tmp_path, emu, "none", "-u", "2", "-r", "2", "--model", "base,a,b", "--max-loras", "2",
                        seconds="2s")
    assert "adapters" not in (part or {}) and "adapter churn" not in res.stdout  # 2 adapters fit 2 slots
    res, _, part = _run(tmp_path, emu, "unknown", "-u", "2", "-r", "2", "--model", "base,a,b,c,d", "--slo",
                        "lora_penalty<=50%", seconds="2s")
    assert part["slots"] == 0 and "give --max-loras N" in res.stdout and res.code != EXIT_OK


def test_a_negative_slot_count_is_one_line_and_exit_2(tmp_path):
    res = run_in_process(["-f", CHAT, "--headless", "-u", "1", "-t", "2s", "--no-history", "--max-loras", "-1"], tmp_path)
    assert res.code == EXIT_BAD_INPUT and "--max-loras -1: a slot count is >= 1" in res.stdout + res.stderr


def test_compare_shows_the_load_share_of_a_and_b():
    a = {"share": 0.9, "interval": [0.8, 0.95]}
    b = {"share": 0.2, "interval": [0.1, 0.3]}
    (row,) = FEATURE.compare_rows(a, b)
    assert row["metric"] == "lora_reloads" and row["significant"] and row["a"] == pytest.approx(90.0)
