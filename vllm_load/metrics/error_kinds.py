"""Failure reasons grouped by kind: a reason often quotes the server (an id, a payload, a count), and keyed by
its raw text 6,725 failures from 2 users in 8 s made 5,577 rows (summary.json 707 KB, the report 1.15 MB).
The key is the reason with its ids, numbers and quoted payloads replaced; the first raw reason of each kind is
kept as its example, and the request log keeps every raw reason."""

from __future__ import annotations

import re

#: distinct kinds kept per process and per summary; more fall into one "other kinds" row
MAX_KINDS = 50
OTHER = "other kinds (beyond the first 50)"

_QUOTED = re.compile(r"""b?'(?:[^'\\]|\\.){0,2000}'|b?"(?:[^"\\]|\\.){0,2000}\"""")
_UUID = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")
_ID = re.compile(r"\b(?=[0-9a-zA-Z_-]*\d)[0-9a-zA-Z]+[-_][0-9a-zA-Z_-]{6,}\b|\b[0-9a-fA-F]{8,}\b")
_NUMBER = re.compile(r"(?<![A-Za-z])\d+(?:\.\d+)?")


def error_kind(reason: str) -> str:
    """``reason`` with what varies from one request to the next replaced: quoted payloads by '…', ids by
    <id>, numbers by N (an HTTP status stays)."""
    text = _QUOTED.sub("'…'", reason)
    text = _UUID.sub("<id>", text)
    text = _ID.sub("<id>", text)
    text = _NUMBER.sub(lambda m: m.group(0) if _is_status(text, m) else "N", text)
    return " ".join(text.split())[:200]


def _is_status(text: str, m: re.Match) -> bool:
    return text[max(0, m.start() - 5):m.start()] == "HTTP " and len(m.group(0)) == 3
