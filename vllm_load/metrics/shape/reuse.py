"""The reuse curve (locustfiles/reuse.py): each distance's requests named ``reuse@DISTANCE``, and the share of
their prompt the server had cached (its own usage count), in distance order: where it falls to 0, the server's
cache no longer held the prefix beside the work in between."""

from __future__ import annotations

import re
from typing import Any

_NAME = re.compile(r"reuse@(\d+)$")


def curve(names: dict[str, Any] | None) -> list[tuple[int, float | None, int]]:
    """(distance in tokens, cached share of the returning prompts or None when the server said none, requests)."""
    out = []
    for name, part in (names or {}).items():
        if (m := _NAME.match(name)) and part.get("succeeded"):
            out.append((int(m[1]), part.get("cached_fraction"), int(part["succeeded"])))
    return sorted(out)


def describe(names: dict[str, Any] | None) -> str:
    """The console's and the report's line ('' without reuse requests)."""
    points = curve(names)
    if not points:
        return ""
    cells = [f"{d:,} tok {'n/a' if share is None else f'{share * 100:.0f}%'} ({n})" for d, share, n in points]
    said = "" if all(share is not None for _, share, _ in points) else (
        "; n/a: the server gave no cached tokens (vLLM: --enable-prompt-tokens-details)")
    return "cached share of the prefix by work in between: " + ", ".join(cells) + said
