"""What a prefix cache could hit on each replayed prompt: the leading blocks an earlier prompt of the run already sent.

A replayed turn's content is its trace blocks in order (``PromptFactory.from_blocks``: one hash id, one text), so two
prompts share exactly the leading blocks whose ids they share, whichever sessions they belong to: a session's next
turn, its first measured turn after the warm-up turn that primed it, a subagent on its parent's prefix, two sessions
on one system prompt. The blocks are keyed in a chain, as vLLM's prefix cache keys them: a block counts only when
every block before it was sent too. (Pairing each turn with its session's previous one missed the primed first turns
and the subagents: 14 % of an AgentX replay's hits, issue 73.) The count is of trace blocks that fit whole in the
prompt; the template's few leading tokens and the verdict's rounding to the server's blocks are the reader's.

One memory per load process, used by its prompt thread only. It forgets the blocks least recently sent beyond
``KEPT`` (64 M tokens of 64-token blocks: more than any server's KV cache holds, so nothing a server could still hit).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

#: blocks remembered (least recently sent forgotten first)
KEPT = 1_000_000


class BlockReuse:
    def __init__(self, kept: int = KEPT) -> None:
        self.kept = kept
        self.sent: OrderedDict[int, None] = OrderedDict()

    def send(self, hash_ids: Sequence[int], block_size: int, content_tokens: int) -> int:
        """Content tokens of this prompt in leading blocks an earlier prompt sent (whole blocks); the prompt's own
        whole blocks are remembered as sent."""
        whole = min(len(hash_ids), max(0, content_tokens) // block_size)
        key, shared, missed = hash(("blocks", block_size)), 0, False
        for h in hash_ids[:whole]:
            key = hash((key, h))
            if not missed and key in self.sent:
                shared += 1
                self.sent.move_to_end(key)
                continue
            missed = True
            self.sent[key] = None
        while len(self.sent) > self.kept:
            self.sent.popitem(last=False)
        return shared * block_size
