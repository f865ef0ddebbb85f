"""Trace replay: requests at the times and lengths a production trace recorded.

Two shapes are read:
  mooncake  JSON lines ``{"timestamp": ms, "input_length": N, "output_length": M, "hash_ids": [...]}``
            (Mooncake's traces; ``hash_ids`` name the prompt's blocks of ``block_size`` tokens: the same id,
            the same block, so prefix sharing is replayed as recorded)
  csv       a timestamp (seconds, or an ISO date-time), an input and an output length per row, with the
            column names of BurstGPT (``Timestamp``, ``Request tokens``, ``Response tokens``), Azure's LLM
            inference traces (``TIMESTAMP``, ``ContextTokens``, ``GeneratedTokens``) or ours
            (``timestamp``, ``input_length``, ``output_length``)
Rows are sorted by time; times count from the first row. Each row is sent once by the whole swarm: row i
goes to load process ``i % processes`` (``share``), the same split on every run.
"""

from __future__ import annotations

import math
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from vllm_load.errors import UsageError
from vllm_load.workload.inputs.datasets import csv_rows
from vllm_load.workload.inputs.input_files import MAX_LINE_BYTES, read_text

FORMATS = ("mooncake", "csv")
_CSV_COLUMNS = {
    "at": ("timestamp", "Timestamp", "TIMESTAMP", "time", "arrival_time"),
    "input": ("input_length", "Request tokens", "ContextTokens", "input_tokens", "prompt_tokens"),
    "output": ("output_length", "Response tokens", "GeneratedTokens", "output_tokens", "completion_tokens"),
}


@dataclass(frozen=True)
class TraceRow:
    index: int  # the row's place in the time-sorted trace
    at: float  # seconds after the trace's first row
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()


def _fail(path: Path, what: str) -> UsageError:
    return UsageError(f"trace {path}: {what}")


def guess_format(path: Path) -> str:
    return "csv" if path.suffix.lower() == ".csv" else "mooncake"


def read_trace(path: str | Path, fmt: str = "") -> list[TraceRow]:
    """Every row, sorted by time; bad input raises UsageError with one line (the row's number in it)."""
    p = Path(path)
    fmt = fmt or guess_format(p)
    if fmt not in FORMATS:
        raise UsageError(f"--trace-format {fmt!r} is unknown: use one of {', '.join(FORMATS)}")
    raw = read_text(p, "trace", "--trace", MAX_LINE_BYTES, None)
    rows: list[tuple[float, int, int, tuple[int, ...]]] = []
    if fmt == "mooncake":
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                rows.append((float(obj["timestamp"]) / 1000.0, int(obj["input_length"]), int(obj["output_length"]),
                             tuple(int(h) for h in obj.get("hash_ids") or ())))
            except (ValueError, KeyError, TypeError, OverflowError):
                raise _fail(p, f"line {n} is not a Mooncake row (timestamp ms, input_length, output_length, "
                               "hash_ids)") from None
    else:
        columns, table = csv_rows(raw, p, _fail)
        pick = {}
        for key, names in _CSV_COLUMNS.items():
            found = [c for c in names if c in columns]
            if not found:
                raise _fail(p, f"has no {key} column (one of {', '.join(names)}; it has {', '.join(columns)})")
            pick[key] = found[0]
        for n, row in enumerate(table, 2):
            try:
                rows.append((_seconds(row[pick["at"]]), int(float(row[pick["input"]])),
                             int(float(row[pick["output"]])), ()))
            except (ValueError, TypeError, OverflowError):
                raise _fail(p, f"line {n} has no number or time where {', '.join(pick.values())} are expected") from None
    if not rows:
        raise _fail(p, "holds no rows")
    odd = next((n for n, r in enumerate(rows, 1) if not math.isfinite(r[0])), None)
    if odd is not None:  # sorted, a NaN would land anywhere; an infinite time is never due
        raise _fail(p, f"row {odd} has the time {rows[odd - 1][0]}: every row needs a finite timestamp")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    out = [TraceRow(i, at - t0, inp, outp, hashes) for i, (at, inp, outp, hashes) in enumerate(rows)]
    bad = next((r for r in out if r.input_tokens < 1 or r.output_tokens < 1), None)
    if bad is not None:
        raise _fail(p, f"row {bad.index} asks for {bad.input_tokens} input and {bad.output_tokens} output tokens: "
                       "both must be at least 1")
    return out


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return datetime.fromisoformat(text.strip().replace("Z", "+00:00")).timestamp()


def share(rows: list[TraceRow], index: int, processes: int) -> list[TraceRow]:
    """The rows load process ``index`` of ``processes`` sends."""
    return [r for r in rows if r.index % max(1, processes) == index % max(1, processes)]
