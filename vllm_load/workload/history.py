"""Count a conversation's next turn from its counted history instead of tokenizing the whole of it again.

An agent's turn re-sends a history of 50k-200k tokens. Tokenizing that again on every turn costs the prompt
thread 680 ms for 128k tokens with the emulator's SentencePiece tokenizer (its pre-tokenizer does not split, so
BPE runs over the whole text at once). A new turn's rendered text starts with the previous turn's (the chat
template renders messages in order), so only the text after their common prefix needs tokens again:

- the previous text's token ids and each token's end (a character offset) are kept;
- the new text is re-encoded from a token end at least ``MARGIN`` characters before the two texts part, starting
  ``OVERLAP`` tokens earlier still, and accepted only when the overlapping tokens come out the same (ids and ends,
  from a token end both share): the two tokenizations are in step there, so the kept tokens before it stand;
- anything else (a short text, no kept history, a re-encode out of step, a tokenizer without offsets) is counted
  in full, as before.

The server's ``usage.prompt_tokens`` still checks every request's count, as it checks every other.
"""

from __future__ import annotations

import array
import bisect
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from vllm_load.workload.tokenizer import Tokenizer

#: characters between the last kept token's end and where the texts part: a merge never reaches this far back
#: (the longest token of the tokenizers here is under 50 characters)
MARGIN = 256
#: tokens re-encoded twice, before the kept part's end; at least half must come out the same for it to stand
OVERLAP = 16
#: texts shorter than this are counted in full (a few hundred microseconds): nothing kept for them
MIN_CHARS = 8192
#: the histories kept, at most this many tokens in all (8 bytes each, plus their text): ~100 MB
MAX_TOKENS_KEPT = 8_000_000
#: a kept history is looked up by its first characters (the template's head and the conversation's first words)
KEY_CHARS = 1024


@dataclass
class _History:
    text: str
    ids: array.array  # token ids, 'i'
    ends: array.array  # each token's end in ``text``, 'i'


def common_prefix(a: str, b: str) -> int:
    """The length of ``a`` and ``b``'s common prefix: 64 KB slices compared at C speed, then halved."""
    n = min(len(a), len(b))
    lo, step = 0, 1 << 16
    while lo < n:
        hi = min(n, lo + step)
        if a[lo:hi] == b[lo:hi]:
            lo = hi
            continue
        while hi - lo > 1:  # a[:lo] == b[:lo], a[:hi] != b[:hi]
            mid = (lo + hi) // 2
            if a[lo:mid] == b[lo:mid]:
                lo = mid
            else:
                hi = mid
        return lo
    return n


class HistoryCounter:
    """``count_chat`` of one process's prompt thread, remembering the conversations it counted (one thread only)."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        backend = getattr(tok.hf, "_tokenizer", None)
        #: the Rust backend's batch encode, with offsets (mistral-common tokenizers have none: counted in full)
        self._encode = backend.encode_batch if backend is not None and not tok.mistral_common else None
        self._kept: OrderedDict[int, _History] = OrderedDict()  # most recently used last
        self._tokens_kept = 0
        #: what the counts took, for the benchmark and the tests: turns counted from history, in full
        self.incremental = 0
        self.full = 0

    def count_chat(self, messages: list[dict[str, Any]], tools: list | None = None) -> int:
        return len(self.encode_chat(messages, tools))

    def encode_chat(self, messages: list[dict[str, Any]], tools: list | None = None) -> list[int] | array.array:
        """The prompt's token ids as ``Tokenizer.encode_chat`` gives them (the emulator hashes them into its
        prefix cache's blocks)."""
        if self._encode is None:
            return self.tok.encode_chat(messages, tools)
        text = self.tok.render_chat(messages, tools)
        if len(text) < MIN_CHARS:
            return self.tok.encode(text, add_special_tokens=False)
        ids, ends = self._tokens(text)
        self._keep(_History(text, ids, ends))
        return ids

    def _tokens(self, text: str) -> tuple[array.array, array.array]:
        for key, old in reversed(self._kept.items()):
            if not text.startswith(old.text[:KEY_CHARS]):
                continue
            got = self._from_history(old, text)
            if got is not None:
                self._forget(key)
                self.incremental += 1
                return got
        self.full += 1
        return self._encode_from(text, 0)

    def _from_history(self, old: _History, text: str) -> tuple[array.array, array.array] | None:
        cut = bisect.bisect_right(old.ends, common_prefix(old.text, text) - MARGIN)  # tokens kept as they are
        if cut <= OVERLAP:
            return None
        start = cut - OVERLAP  # re-encoded from the end of token start - 1
        ids, ends = self._encode_from(text, old.ends[start - 1])
        # in step: past a token end both encodings share (the re-encode's first token or two may differ: a
        # tokenizer treats the start of a text as a word's start, and may add a token of no width), the tokens up to the kept part's end are the same
        kept_ends = {e: i for i, e in enumerate(old.ends[start:cut], start)}
        j = next((j for j in range(min(4, len(ends) - 1)) if ends[j] in kept_ends and ends[j + 1] > ends[j]), None)
        if j is None:
            return None
        i = kept_ends[ends[j]]
        n = cut - 1 - i  # tokens that must agree
        if n < OVERLAP // 2 or ids[j + 1:j + 1 + n] != old.ids[i + 1:cut] or ends[j + 1:j + 1 + n] != old.ends[i + 1:cut]:
            return None
        return old.ids[:cut] + ids[j + 1 + n:], old.ends[:cut] + ends[j + 1 + n:]

    def _encode_from(self, text: str, at: int) -> tuple[array.array, array.array]:
        assert self._encode is not None
        enc = self._encode([text[at:] if at else text], add_special_tokens=False)[0]
        return array.array("i", enc.ids), array.array("i", [at + e for _, e in enc.offsets])

    def _keep(self, h: _History) -> None:
        self._kept[id(h)] = h
        self._tokens_kept += len(h.ids)
        while self._tokens_kept > MAX_TOKENS_KEPT and len(self._kept) > 1:
            self._forget(next(iter(self._kept)))

    def _forget(self, key: int) -> None:
        self._tokens_kept -= len(self._kept.pop(key).ids)
