"""What may be written or shown of a URL: never its ``user:password@`` (those go to that host only).

One pass over everything the run writes (``RunDir.write``) and the lines it prints about a destination, so no
file, page, log line or tracker carries credentials given inside ``--mlflow-uri``, ``--sidecar-url``,
``--dcgm-url``, ``--otlp-endpoint`` or any other URL option.
"""

from __future__ import annotations

import re
from typing import Any

#: scheme://userinfo@ — userinfo stops at anything a host part or a list separator would hold
_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s@,'\"<>]+@")


def redact_urls(text: str) -> str:
    """``text`` with the credentials of every URL in it removed (``http://u:p@h`` -> ``http://h``)."""
    return _CREDENTIALS.sub(r"\1", text) if "@" in text else text


def redact_all(value: Any) -> Any:
    """The same over a JSON-like value (dicts, lists, tuples, strings; the rest as it is)."""
    if isinstance(value, str):
        return redact_urls(value)
    if isinstance(value, dict):
        return {k: redact_all(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_all(v) for v in value]
    return value
