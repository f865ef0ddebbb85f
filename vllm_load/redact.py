"""What may be written or shown of a URL: never its ``user:password@`` (those go to that host only); of a secret
(the API key, a credential header, a token): nothing, wherever a server or a command echoed it; of a peer's text:
no control character that a terminal would act on.

One pass over everything the run writes (``RunDir.write``) and the lines it prints about a destination, so no
file, page, log line or tracker carries credentials given inside ``--mlflow-uri``, ``--sidecar-url``,
``--dcgm-url``, ``--otlp-endpoint`` or any other URL option.
"""

from __future__ import annotations

import re
from typing import Any

#: scheme://userinfo@ — userinfo stops at anything a host part or a list separator would hold
_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s@,'\"<>]+@")


#: a credential written inline in a command or a header: ``--token=X``, ``--api-key X``, ``Authorization: Bearer X``
_INLINE = re.compile(r"(?i)(--[\w-]*(?:token|key|password|secret)[= ]|\bauthorization:\s*(?:bearer\s+|basic\s+)?)"
                     r"([^\s'\"]+)")
#: the secrets this process holds (``add_secret``), longest first (one inside another), each with its bytes: masked
#: in every text that goes through ``redact_urls`` (kept in order as they come, not sorted at every line)
_SECRETS: list[tuple[str, bytes]] = []
#: what a secret becomes
MASK = "***"
_MASK_BYTES = MASK.encode()
#: shorter values are not masked: "abc" would blank every word that holds it, and says nothing of a real key
MIN_SECRET = 6
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def add_secret(value: str | None) -> None:
    """This process holds ``value`` (an API key, a header's credential, a token): no text it writes or prints
    through ``redact_urls`` carries it from now on, whoever echoed it (a server's 401 text, a gateway's 500)."""
    if value and len(value) >= MIN_SECRET and all(value != known for known, _ in _SECRETS):
        _SECRETS.append((value, value.encode()))
        _SECRETS.sort(key=lambda pair: len(pair[0]), reverse=True)


def mask_secrets(text: str) -> str:
    """``text`` with every secret of ``add_secret`` replaced by ``MASK`` (the longest first: one inside another)."""
    for secret, _ in _SECRETS:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def mask_bytes(data: bytes) -> bytes:
    """``mask_secrets`` over bytes already encoded (a batch of the request log's lines)."""
    for _, raw in _SECRETS:
        if raw in data:
            data = data.replace(raw, _MASK_BYTES)
    return data


class MaskedStream:
    """A text stream (the process's stdout or stderr) through which no secret of ``add_secret`` is written: Locust's
    log, gevent's report of a greenlet that raised, a server's words in a line. Everything else is the stream's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(mask_secrets(text) if _SECRETS and isinstance(text, str) else text)
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard_streams() -> None:
    """The process's own stdout and stderr (not a stream a test harness put in their place) mask the secrets."""
    import sys

    if sys.stdout is sys.__stdout__ and sys.stdout is not None:
        sys.stdout = MaskedStream(sys.stdout)  # type: ignore[assignment]
    if sys.stderr is sys.__stderr__ and sys.stderr is not None:
        sys.stderr = MaskedStream(sys.stderr)  # type: ignore[assignment]


def redact_urls(text: str) -> str:
    """``text`` with the credentials of every URL in it removed (``http://u:p@h`` -> ``http://h``) and every
    secret this process holds masked."""
    text = _CREDENTIALS.sub(r"\1", text) if "@" in text else text
    if "-" in text or ":" in text:
        text = _INLINE.sub(lambda m: m.group(1) + MASK, text)
    return mask_secrets(text) if _SECRETS else text


def printable(text: str) -> str:
    """A peer's text (a worker's message, a server's error) as a terminal may show it: control characters (ANSI
    escapes, carriage returns, bells) written as ``\\x1b``, secrets masked."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", redact_urls(str(text)))


def redact_all(value: Any) -> Any:
    """The same over a JSON-like value (dicts, lists, tuples, strings; the rest as it is)."""
    if isinstance(value, str):
        return redact_urls(value)
    if isinstance(value, dict):
        return {k: redact_all(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_all(v) for v in value]
    return value
