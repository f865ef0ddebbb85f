"""Fault injection for the emulator, by flag (``--fault KIND:RATE``) or per request (header).

Kinds: ``500``/``503``/``429`` (HTTP error before streaming), ``drop`` (connection closed mid-stream),
``malformed`` (a broken SSE line mid-stream), ``error`` (vLLM's ``data: {"error": …}`` mid-stream),
``stall`` (silence mid-stream for ``--stall-seconds``, longer than a client timeout), ``slow-headers``
(the response starts only after ``--stall-seconds``), ``overrun`` (100 times the tokens asked: a server that
ignores max_tokens), ``endless`` (mid-stream, 24 MiB of bytes without a line end), ``echo`` (HTTP 500 whose text quotes the request's Authorization header: a gateway that echoes
the client's token, which the client must never write or print), ``bad-tool`` (a tool call broken as a busy server's
parser breaks one, vLLM #48089, #54701: a name the request did not offer, arguments that are not JSON, an empty
call delta, the call left in the content as markup, or the call beside an unclosed tag or a special token, in turn; counted in ``vllm_emulator:bad_tool_calls_total{kind}``: the truth a client's check is held to),
``diverge`` (a greedy answer that parts from the one the same prompt gets alone, from token ``--diverge-at`` on, as
batch composition moves a server's greedy answers, lm-evaluation-harness #4019; counted in
``vllm_emulator:diverged_answers_total``: the truth a reference check is held to).
``--faults-from N``: faults strike only while at least N requests run (this one included), so that a verdict can be
tested where a server breaks under load and not alone.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from .http import HttpError

KINDS = ("500", "503", "429", "drop", "malformed", "error", "stall", "slow-headers", "overrun", "echo", "endless",
         "bad-tool", "diverge")
#: how a bad-tool fault breaks the call, in turn: its name, its arguments, an empty delta after it, the call left in
#: the content as its markup (no tool call: the parser did not take it), or the call whole beside broken text (an
#: unclosed <think>, a special token of the tokenizer)
BAD_TOOL = ("unknown_tool", "arguments_not_json", "empty_delta", "tool_markup_in_content", "markup_unbalanced",
            "special_token_in_content")
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
    from_running: int = 0  # draw faults only while this many requests run, this one included (0: always)
    bad_tools: int = 0  # bad-tool faults struck so far: which breakage comes next
    diverge_at: int = 8  # a diverge fault's answer parts from its own alone at this token (0-based)

    def pick(self, environ: dict, running: int = 0) -> str | None:
        """The fault for this request: the header's, else one drawn at the configured rates (``echo`` answers here,
        where the request's headers are); none while fewer than ``from_running`` requests run, with it."""
        if self.from_running and running + 1 < self.from_running and not environ.get(HEADER):
            return None
        kind = self._draw(environ)
        if kind == "echo":
            raise HttpError(500, "upstream refused the credentials " + environ.get("HTTP_AUTHORIZATION", "(none)"),
                            "InternalServerError")
        return kind

    def bad_tool(self) -> str:
        """The next bad-tool breakage (in turn, so that a run sees each)."""
        kind = BAD_TOOL[self.bad_tools % len(BAD_TOOL)]
        self.bad_tools += 1
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
