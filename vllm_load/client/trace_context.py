"""W3C trace context: every request carries a ``traceparent`` of its own, so that the server's OpenTelemetry span
of that request (vLLM's ``llm_request``, with ``--otlp-traces-endpoint``) has the trace id the client logged: the
join key between the client's timeline and the server's, per request."""

from __future__ import annotations

import random

#: seeded from the OS in each process (a swarm's processes draw apart): 128 bits, no two requests alike
_draw = random.Random().getrandbits
HEADER = "traceparent"


def new_traceparent() -> str:
    """``00-<trace id>-<parent span id>-01`` (sampled), ids never all zero (W3C calls that invalid)."""
    return f"00-{_draw(128) or 1:032x}-{_draw(64) or 1:016x}-01"


def trace_id(headers: dict[str, str] | None) -> str | None:
    """The trace id of the traceparent among ``headers`` (a user's own, where it gave one), lower-case hex; None
    without one, or for one whose ids are not hex (W3C: not a traceparent). The emulator reads a request's with it."""
    if not headers:
        return None
    value = headers.get(HEADER) or next((v for k, v in headers.items() if k.lower() == HEADER), None)
    parts = value.split("-") if isinstance(value, str) else []
    if len(parts) < 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        bytes.fromhex(parts[1] + parts[2])
    except ValueError:
        return None
    return parts[1].lower()
