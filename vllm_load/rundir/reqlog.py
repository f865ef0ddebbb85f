"""The per-request JSON-lines log: one line per finished request, written and flushed at once."""

from __future__ import annotations

from pathlib import Path
from typing import IO

import orjson

from vllm_load.client.record import RequestRecord


class RequestLog:
    """Append-only; a crash loses at most the line being written."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fh: IO[bytes] | None = open(path, "ab", buffering=0)

    def write(self, rec: RequestRecord) -> None:
        if self._fh is not None:
            self._fh.write(orjson.dumps(rec.to_json()) + b"\n")

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def read_log(path: Path) -> list[dict]:
    """All complete lines of a log (a torn last line from a crash is skipped)."""
    out = []
    with open(path, "rb") as fh:
        for line in fh:
            try:
                out.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                continue
    return out
