"""A conversation's next turn counted from its counted history equals a count of the whole text, for every turn of
growing, edited and interleaved conversations under three tokenizers; and it is counted from history (not in full)
wherever the history stands."""

import random

import pytest

from tests.tokenizers_fixture import build_byte_level_bpe
from vllm_load.workload.history import MIN_CHARS, HistoryCounter, common_prefix
from vllm_load.workload.tokenizer import BUILTIN_MISTRAL, BUILTIN_TEKKEN, load_tokenizer

PIECES = ["the", "of", "tool", "call", "résumé", "naïve", "日本語", "🙂", "x=1;", "  indented", "\n", "\n\n", "```py",
          "def f(a, b):", "return", "a+b", "(", ")", "'quoted'", "—", "3.14", "GET /v1/chat", "{\"k\": [1, 2]}", "\t"]


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    return build_byte_level_bpe(tmp_path_factory.mktemp("bpe"))


@pytest.fixture(scope="module", params=["mistral-sp", "byte-level-bpe"])
def tok(request, bpe_dir):
    return load_tokenizer({"mistral-sp": BUILTIN_MISTRAL}.get(request.param, str(bpe_dir)))


def text(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < chars:
        piece = rng.choice(PIECES)
        out.append(piece)
        size += len(piece) + 1
    return " ".join(out) if rng.random() < 0.5 else "".join(out)


def full(tok, messages):
    return len(tok.hf(tok.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                      add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("system", [False, True])
def test_every_turn_of_growing_conversations_counts_as_the_whole(tok, system):
    rng = random.Random(7)
    counter = HistoryCounter(tok)
    conversations = [[{"role": "system", "content": text(rng, 300)}] if system else [] for _ in range(3)]
    for c in conversations:
        c.append({"role": "user", "content": text(rng, MIN_CHARS * 2)})
    rendered = [""] * 3
    extends = 0  # turns whose text keeps most of the previous turn's (Mistral's template moves a system message
    # to the last user message: with one, a turn's text parts from the last one at its start)
    for _turn in range(6):
        for k, c in enumerate(conversations):  # interleaved: three conversations of one process, turn by turn
            assert counter.count_chat(c) == full(tok, c)
            now = tok.render_chat(c)
            extends += common_prefix(rendered[k], now) > len(rendered[k]) // 2 > 0
            rendered[k] = now
            c += [{"role": "assistant", "content": text(rng, rng.randint(1, 3000))},
                  {"role": "user", "content": text(rng, rng.randint(1, 2000))}]
    assert extends >= (0 if system and tok.name == BUILTIN_MISTRAL else 3 * 5)
    assert counter.incremental == extends, (counter.incremental, counter.full)


def test_an_edited_history_counts_as_the_whole(tok):
    rng = random.Random(11)
    counter = HistoryCounter(tok)
    messages = [{"role": "user", "content": text(rng, MIN_CHARS * 3)}]
    assert counter.count_chat(messages) == full(tok, messages)
    for _ in range(20):  # a character changed, inserted or removed anywhere in the history
        content = messages[0]["content"]
        at = rng.randrange(len(content))
        content = content[:at] + rng.choice(["", "z", " ", "\n", "é"]) + content[at + rng.randint(0, 2):]
        messages = [{"role": "user", "content": content}]
        assert counter.count_chat(messages) == full(tok, messages)


def test_a_tokenizer_without_offsets_counts_in_full():
    tok = load_tokenizer(BUILTIN_TEKKEN)
    counter = HistoryCounter(tok)
    messages = [{"role": "user", "content": "hello " * 3000}]
    assert counter.count_chat(messages) == len(tok.hf.apply_chat_template(messages, tokenize=True)["input_ids"])
    assert counter.incremental == 0


@pytest.mark.parametrize("a,b", [("", ""), ("abc", "abd"), ("abc", "abc"), ("abc", "abcdef"), ("x" * 200_000,
                                 "x" * 131_071 + "y"), ("x" * 70_000, "x" * 70_000)])
def test_common_prefix(a, b):
    n = next((i for i, (p, q) in enumerate(zip(a, b)) if p != q), min(len(a), len(b)))
    assert common_prefix(a, b) == n == common_prefix(b, a)
