"""Fault injection for the emulator, by flag (``--fault KIND:RATE``) or per request (header).

Kinds: ``500``/``503``/``429`` (HTTP error before streaming), ``drop`` (connection closed mid-stream),
``malformed`` (a broken SSE line mid-stream), ``error`` (vLLM's ``data: {"error": …}`` mid-stream),
``stall`` (silence mid-stream for ``--stall-seconds``, longer than a client timeout), ``slow-headers``
(the response starts only after ``--stall-seconds``), ``overrun`` (100 times the tokens asked: a server that
ignores max_tokens), ``endless`` (mid-stream, 24 MiB of bytes without a line end), ``echo`` (HTTP 500 whose text quotes the request's Authorization header: a gateway that echoes
the client's token, which the client must never write or print).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from .http import HttpError

KINDS = ("500", "503", "429", "drop", "malformed", "error", "stall", "slow-headers", "overrun", "echo", "endless")
HEADER = "HTTP_X_EMULATOR_FAULT"  # WSGI name of the X-Emulator-Fault request header


def parse_fault(spec: str) -> tuple[str, float]:
    kind, _, rate = spec.partition(":")
    if kind not in KINDS:
        raise ValueError(f"--fault {spec!r}: kind must be one of {', '.join(KINDS)}")
    try:
        value = float(rate) if rate else 1.0
    except ValueError:
        raise ValueError(f"--fault {spec!r}: rate must be a number in [0, 1]") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"--fault {spec!r}: rate must be in [0, 1]")
    return kind, value


@dataclass
class FaultPlan:
    rates: dict[str, float] = field(default_factory=dict)
    stall_seconds: float = 30.0
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    retry_after: float = 0.0  # Retry-After seconds on 503/429 faults (0: no header)

    def pick(self, environ: dict) -> str | None:
        """The fault for this request: the header's, else one drawn at the configured rates (``echo`` answers here,
        where the request's headers are)."""
        kind = self._draw(environ)
        if kind == "echo":
            raise HttpError(500, "upstream refused the credentials " + environ.get("HTTP_AUTHORIZATION", "(none)"),
                            "InternalServerError")
        return kind

    def _draw(self, environ: dict) -> str | None:
        asked = environ.get(HEADER)
        if asked:
            return asked if asked in KINDS else None
        x = self.rng.random()
        for kind, rate in self.rates.items():
            if x < rate:
                return kind
            x -= rate
        return None

    def raise_overload(self, fault: str | None) -> None:
        """An HTTP error fault (500, 503, 429) answers before anything is generated; an overloaded server tells
        clients when to come back (--retry-after; 0: no header)."""
        if fault in ("500", "503", "429"):
            retry = self.retry_after if fault in ("503", "429") and self.retry_after > 0 else None
            raise HttpError(int(fault), f"injected fault: HTTP {fault}", "InternalServerError", retry_after=retry)
