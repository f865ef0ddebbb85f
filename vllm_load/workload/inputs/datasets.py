"""Prompts taken from dataset files: ShareGPT JSON, JSON-lines with a text field, CSV with a column.

Each record becomes the content of one prompt (or, with ``batch`` K, K records are numbered under one
classification instruction, the same for every K, 1 included: the shape users compare to learn what
batching records into one request buys). Records are
replayed in a shuffled cycle; every prompt starts with the factory's unique digest words, so a
replayed record never shares a prefix with an earlier request (sharing stays opt-in).
"""

from __future__ import annotations

import contextlib
import csv
import functools
import json
import os
import random
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

from vllm_load.errors import UsageError
from vllm_load.workload.inputs.input_files import MAX_LINE_BYTES, read_text

FORMATS = ("sharegpt", "jsonl", "csv")


@dataclass
class Record:
    text: str
    answer: str | None = None  # ShareGPT's reply, when the output length should follow the dataset
    user_turns: tuple[str, ...] = ()  # ShareGPT: every user turn of the conversation, the first included


def _fail(path: Path, what: str) -> UsageError:
    return UsageError(f"dataset {path}: {what}")


def guess_format(path: Path) -> str:
    suffix = path.suffix.lower()
    return {".csv": "csv", ".jsonl": "jsonl", ".json": "sharegpt"}.get(suffix, "jsonl")


HF_PREFIX = "hf:"


def csv_rows(raw: str, path: Path, fail: Any) -> tuple[list[str], list[dict]]:
    """A CSV input's columns and rows; a field over the csv module's limit is one line (no traceback)."""
    reader = csv.DictReader(raw.splitlines())
    try:
        return list(reader.fieldnames or []), list(reader)
    except csv.Error as exc:
        raise fail(path, f"line {reader.line_num + 1} is not CSV this reader takes ({exc})") from None


def read_records(path: str | Path, fmt: str = "", field: str = "") -> list[Record]:
    """Read every usable record; bad input raises UsageError with one line."""
    if str(path).startswith(HF_PREFIX):
        return read_hf(str(path)[len(HF_PREFIX):], field)
    p = Path(path)
    fmt = fmt or guess_format(p)
    if fmt not in FORMATS:
        raise UsageError(f"--dataset-format {fmt!r} is unknown: use one of {', '.join(FORMATS)}")
    # line by line but ShareGPT's one JSON document; a dataset has no total bound
    raw = read_text(p, "dataset", "--dataset", None if fmt == "sharegpt" else MAX_LINE_BYTES, None)
    records: list[Record] = []
    if fmt == "sharegpt":
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise _fail(p, f"is not JSON ({exc}): ShareGPT files are a JSON list of conversations") from None
        for conv in data if isinstance(data, list) else []:
            turns = conv.get("conversations") or conv.get("conversation") or [] if isinstance(conv, dict) else []
            if len(turns) >= 2 and isinstance(turns[0], dict) and turns[0].get("value"):
                users = tuple(str(t["value"]) for t in turns if isinstance(t, dict) and t.get("value")
                              and t.get("from", "human") in ("human", "user"))
                records.append(Record(text=str(turns[0]["value"]), answer=str(turns[1].get("value", "")),
                                      user_turns=users or (str(turns[0]["value"]),)))
    elif fmt == "jsonl":
        key = field or "text"
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                raise _fail(p, f"line {n} is not JSON") from None
            if isinstance(obj, dict) and isinstance(obj.get(key), str) and obj[key].strip():
                records.append(Record(text=obj[key]))
    else:
        columns, table = csv_rows(raw, p, _fail)
        key = field or (columns[0] if columns else "")
        if key not in columns:
            raise _fail(p, f"has no column {key!r} (columns: {', '.join(columns)}): set --dataset-field")
        records = [Record(text=row[key]) for row in table if (row.get(key) or "").strip()]
    if not records:
        raise _fail(p, f"holds no usable {fmt} records" + (f" with field {field!r}" if field else ""))
    return records


def _hub_url() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


@functools.lru_cache(maxsize=None)
def hub_reachable(timeout: float = 3.0) -> bool:
    """A TCP connection to the Hub (``HF_ENDPOINT``) opens within ``timeout`` (asked once per process)."""
    parts = urlsplit(_hub_url())
    try:
        with socket.create_connection((parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)),
                                      timeout=timeout):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def _offline(datasets: Any) -> Iterator[None]:
    """The ``datasets`` and ``huggingface_hub`` clients in offline mode for one call (their flags are read at import,
    so the environment variables are too late here)."""
    import huggingface_hub.constants as hub

    saved = [(m, k, getattr(m, k)) for m, k in ((datasets.config, "HF_HUB_OFFLINE"),
                                                 (datasets.config, "HF_DATASETS_OFFLINE"), (hub, "HF_HUB_OFFLINE"))
             if hasattr(m, k)]
    for m, k, _ in saved:
        setattr(m, k, True)
    try:
        yield
    finally:
        for m, k, v in saved:
            setattr(m, k, v)


def read_hf(spec: str, field: str = "") -> list[Record]:
    """``--dataset hf:NAME_OR_PATH[:split]`` through the ``datasets`` library: a folder written by
    ``save_to_disk``, parquet files (a file or a folder of them), or a hub name (which needs the hub or its
    cache). The text is ``field`` (default ``text``, else the first string column); a ShareGPT-like
    ``conversations`` column gives every user turn."""
    try:
        import datasets
    except ImportError:
        raise UsageError("--dataset hf:… needs the datasets library: pip install 'vllm-load[hf]'") from None
    name, _, split = spec.partition(":")
    local = Path(name)
    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    try:
        if local.is_dir() and any((local / f).exists() for f in ("dataset_info.json", "dataset_dict.json", "state.json")):
            ds = datasets.load_from_disk(str(local))
        elif local.suffix == ".parquet" or (local.is_dir() and any(local.glob("*.parquet"))):
            files = [str(local)] if local.is_file() else sorted(str(f) for f in local.glob("*.parquet"))
            ds = datasets.load_dataset("parquet", data_files=files, split=split or "train")
        elif hub_reachable():
            ds = datasets.load_dataset(name, split=split or None)
        else:  # the local cache only: the Hub's client retried for 25 s (5 retries) before its error
            with _offline(datasets):
                ds = datasets.load_dataset(name, split=split or None)
    except Exception as exc:  # datasets raises FileNotFoundError, ConnectionError, ValueError and its own kinds
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        where = "" if hub_reachable() else (f"; the Hub ({_hub_url()}) is not reachable from here and the dataset is "
                                            "not in the local cache: save it with save_to_disk where there is "
                                            "network and pass hf:FOLDER")
        raise UsageError(f"dataset hf:{spec} cannot be loaded ({first}){where}: give a folder written by "
                         "save_to_disk, parquet files, or a hub name the machine can reach") from None
    if isinstance(ds, datasets.DatasetDict):
        if split and split not in ds:
            raise UsageError(f"dataset hf:{spec} has no split {split!r} (it has {', '.join(ds)})")
        ds = ds[split or ("train" if "train" in ds else next(iter(ds)))]
    columns = list(ds.column_names)
    key = field or ("text" if "text" in columns else "conversations" if "conversations" in columns else "")
    if not key:
        key = next((c for c in columns if ds.features[c].dtype == "string"), "")
    if key not in columns:
        raise UsageError(f"dataset hf:{spec} has no column {key or field!r} (columns: {', '.join(columns)}): "
                         "set --dataset-field")
    records = []
    for value in ds[key]:
        if isinstance(value, list):  # conversations: [{"from"/"role": …, "value"/"content": …}, …]
            turns = [t for t in value if isinstance(t, dict)]
            users = tuple(str(t.get("value") or t.get("content") or "") for t in turns
                          if (t.get("from") or t.get("role")) in ("human", "user"))
            users = tuple(u for u in users if u.strip())
            if users:
                records.append(Record(text=users[0], user_turns=users))
        elif isinstance(value, str) and value.strip():
            records.append(Record(text=value))
    if not records:
        raise UsageError(f"dataset hf:{spec} holds no usable text in column {key!r}")
    return records


class DatasetSource:
    """Cycles through records in a seeded shuffle; ``batch`` >= 1 puts that many under one instruction
    (0: each record is a prompt as it is)."""

    def __init__(self, records: list[Record], seed: str, batch: int = 0) -> None:
        if batch < 0:
            raise UsageError(f"--dataset-batch must be >= 1, got {batch}")
        self.records = list(records)
        self.batch = batch
        self.rng = random.Random(seed)
        self.rng.shuffle(self.records)
        self.pos = 0

    def _next(self) -> Record:
        rec = self.records[self.pos % len(self.records)]
        self.pos += 1
        return rec

    def next_conversation(self) -> list[str]:
        """The user turns of the next record (one turn for a record that is not a conversation)."""
        rec = self._next()
        return list(rec.user_turns or (rec.text,))

    def next_content(self) -> tuple[str, str | None]:
        """(content, dataset answer or None)."""
        if self.batch == 0:
            rec = self._next()
            return rec.text, rec.answer
        items = [self._next().text.replace("\n", " ") for _ in range(self.batch)]
        return batch_prompt(items), None


#: The one instruction of batched runs, the same for every K (1 included), so that K=1 and K=8 differ only
#: in how many records share a request. Its answer is one line "N. label" per record.
BATCH_INSTRUCTION = ("Classify each numbered text below as positive or negative. Answer with one line per text, "
                     "in order, written as its number, a period and the label, e.g. \"1. positive\".")
BATCH_LABELS = ("positive", "negative")


def batch_prompt(items: list[str]) -> str:
    return BATCH_INSTRUCTION + "\n" + "\n".join(f"{i}. {t}" for i, t in enumerate(items, 1))


def answer_tokens_per_record(tok: Any, batch: int) -> int:
    """Tokens of the longest answer line the instruction asks for ("K. negative" and its newline): the
    per-record answer budget, so that a batch of K is asked for K whole answer lines."""
    return max(len(tok.encode(f"{batch}. {label}\n", add_special_tokens=False)) for label in BATCH_LABELS)


def records_per_request(dataset: str, batch: int) -> int:
    """Dataset records one request carries: K with --dataset-batch K, 1 with a plain dataset, 0 without."""
    return int(batch) if batch else (1 if dataset else 0)
