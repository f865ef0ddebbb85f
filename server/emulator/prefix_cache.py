"""The emulator's prefix cache: vLLM's automatic prefix caching, keyed on chained block hashes, and optionally the
CPU tier of vLLM's KV offloading connector behind it.

A prompt's full blocks (``block_size`` tokens) are hashed in a chain, so a block can only hit when
every block before it hit too, exactly as in vLLM. Hits and queries are counted in tokens, as
``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries`` count them. Eviction is LRU.

The offload tier (``--kv-offload-blocks N``, vLLM's ``--kv-offloading-size``): every block a request computes is
stored there too (write-through, as the connector stores each computed block), N blocks kept, LRU. A prompt's chain
is looked up on the GPU first; from its first GPU miss on, the connector continues it from the offload tier (vLLM's
``external`` hits, loaded back into the GPU's blocks); the rest is computed. The usage's cached tokens count both,
as vLLM's ``num_cached_tokens`` (local + external) does.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple


class Hits(NamedTuple):
    local: int  # tokens found in the GPU's blocks
    offloaded: int = 0  # tokens the connector loaded from the offload tier

    @property
    def total(self) -> int:
        return self.local + self.offloaded


class PrefixCache:
    def __init__(self, block_size: int = 16, capacity_blocks: int = 8192, offload_blocks: int = 0) -> None:
        self.block_size = block_size
        self.capacity = capacity_blocks
        self.blocks: OrderedDict[int, None] = OrderedDict()
        self.offload_capacity = offload_blocks
        self.offloaded: OrderedDict[int, None] = OrderedDict()

    def reset(self) -> None:
        """vLLM's POST /reset_prefix_cache: every cached block gone (the GPU's; the offload tier keeps its own)."""
        self.blocks.clear()

    def query(self, token_ids: list[int]) -> Hits:
        """Cached tokens of this prompt's prefix, by tier; the prompt's blocks are cached afterwards."""
        bs = self.block_size
        parent, local, loaded = 0, 0, 0
        local_missed = missed = False
        for start in range(0, len(token_ids) - len(token_ids) % bs, bs):
            parent = hash((parent, tuple(token_ids[start:start + bs])))
            if not local_missed and parent in self.blocks:
                local += bs
                self.blocks.move_to_end(parent)
                continue
            local_missed = True
            if not missed and parent in self.offloaded:
                loaded += bs
                self.offloaded.move_to_end(parent)
            else:
                missed = True
                self._store(parent)
            self.blocks[parent] = None
            if len(self.blocks) > self.capacity:
                self.blocks.popitem(last=False)
        return Hits(local, loaded)

    def _store(self, block: int) -> None:
        """A computed block written through to the offload tier (none when offloading is off)."""
        if self.offload_capacity <= 0:
            return
        self.offloaded[block] = None
        self.offloaded.move_to_end(block)
        if len(self.offloaded) > self.offload_capacity:
            self.offloaded.popitem(last=False)
