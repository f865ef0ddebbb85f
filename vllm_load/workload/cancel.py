"""``--cancel 'rate=0.1,after=16tok'``: requests the client gives up on mid-answer, as users close a tab.

Clients abandon answers, and a server has to free what it held for them (vLLM aborts the request: its running
count falls, its ``request_success`` counts it under ``abort``). A share of the requests is cut once its stream
carried N tokens: dealt exactly (request i of a process is cut when the share's running count steps up at i, so a
rate of 0.1 cuts every tenth, interleaved), counted as their own outcome, neither success nor failure, and logged
with their partial timings. ``--num-requests`` counts the others (the measured ones), as it does a warm-up's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vllm_load.errors import UsageError


@dataclass(frozen=True)
class CancelPlan:
    rate: float  # the share of requests cut (0 < rate < 1)
    after_tokens: int  # cut once the stream carried this many tokens

    def cuts(self, index: int) -> bool:
        """Is this process's request ``index`` (0, 1, …) one to cut? Exactly ``rate`` of any count, spread."""
        return math.floor((index + 1) * self.rate + 1e-9) > math.floor(index * self.rate + 1e-9)


def parse_cancel(text: str) -> CancelPlan | None:
    """``rate=R,after=Ntok``; None for an empty option; one line for anything else."""
    if not str(text or "").strip():
        return None
    fields: dict[str, str] = {}
    for part in (p.strip() for p in str(text).split(",") if p.strip()):
        key, eq, value = part.partition("=")
        if not eq or key.strip() not in ("rate", "after"):
            raise UsageError(f"--cancel {text!r}: give rate=SHARE,after=Ntok, e.g. --cancel 'rate=0.1,after=16tok'")
        fields[key.strip()] = value.strip()
    try:
        rate = float(fields.get("rate", ""))
    except ValueError:
        rate = float("nan")
    if not 0 < rate < 1:  # all cut would measure nothing (and --num-requests, which counts the others, never end)
        raise UsageError(f"--cancel {text!r}: rate must be a share above 0 and below 1, e.g. rate=0.1")
    after = fields.get("after", "")
    if not after.endswith("tok") or not after[:-3].isdigit() or int(after[:-3]) < 1:
        raise UsageError(f"--cancel {text!r}: after must be a count of tokens of 1 or more, e.g. after=16tok")
    return CancelPlan(rate, int(after[:-3]))
