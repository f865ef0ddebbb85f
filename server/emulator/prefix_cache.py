"""The emulator's prefix cache: vLLM's automatic prefix caching, keyed on chained block hashes.

A prompt's full blocks (``block_size`` tokens) are hashed in a chain, so a block can only hit when
every block before it hit too, exactly as in vLLM. Hits and queries are counted in tokens, as
``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries`` count them. Eviction is LRU.
"""

from __future__ import annotations

from collections import OrderedDict


class PrefixCache:
    def __init__(self, block_size: int = 16, capacity_blocks: int = 8192) -> None:
        self.block_size = block_size
        self.capacity = capacity_blocks
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def reset(self) -> None:
        """vLLM's POST /reset_prefix_cache: every cached block gone."""
        self.blocks.clear()

    def query(self, token_ids: list[int]) -> int:
        """Cached tokens of this prompt's prefix; the prompt's blocks are cached afterwards."""
        bs = self.block_size
        parent, hits, missed = 0, 0, False
        for start in range(0, len(token_ids) - len(token_ids) % bs, bs):
            parent = hash((parent, tuple(token_ids[start:start + bs])))
            if not missed and parent in self.blocks:
                hits += bs
                self.blocks.move_to_end(parent)
                continue
            missed = True
            self.blocks[parent] = None
            if len(self.blocks) > self.capacity:
                self.blocks.popitem(last=False)
        return hits
