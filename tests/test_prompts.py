"""Prompts are exact under the server's counting (chat template included) and unique."""

import functools
import random

import pytest

from tests.tokenizers_fixture import build_byte_level_bpe
from vllm_load.errors import UsageError
from vllm_load.workload.lengths import parse_length
from vllm_load.workload.prompts import DIGEST_WORDS, PromptFactory
from vllm_load.workload.builtin_backend import BuiltinBackend
from vllm_load.workload.tokenizer import BUILTIN_MISTRAL, BUILTIN_TEKKEN, _builtin_mistral_dir, load_tokenizer


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    return build_byte_level_bpe(tmp_path_factory.mktemp("bpe"))


@pytest.fixture(scope="module", params=["mistral-sp", "mistral-tekken", "byte-level-bpe"])
def tok(request, bpe_dir):
    return load_tokenizer({"mistral-sp": BUILTIN_MISTRAL, "mistral-tekken": BUILTIN_TEKKEN}.get(request.param, str(bpe_dir)))


@functools.lru_cache(maxsize=4)
def transformers_of(tok):
    """The tokenizer as transformers loads it: the built-in Mistral's folder through ``AutoTokenizer`` (vllm-load
    reads it without transformers: workload/builtin_backend.py), any other as loaded."""
    if isinstance(tok.hf, BuiltinBackend):
        import transformers

        return transformers.AutoTokenizer.from_pretrained(str(_builtin_mistral_dir()))
    return tok.hf


def independent_count(tok, api, prompt):
    """Count the way vLLM does, straight through transformers (not through our helpers)."""
    hf = transformers_of(tok)
    if api == "completions":
        return len(hf(prompt.text, add_special_tokens=True)["input_ids"])
    if tok.mistral_common:
        return len(hf.apply_chat_template(prompt.messages, tokenize=True)["input_ids"])
    text = hf.apply_chat_template(prompt.messages, add_generation_prompt=True, tokenize=False)
    return len(hf(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_exact_for_many_random_lengths(tok, api):
    f = PromptFactory(tok, api, salt="exact")
    rng = random.Random(7)
    lengths = list(range(f.min_tokens, f.min_tokens + 40)) + [rng.randint(f.min_tokens, 3000) for _ in range(60)]
    for n in lengths:
        p = f.make(n)
        assert p.tokens == n
        assert independent_count(tok, api, p) == n


def test_exact_at_32k(tok):
    f = PromptFactory(tok, "completions", salt="big")
    p = f.make(32000)
    assert independent_count(tok, "completions", p) == 32000


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_below_the_minimum_is_a_clear_error(tok, api):
    f = PromptFactory(tok, api, salt="min")
    with pytest.raises(UsageError, match="at least"):
        f.make(f.min_tokens - 1)


def ids_of(tok, api, p):
    return tok.hf(p.text, add_special_tokens=True)["input_ids"] if api == "completions" else tok.encode_chat(p.messages)


def shared_prefix_tokens(tok, api, a, b):
    return common_head(ids_of(tok, api, a), ids_of(tok, api, b))


def common_head(ia, ib):
    n = 0
    while n < min(len(ia), len(ib)) and ia[n] == ib[n]:
        n += 1
    return n


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_no_shared_prefix_beyond_the_template(tok, api):
    runs = [PromptFactory(tok, api, salt=s, source_id=w) for s in ("run-a", "run-b") for w in ("w1", "w2")]
    prompts = [f.make(64) for f in runs for _ in range(50)]
    fixed = runs[0].overhead if api == "chat" else 1  # template tokens before the content / BOS
    texts = {p.text or p.messages[0]["content"] for p in prompts}
    assert len(texts) == len(prompts)
    heads = {tuple((p.text or p.messages[0]["content"]).split()[:DIGEST_WORDS]) for p in prompts}
    assert len(heads) == len(prompts)
    ids = [ids_of(tok, api, p) for p in prompts]  # each encoded once (pairwise, 12,000 encodes took 17 s)
    worst = max(common_head(a, b) for i, a in enumerate(ids) for b in ids[i + 1:i + 30])
    # the chat template's own leading tokens are shared by construction; one token of slack for
    # the first content word colliding by chance in a 1-of-thousands draw
    assert worst <= fixed + 1


def test_shared_prefix_is_deliberate_and_exact(tok):
    f = PromptFactory(tok, "completions", salt="pfx", shared_prefix_tokens=32)
    a, b = f.make(100), f.make(100)
    assert a.tokens == b.tokens == 100
    assert shared_prefix_tokens(tok, "completions", a, b) >= 1 + 32
    assert a.text != b.text


@pytest.mark.parametrize("spec, kind", [("128", "fixed"), ("100-200", "uniform"), ("uniform:5-9", "uniform"),
                                        ("normal:512,64", "normal")])
def test_length_specs(spec, kind):
    s = parse_length(spec, "--input-tokens")
    assert s.kind == kind
    rng = random.Random(0)
    values = [s.sample(rng) for _ in range(500)]
    assert all(v >= 1 for v in values)
    if kind == "uniform":
        assert min(values) == s.low and max(values) == s.high


@pytest.mark.parametrize("spec", ["0", "-5", "abc", "200-100", "normal:1", "uniform:x-y"])
def test_bad_length_specs(spec):
    with pytest.raises(UsageError, match="--input-tokens"):
        parse_length(spec, "--input-tokens")


def test_the_fast_count_is_transformers_own(tok):
    """The prompt thread's direct call of the Rust tokenizer counts exactly as transformers' __call__."""
    texts = ["", "hello", " leading space", "<s> special </s> [INST] x [/INST]", "naïve café — 東京 🚀🚀",
             "a\n\nb\tc", "word " * 500, "".join(chr(0x4E00 + i) for i in range(300))]
    rng = random.Random(7)
    words = ["the", "Tokyo", "x", "ünïcode", "42", "3.14", "don't", "e-mail", "\u00a0", "ok!!", "<s>", "a,b"]
    texts += [rng.choice(["", " "]).join(rng.choice(words) for _ in range(rng.randint(1, 200))) for _ in range(50)]
    if tok.mistral_common:  # encoded by mistral-common, never through this path
        return
    assert tok._encode_many is not None
    if hasattr(tok.hf._tokenizer, "encode_batch_fast"):  # the offsets-free call where tokenizers has it
        assert tok._encode_many.__name__ == "encode_batch_fast"
    hf = transformers_of(tok)
    for text in texts:
        for special in (True, False):
            assert tok.encode(text, special) == hf(text, add_special_tokens=special)["input_ids"], text[:40]
    for special in (True, False):  # the batch count too (the start-up probes, chat batches)
        assert tok.count_batch(texts, special) == [len(hf(t, add_special_tokens=special)["input_ids"]) for t in texts]


def test_a_load_generator_encodes_in_its_own_low_priority_thread(monkeypatch):
    """Once its pools are ready, a load generator's tokenizer batches run in the calling thread (the prompt
    thread, at nice 10), not in tokenizers' pool threads, which run at the event loop's priority."""
    import threading
    import time

    from vllm_load.workload.tokenizer import PARALLELISM_ENV, encode_in_calling_thread

    tok = load_tokenizer(BUILTIN_MISTRAL)
    texts = [f"word {i} " * 200 for i in range(400)]

    def caller_share() -> float:
        """The calling thread's share of the CPU one batch encode took in the whole process."""
        got = {}

        def work() -> None:
            t, p = time.thread_time(), time.process_time()
            tok.count_batch(texts, add_special_tokens=False)
            got["share"] = (time.thread_time() - t) / max(1e-9, time.process_time() - p)

        th = threading.Thread(target=work)
        th.start()
        th.join()
        return got["share"]

    monkeypatch.setenv(PARALLELISM_ENV, "true")  # as load_tokenizer leaves it for the start-up probes
    assert caller_share() < 0.5  # the pool's threads did the work
    encode_in_calling_thread()
    assert caller_share() > 0.9


def test_a_system_message_counts_on_the_emulator_as_the_tokenizer_says(emulator_factory):
    """The built-in template puts a system message before the last user message (Mistral's v0.3 template);
    it once counted 0 tokens."""
    import json
    import urllib.request

    from vllm_load.workload.tokenizer import load_tokenizer

    tok = load_tokenizer("builtin:mistral-7b-v0.1")
    user = [{"role": "user", "content": "hello there"}]
    with_system = [{"role": "system", "content": "you answer in one short line"}, *user]
    assert tok.count_chat(with_system) > tok.count_chat(user)
    assert tok.render_chat(with_system).startswith("<s>[INST] you answer in one short line\n\nhello there")
    emu = emulator_factory()
    body = json.dumps({"messages": with_system, "max_tokens": 1}).encode()
    req = urllib.request.Request(emu.url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    usage = json.loads(urllib.request.urlopen(req, timeout=10).read())["usage"]
    assert usage["prompt_tokens"] == tok.count_chat(with_system)


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_trace_blocks_are_exact_at_any_length_without_counting_the_whole(tok, api):
    """A turn of an agent's session is its blocks at an exact length: words counted, not tokenized (680 ms at 128k
    tokens), and the same text as the path that counts the whole prompt until it is exact."""
    fast, counted = PromptFactory(tok, api, salt="blocks"), PromptFactory(tok, api, salt="blocks")
    counted.words_add_up = False
    assert fast.words_add_up  # these vocabularies have no token across a space: the fast path is what is tested
    rng = random.Random(3)
    for n in [fast.overhead + 1, fast.overhead + 9, 100, 1000, 5000, 40_000] + [rng.randint(20, 6000) for _ in range(8)]:
        ids = tuple(rng.randrange(50) for _ in range(n // 16 + rng.randint(-3, 3)))  # fewer or more blocks than n
        a, b = fast.from_blocks(ids, 16, n), counted.from_blocks(ids, 16, n)
        assert a.tokens == b.tokens == n == independent_count(tok, api, a)
        assert (a.messages, a.text) == (b.messages, b.text)


def test_a_vocabulary_with_tokens_across_spaces_counts_blocks_in_full(tok):
    class Spanning:  # the same tokenizer, its vocabulary claiming a token over a word boundary
        def __init__(self, inner):
            self.inner = inner

        def get_vocab(self):
            return {**self.inner.get_vocab(), "of\u2581the": 10**6}

    from vllm_load.workload.prompts import _words_add_up
    assert _words_add_up(tok) and not _words_add_up(type(tok)(name=tok.name + "+span", hf=Spanning(tok.hf)))
