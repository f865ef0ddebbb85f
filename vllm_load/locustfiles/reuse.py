"""The prefix cache's memory: `locust -f locustfiles/reuse.py --reuse-distance 0,4096,16384,65536 -u 1`.

A trial sends a prefix of --input-tokens (named ``prime``), then DISTANCE tokens of other work (``filler``
requests of --input-tokens each, content never seen before: DISTANCE is rounded up to whole fillers), then the
prefix again with one new block (named ``reuse@DISTANCE``). The server's own count of that request's cached tokens
(its usage) says whether the prefix outlived the work in between: the ``reuse curve`` line gives each distance's
cached share of the prefix, and the share falls to 0 where the server's KV cache (its blocks times their size)
can no longer hold the prefix beside the work since. A second user's trials are work between the first's too: run
-u 1 for the curve of one stream. Each user walks the distances in turn, every answer one token.

vLLM reports cached tokens in its usage only with --enable-prompt-tokens-details (and the emulator likewise:
without it the curve says n/a). A small cache forgets within seconds; with the emulator (64 blocks of 16 tokens,
so a 256-token prefix outlives 768 tokens of work and not 1,024):

    vllm-load-emulator --port 8123 --num-gpu-blocks 64 --block-size 16 --enable-prompt-tokens-details &
    locust -f locustfiles/reuse.py --headless -u 1 -t 40s --host http://127.0.0.1:8123 --input-tokens 256 \
        --reuse-distance 0,512,768,1024,2048

Written only against vllm-load's public API: copy it to start your own.
"""

from __future__ import annotations

import math
import random
from typing import Any

from locust import task

from vllm_load import LLMUser, UsageError

#: tokens per content block: vLLM's default KV block (a prefix hits block by block)
BLOCK = 16


def distances(text: str) -> list[int]:
    """--reuse-distance D1,D2,…: whole numbers of tokens, 0 or more."""
    try:
        out = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or any(d < 0 for d in out):
        raise UsageError(f"--reuse-distance {text!r}: give tokens of work between a prefix and its return, "
                         "e.g. --reuse-distance 0,4096,16384")
    return out


class Reuse(LLMUser):
    uses_options = frozenset({"reuse_distance"})

    @classmethod
    def check_options(cls, options: Any) -> None:
        distances(options.reuse_distance)

    def on_start(self) -> None:
        self.distances, self.trials, self.rng = distances(self.llm.options.reuse_distance), 0, random.Random()

    def blocks(self, tokens: int) -> list[int]:
        """Content never sent before: fresh block ids (62 random bits each)."""
        return [self.rng.getrandbits(62) for _ in range(math.ceil(tokens / BLOCK))]

    @task
    def trial(self) -> None:
        distance = self.distances[self.trials % len(self.distances)]
        self.trials += 1
        size = max(2 * BLOCK, int(self.llm.input_tokens()))
        prefix = self.blocks(size)
        self.llm.send(self.llm.turn_request(size, 1, hash_ids=prefix, block_size=BLOCK), name="prime")
        for _ in range(math.ceil(distance / size)):
            self.llm.send(self.llm.turn_request(size, 1, hash_ids=self.blocks(size), block_size=BLOCK), name="filler")
        back = self.llm.turn_request(size + BLOCK, 1, hash_ids=[*prefix, *self.blocks(BLOCK)], block_size=BLOCK)
        self.llm.send(back, name=f"reuse@{distance}")
