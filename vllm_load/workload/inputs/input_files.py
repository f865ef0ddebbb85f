"""One bounded reader for every file a user gives (a dataset, a trace, a fault plan, a rate schedule, a schema, an
accuracy set, sessions): read in pieces, refused at the first line longer than ``MAX_LINE_BYTES`` and past
``MAX_FILE_BYTES`` in all (before it is in memory), decoded as UTF-8, every failure one line. ``--fault-plan
/dev/zero`` and its kind read 2-3 GB in 3-9 s; a ``\\xff`` line was a UnicodeDecodeError traceback; a JSON nested
3,000 deep a RecursionError."""

from __future__ import annotations

import json
import re
from itertools import accumulate
from pathlib import Path
from typing import Any

from vllm_load.errors import UsageError

#: a line of any input: 16 MiB holds any prompt a served context takes
MAX_LINE_BYTES = 16 << 20
#: a configuration file (a plan, a schedule, a schema, a graded set): far more than any real one
MAX_FILE_BYTES = 256 << 20
#: the deepest JSON an input may nest (a schema of 3,000 nested properties, an item of 200,000 '[')
MAX_JSON_DEPTH = 200


def read_text(path: str | Path, kind: str, option: str, max_line: int | None = MAX_LINE_BYTES,
              max_total: int | None = MAX_FILE_BYTES) -> str:
    """The file at ``path`` as text, or a one-line UsageError saying why not (its line over ``max_line``, the file
    over ``max_total``, not UTF-8, not readable)."""
    p = Path(path)
    check = "" if kind == option else f": check {option}"
    try:
        parts: list[bytes] = []
        run, line, total = 0, 1, 0  # bytes of the line being read, its number, bytes so far
        with p.open("rb") as fh:
            while piece := fh.read(1 << 20):
                total += len(piece)
                if max_total is not None and total > max_total:
                    raise UsageError(f"{kind} {path}: larger than {_size(max_total)}: not an input this takes{check}")
                if max_line is not None:
                    for i, segment in enumerate(piece.split(b"\n")):
                        run = run + len(segment) if i == 0 else len(segment)
                        line += i > 0
                        if run > max_line:
                            raise UsageError(f"{kind} {path}: line {line} is longer than {_size(max_line)}: one "
                                             f"record per line{check}")
                parts.append(piece)
        raw = b"".join(parts)
    except OSError as exc:
        raise UsageError(f"{kind} {path}: cannot be read ({exc.strerror or exc}){check}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        at_line = raw.count(b"\n", 0, exc.start) + 1
        raise UsageError(f"{kind} {path}: line {at_line} is not UTF-8 text (byte {raw[exc.start]:#04x}){check}") \
            from None


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KB"


def loads(text: str, where: str) -> Any:
    """JSON of a user's input, refused past ``MAX_JSON_DEPTH`` levels of nesting (one line, no RecursionError)."""
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH:  # only then can it be too deep: scan it
        _check_depth(text, where)
    try:
        return json.loads(text)
    except RecursionError:
        raise UsageError(f"{where}: JSON nested too deep to read") from None


#: a JSON string (its escapes included), and anything but a bracket: stripped in C before the depth is counted
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def _check_depth(text: str, where: str) -> None:
    """Nesting counted over the text's brackets outside strings, in C (regex, ``accumulate``): the character loop in
    Python it replaces took 0.178 s for a 2.9 MB Weka trace line (0.024 s here), about 2 min for a 2 GB
    traces.jsonl, on every load of a public set."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if max(accumulate(map(_STEP.__getitem__, brackets)), default=0) > MAX_JSON_DEPTH:
        raise UsageError(f"{where}: JSON nested over {MAX_JSON_DEPTH} levels deep: not an input this takes")
