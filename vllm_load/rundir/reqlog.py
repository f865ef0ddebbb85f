"""The per-request JSON-lines log: one line per finished request, serialised and written off the event loop.

A write per request cost the event loop ~19 us of a system call at 2,200 requests/s (py-spy: 8 % of its
time), and serialising a line another ~5 us (6.6 % of the loop at 2,550 requests/s, turnover.py). A
finished request's record is now only kept (O(1)); batches of ``BATCH`` go to a writer thread,
which turns them into lines and appends them, in order, when the fold runs (at least every 0.25 s), at a
drain and at the close. A process killed outright (SIGKILL) loses at most what it finished since the last
batch was written; a stop by signal, a drain or an error waits for everything to be written first.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

import orjson

from vllm_load.client.record import RequestRecord
from vllm_load.errors import OutputError
from vllm_load.redact import mask_bytes
from vllm_load.workload.prompt_pool import token_thread


class RequestLog:
    """Append-only; whole lines only (a crash can tear at most the line being written)."""

    #: records: a full batch goes to the writer at once, whatever the fold does. The writer holds the GIL while
    #: it serialises (~5 us a record): batches of 256 held it ~1.3 ms, and the loop waited for it (turnover.py,
    #: 256 streams: 12-23 loop stalls over 2 ms in 10 s); batches of 32 hold it ~0.16 ms (3-6 stalls)
    BATCH = 32

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fh: IO[bytes] | None = open(path, "ab", buffering=0)
        self._records: list[RequestRecord] = []
        self._writer: Any = None  # one thread below the loop's priority (made at the first batch): lines in order
        self._last: Any = None  # the latest batch handed to it (its AsyncResult)
        self._failed: BaseException | None = None  # a write the thread could not make (disk full, …)
        self.lost = 0  # records not written since a write failed (the log is then closed)

    def write(self, rec: RequestRecord) -> None:
        """Keep ``rec`` for the next batch (the record must not change after this: the writer reads it)."""
        if self._fh is not None:
            self._records.append(rec)
            if len(self._records) >= self.BATCH:
                self.flush(wait=False)
        else:
            self.lost += 1

    def flush(self, wait: bool = True) -> None:
        """Hand every kept record to the writer; with ``wait``, return once all of them are in the file.
        A write the thread could not make is raised once, here, as an ``OutputError`` (waiting or not): the log
        is then closed, and what comes after is counted in ``lost``."""
        if self._failed is not None and self._fh is not None:
            self._give_up()
        if self._records and self._fh is not None:
            if self._writer is None:
                self._writer = token_thread()
            records, self._records = self._records, []
            self._last = self._writer.spawn(self._append, self._fh, records)
        if wait and self._last is not None:
            self._last.get()
            self._last = None
            if self._failed is not None and self._fh is not None:
                self._give_up()

    def _give_up(self) -> None:
        failed, self._failed = self._failed, None
        self.lost += len(self._records)
        self._records = []
        if self._fh is not None:
            try:
                self._fh.close()
            except OSError:
                pass
            self._fh = None
        assert failed is not None
        if isinstance(failed, OSError):
            raise OutputError.of(failed, f"the request log {self.path}") from None
        raise failed

    def _append(self, fh: IO[bytes], records: list[RequestRecord]) -> None:
        """In the writer thread: the records' lines, in one write. A failed write is cut back to the last whole
        line (a full disk leaves no torn JSON, and the space it took is free again) and raised on the loop
        at the next flush."""
        if self._failed is not None or fh.closed:
            return
        pos = None
        try:
            pos = fh.tell()
            dumps, newline = orjson.dumps, orjson.OPT_APPEND_NEWLINE
            data = memoryview(mask_bytes(b"".join(dumps(r.to_json(), option=newline) for r in records)))
            while data:  # a raw write may take part of it (a disk filling up): the rest, or the error
                data = data[fh.write(data):]
        except Exception as exc:  # raised on the loop at the next flush
            self.lost += len(records)
            if pos is not None:
                try:
                    fh.truncate(pos)
                except (OSError, ValueError):
                    pass
            self._failed = exc

    def close(self) -> None:
        if self._fh is not None:
            try:
                self.flush()
            finally:
                if self._fh is not None:
                    self._fh.close()
                    self._fh = None
        if self._writer is not None:
            self._writer.kill()
            self._writer = None


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
