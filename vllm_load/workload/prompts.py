"""Prompts of an exact token length under the target's tokenizer, with unique content.

How exactness is reached without decode/re-encode drift: we pick a vocabulary of *words* that are
each one token when they stand between spaces (checked against the tokenizer itself), build the
text from whole words, and count the finished text the way the server will (chat template
included). A word boundary never merges, so N - overhead words give N tokens; the final count is
still verified for every prompt and corrected, never assumed.

How uniqueness is reached: the first words of every prompt spell a 64-bit digest of
(run salt, source id, sequence number), so no two prompts of a run, and no two runs, share a
prefix beyond the template's own fixed tokens. ``shared_prefix_tokens`` deliberately puts a
run-wide common block in front, for users who want to measure prefix caching.
"""

from __future__ import annotations

import array
import functools
import hashlib
import random
import re
import sys
from dataclasses import dataclass, field
from typing import Literal

from vllm_load.errors import UsageError
from vllm_load.workload.tokenizer import Tokenizer

Api = Literal["chat", "completions"]


def prompt_api(api: str) -> Api:
    """How a request API's texts are built and counted: a Responses input as chat messages, a pooling input
    (embeddings, rerank, score) as a completion prompt (each text on its own, the tokenizer's special tokens
    included, as vLLM counts it)."""
    return "chat" if api in ("chat", "responses", "messages") else "completions"

_WORD = re.compile(r"^[a-z]{3,10}$")
#: trace blocks kept as text per factory (~450 bytes each at 64 tokens): a 128k-token context is 2,000 blocks
BLOCKS_KEPT = 32768
#: Words that carry the uniqueness digest; 4 words of a >=4096-word vocabulary give >= 48 bits.
DIGEST_WORDS = 4


@dataclass
class Prompt:
    """A prompt ready to send, with the token count that the server must report."""

    tokens: int
    text: str = ""
    messages: list[dict[str, str]] = field(default_factory=list)


@functools.lru_cache(maxsize=8)
def _safe_words(tok: Tokenizer) -> tuple[str, ...]:
    """Lower-case words that are exactly one token between spaces, in this tokenizer."""
    hf = tok.hf
    candidates: list[str] = []
    for piece in hf.get_vocab():
        # SentencePiece marks a leading space with U+2581, GPT-2 byte-level BPE with U+0120,
        # Tekken keeps the space itself
        if piece[:1] in ("\u2581", "\u0120", " ") and _WORD.match(piece[1:]):
            candidates.append(piece[1:])
    candidates = sorted(set(candidates))
    base = len(tok.encode("of the of", add_special_tokens=False))
    probes = [f"of {w} of" for w in candidates]
    counts = tok.count_batch(probes, add_special_tokens=False) if probes else []
    words = tuple(w for w, n in zip(candidates, counts) if n == base)
    if len(words) < 256:
        raise UsageError(
            f"tokenizer {tok.name!r} has only {len(words)} one-token words: it cannot build exact prompts; "
            "pass --tokenizer with the model's real tokenizer"
        )
    return words


@functools.lru_cache(maxsize=8)
def _words_add_up(tok: Tokenizer) -> bool:
    """No token of the vocabulary spans a space after a letter (a SentencePiece or byte-level BPE vocabulary,
    whose merges stop at spaces): then a text of one-token words separated by spaces has exactly as many
    tokens as words, whatever its length, and needs no counting."""
    marks = "\u2581\u0120 "
    return not any(re.search(f"[A-Za-z][{marks}]", piece) for piece in tok.hf.get_vocab())


def _draw(vocab: tuple[str, ...], seed: bytes, n: int) -> list[str]:
    """``n`` words of ``vocab`` drawn from ``seed``'s SHAKE-256 stream, 32 bits a word: the same seed, the same
    words, on every machine. A random.Random seeded per prompt cost the prompt thread (which holds the GIL
    for it) 10.6 us at 28 words and 27 us at 136, this 2.7 and 7.7 us (modulo bias < 1e-5 for any vocabulary
    under 40,000 words)."""
    values = array.array("I", hashlib.shake_256(seed).digest(4 * n))
    if sys.byteorder == "big":
        values.byteswap()
    size = len(vocab)
    return [vocab[v % size] for v in values]


@functools.lru_cache(maxsize=32)
def _start_words(tok: Tokenizer, api: str, system_prompt: str | None, overhead: int) -> tuple[str, ...]:
    """``PromptFactory._start_words``, once per tokenizer, API and system prompt: 3,000 chat templates rendered
    took 0.7 s of CPU, and every factory of a run (the target's check, each pool's, the helper's) and every run of a
    process (the web UI's, the tests') made it again."""
    words = _safe_words(tok)
    pool = words[:3000]
    if api == "completions":
        counts = tok.count_batch(list(pool), add_special_tokens=True)
    else:
        system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        counts = tok.count_chat_batch([[*system, {"role": "user", "content": w}] for w in pool])
    start = tuple(w for w, n in zip(pool, counts) if n == overhead + 1)
    return start if len(start) >= 64 else words


class PromptFactory:
    """Builds prompts of exactly N tokens for one API, unique per (salt, source, sequence)."""

    def __init__(
        self,
        tok: Tokenizer,
        api: Api,
        salt: str,
        source_id: str = "",
        shared_prefix_tokens: int = 0,
        system_prompt: str | None = None,
    ) -> None:
        self.tok = tok
        self.api = api
        self.salt = salt
        self.source_id = source_id
        self.words = _safe_words(tok)
        self.shared_prefix_tokens = shared_prefix_tokens
        self.system_prompt = system_prompt
        self.seq = 0
        shared_rng = random.Random(f"{salt}/shared-prefix")
        self._shared = [shared_rng.choice(self.words) for _ in range(shared_prefix_tokens)]
        self.overhead = self._count(["word"]) - 1
        self.start_words = self._start_words()
        self.min_tokens = self.overhead + shared_prefix_tokens + 1
        self.words_add_up = _words_add_up(tok)
        self._blocks: dict[tuple[int, int], str] = {}  # (hash id, block size) -> its words (``_block_text``)

    def _render(self, words: list[str], content: str | None = None) -> Prompt:
        text = " ".join(words) if content is None else (" ".join(words) + "\n" + content if words else content)
        if self.api == "completions":
            return Prompt(tokens=0, text=text)
        messages = [{"role": "user", "content": text}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return Prompt(tokens=0, messages=messages)

    def count(self, prompt: Prompt) -> int:
        if self.api == "completions":
            return self.tok.count_completion(prompt.text)
        return self.tok.count_chat(prompt.messages)

    def _count(self, words: list[str]) -> int:
        return self.count(self._render(words))

    def _start_words(self) -> tuple[str, ...]:
        """Words that stay one token as the content's first word (byte-level BPE has no space there),
        so the very first content token already differs between prompts."""
        return _start_words(self.tok, self.api, self.system_prompt, self.overhead)

    def _unique_words(self, seq: int, n: int) -> list[str]:
        digest = hashlib.blake2b(f"{self.salt}/{self.source_id}/{seq}".encode(), digest_size=16).digest()
        value = int.from_bytes(digest, "big")
        head: list[str] = []
        for i in range(min(DIGEST_WORDS, n)):
            vocab = self.start_words if i == 0 and not self.shared_prefix_tokens else self.words
            value, idx = divmod(value, len(vocab))
            head.append(vocab[idx])
        return head + _draw(self.words, digest, n - len(head))

    def wrap(self, content: str) -> Prompt:
        """A prompt around given content (a dataset record), behind this prompt's unique digest words on a
        line of their own (glued to the content, they would change how its first word tokenizes)."""
        seq = self.seq
        self.seq += 1
        words = self._shared + self._unique_words(seq, DIGEST_WORDS)
        prompt = self._render(words, content)
        prompt.tokens = self.count(prompt)
        return prompt

    def _block_words(self, hash_id: int, size: int) -> list[str]:
        """The words of one trace block: the same hash id, the same words, for the whole run (its salt)."""
        seed = f"{self.salt}/block/{hash_id}".encode()
        return _draw(self.start_words, seed + b"/0", 1) + _draw(self.words, seed, size - 1)

    def _block_text(self, hash_id: int, size: int) -> str:
        """One block's words as text, kept: an agent's turns re-send the same blocks (2,000 of them at 128k
        tokens), drawn once each instead of on every turn."""
        key = (hash_id, size)
        text = self._blocks.pop(key, None)
        if text is None:
            text = " ".join(self._block_words(hash_id, size))
            if len(self._blocks) >= BLOCKS_KEPT:
                del self._blocks[next(iter(self._blocks))]
        self._blocks[key] = text  # most recently used last
        return text

    def from_blocks(self, hash_ids: tuple[int, ...], block_size: int, n_tokens: int) -> Prompt:
        """A prompt of exactly ``n_tokens`` tokens whose content is the trace's blocks in order (one word per
        token), cut where the length ends, with unique words after the last block when it is longer: two
        prompts share exactly the blocks their hash ids share, plus the template's own leading tokens."""
        if n_tokens < self.overhead + 1:
            raise UsageError(f"a trace row asks for {n_tokens} input tokens: a {self.api} prompt needs at least "
                             f"{self.overhead + 1} with this tokenizer (template {self.overhead} + 1)")
        seq = self.seq
        self.seq += 1
        want = n_tokens - self.overhead
        if self.words_add_up:
            prompt = self._blocks_by_count(hash_ids, block_size, seq, want)
            if prompt is not None:
                return prompt
        words: list[str] = []
        for h in hash_ids:
            if len(words) >= want + 8:
                break
            words += self._block_words(h, block_size)
        if len(words) < want + 8:
            words += self._unique_words(seq, want + 8 - len(words))
        return self._fit([], words, want, n_tokens)

    def _blocks_by_count(self, hash_ids: tuple[int, ...], block_size: int, seq: int, want: int) -> Prompt | None:
        """``from_blocks`` without tokenizing the whole text (680 ms at 128k tokens): with a vocabulary whose
        tokens never span a space (``words_add_up``), ``want`` words are ``want`` tokens; the template's edges
        are counted with this prompt's own first and last words. None where they do not add up (then counted
        in full). The server's usage checks every request's count."""
        parts: list[str] = []
        have = 0
        for h in hash_ids:
            if have >= want:
                break
            text = self._block_text(h, block_size)
            if have + block_size > want:
                text = " ".join(text.split(" ", want - have)[: want - have])
            parts.append(text)
            have += min(block_size, want - have)
        if have < want:
            parts.append(" ".join(self._unique_words(seq, want - have)))
        text = " ".join(parts)
        edges = text[:200].split(" ")[:4] + text[-200:].split(" ")[-4:] if want > 8 else text.split(" ")
        if self._count(edges) != self.overhead + len(edges):
            return None
        prompt = self._render([], text)
        prompt.tokens = self.overhead + want
        return prompt

    def _fit(self, head: list[str], body: list[str], want: int, n_tokens: int) -> Prompt:
        """``head`` and the first k words of ``body``, k adjusted until the server's count is ``n_tokens``
        (a word boundary that merges with the template's tokens moves the count by one or two)."""
        k = want
        for _ in range(8):
            prompt = self._render(head + body[:k])
            got = self.count(prompt)
            if got == n_tokens:
                prompt.tokens = got
                return prompt
            k += n_tokens - got
            if k < 1 or k > len(body):
                break
        raise UsageError(f"could not build an exact {n_tokens}-token prompt with tokenizer {self.tok.name!r}")

    def make(self, n_tokens: int) -> Prompt:
        """A fresh prompt of exactly ``n_tokens`` tokens as the server counts them."""
        if n_tokens < self.min_tokens:
            raise UsageError(
                f"a {self.api} prompt needs at least {self.min_tokens} tokens with this tokenizer "
                f"(template {self.overhead} + shared prefix {self.shared_prefix_tokens} + 1); asked {n_tokens}"
            )
        seq = self.seq
        self.seq += 1
        want = n_tokens - self.overhead - self.shared_prefix_tokens
        return self._fit(self._shared, self._unique_words(seq, want + 8), want, n_tokens)
