"""A Mooncake-style trace for the replay test: 200 rows 30 ms apart over 40 "documents" (row i reads document
i % 40, so the rows sharing a document are 1.2 s apart). A document is a chain of 1-3 blocks every row of it
shares, then a block of the row's own; every 4th document has no hash ids (unique content)."""

from __future__ import annotations

import json
import random
from pathlib import Path


def make_trace(path: Path, rows: int = 200, spacing_ms: int = 30, docs: int = 40) -> list[dict]:
    rng = random.Random(5)
    chains: dict[int, list[int]] = {}
    next_id = 0
    out: list[dict] = []
    for i in range(rows):
        doc = i % docs
        if doc % 4 == 3:
            hashes: list[int] = []
            inp = rng.randint(50, 600)
        else:
            if doc not in chains:
                n = rng.randint(1, 3)
                chains[doc] = list(range(next_id, next_id + n))
                next_id += n
            hashes = chains[doc] + [next_id]
            next_id += 1
            inp = (len(hashes) - 1) * 512 + rng.randint(100, 400)
        out.append({"timestamp": i * spacing_ms, "input_length": inp, "output_length": rng.randint(4, 12),
                    "hash_ids": hashes})
    path.write_text("".join(json.dumps(r) + "\n" for r in out))
    return out
