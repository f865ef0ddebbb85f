"""The built-in Mistral tokenizer, read without transformers (workload/builtin_backend.py), counts and renders
exactly as transformers does on the same files."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys

import pytest
import transformers

from tests.helpers import ROOT
from vllm_load.workload.builtin_backend import CONFIG, BuiltinBackend
from vllm_load.workload.tokenizer import BUILTIN_MISTRAL, _builtin_mistral_dir, load_tokenizer


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """vllm-load's built-in tokenizer and transformers' from the SentencePiece model itself (its own conversion,
    not the ``tokenizer.json`` the folder keeps)."""
    folder = _builtin_mistral_dir()
    converted = tmp_path_factory.mktemp("sp")
    for name in ("tokenizer.model", CONFIG):
        shutil.copy(folder / name, converted / name)
    tok = load_tokenizer(BUILTIN_MISTRAL)
    assert isinstance(tok.hf, BuiltinBackend)
    return tok, transformers.AutoTokenizer.from_pretrained(str(converted))


def texts() -> list[str]:
    rng = random.Random(11)
    words = ["the", "Tokyo", "x", "ünïcode", "42", "3.14", "don't", "e-mail", "\u00a0", "ok!!", "<s>", "</s>", "a,b",
             "[INST]", "東京", "🚀", "\t", "\n\n", "  ", "<unk>", "▁x"]
    fixed = ["", " ", "hello", " leading space", "trailing  ", "<s> special </s> [INST] x [/INST]",
             "naïve café — 東京 🚀🚀", "a\n\nb\tc", "word " * 300, "".join(chr(0x4E00 + i) for i in range(200))]
    return fixed + [rng.choice(["", " ", "\n"]).join(rng.choice(words) for _ in range(rng.randint(1, 120)))
                    for _ in range(200)]


def test_the_ids_and_the_vocabulary_are_transformers_own(pair):
    tok, hf = pair
    assert tok.hf.get_vocab() == hf.get_vocab()
    assert tok.model_max_length == hf.model_max_length == 32768
    batch = texts()
    for special in (True, False):
        assert tok.encode_batch(batch, special) == hf(batch, add_special_tokens=special)["input_ids"]
        assert tok.hf(batch[5], add_special_tokens=special)["input_ids"] == hf(batch[5], add_special_tokens=special)[
            "input_ids"]
    assert tok.special_tokens_added == 1  # the BOS


CHATS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief & <polite>."}, {"role": "user", "content": "naïve 東京?"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
    [{"role": "system", "content": "s1"}, {"role": "user", "content": "u1"}, {"role": "assistant", "content": None},
     {"role": "system", "content": "s2"}, {"role": "user", "content": "u2"}],
    [{"role": "user", "content": "weather?"},
     {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
         "name": "get_weather", "arguments": "{\"city\": \"Zürich <CH>\"}"}}]},
     {"role": "tool", "tool_call_id": "c1", "content": "{\"t\": 21, \"sky\": \"clear & dry\"}"},
     {"role": "user", "content": "and tomorrow?"}],
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city, 'now' & <later>",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


@pytest.mark.parametrize("tools", [None, TOOLS], ids=["no-tools", "tools"])
@pytest.mark.parametrize("chat", range(len(CHATS)))
def test_the_chat_template_renders_as_transformers_renders_it(pair, chat, tools):
    tok, hf = pair
    messages = CHATS[chat]
    extra = {"tools": tools} if tools else {}
    want = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **extra)
    assert tok.render_chat(messages, tools) == want
    assert tok.count_chat(messages, tools) == len(hf(want, add_special_tokens=False)["input_ids"])
    assert json.dumps(messages) == json.dumps(CHATS[chat])  # the caller's messages untouched


def test_a_process_that_loads_it_never_imports_transformers(pair):
    """What the backend is for: a Locust process, worker or emulator that counts with the built-in tokenizer pays
    none of transformers' import (a process shows what it imported; this one starts in about a second)."""
    code = ("import sys; from vllm_load.workload.tokenizer import load_tokenizer; "
            f"t = load_tokenizer({BUILTIN_MISTRAL!r}); n = t.count_chat([{{'role': 'user', 'content': 'hi'}}]); "
            "print(n, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    hello = pair[1].apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert out.stdout.split() == [str(len(pair[1](hello, add_special_tokens=False)["input_ids"])), "False"]


def test_timing_a_tokenizer_neither_local_nor_cached_is_refused_at_once_when_the_hub_is_out_of_reach(monkeypatch):
    """huggingface_hub retried an unreachable hub for 50 s of warnings before the one-line error: now one
    connection (refused here) or offline mode decides, in one line, before anything starts."""
    import time

    from huggingface_hub import constants

    from vllm_load.errors import UsageError
    from vllm_load.workload.tokenizer import load_tokenizer

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:1")
    load_tokenizer.cache_clear()
    t0 = time.monotonic()
    with pytest.raises(UsageError, match=r"not in the Hugging Face cache, and http://127.0.0.1:1 cannot be reached"):
        load_tokenizer("some-org/never-cached")
    assert time.monotonic() - t0 < 5.0
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UsageError, match=r"the hub is off \(HF_HUB_OFFLINE\)"):
        load_tokenizer("some-org/never-cached-either")
    with pytest.raises(UsageError, match=r"cannot load tokenizer '/no/such/folder': no such folder"):
        load_tokenizer("/no/such/folder")
    assert load_tokenizer("builtin").name == "builtin"  # the built-in by its plain name


def test_a_tokenizer_that_cannot_load_is_refused_before_the_emulator_starts(tmp_path):
    """An unreachable tokenizer name was refused only after the embedded emulator had started (issue 76 item 3):
    the options' check refuses it first, in one line, exit 2, with nothing started."""
    from tests.helpers import run_in_process

    res = run_in_process(["-f", str(ROOT / "locustfiles" / "chat.py"), "--headless", "-u", "1", "-t", "5s",
                          "--tokenizer", "some-org/never-cached"], tmp_path,
                         env_extra={"HF_ENDPOINT": "http://127.0.0.1:1", "HF_HUB_OFFLINE": "0",
                                    "HF_HUB_CACHE": str(tmp_path / "hub")})
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    out = res.stdout + res.stderr
    assert "cannot load tokenizer 'some-org/never-cached'" in out and "EMULATOR" not in out
    assert not (tmp_path / "reports").exists() or not any((tmp_path / "reports").glob("2*"))
