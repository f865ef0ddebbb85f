"""What the other classes cost a protected one (``--protect NAME``): the protected class's TTFT and inter-token gaps
alone (its requests that ended before any other class's first request) against beside the others (those that began
after it), from the request logs. A scheduler that protects it (vLLM's ``--scheduling-policy priority`` with the
class at a lower ``priority``) keeps the penalty small; first come, first served queues it behind the batch.

Each side's p99 is over its requests' own values (TTFT) and over every gap between their chunks (ITL), exact; a side
of fewer than ``MIN_REQUESTS`` requests is not judged (its p99 would be its maximum), and says so."""

from __future__ import annotations

from typing import Any

from vllm_load.metric_table import E2E, ITL, TTFT
from vllm_load.metrics.records import measured, nearest_rank

#: the fewest requests a side needs to be judged
MIN_REQUESTS = 10


def _p99(values: list[float]) -> float | None:
    return nearest_rank(sorted(values), 99.0) if values else None


def _side(records: list[dict]) -> dict[str, Any]:
    gaps = [b - a for r in records for a, b in zip(r.get("chunk_offsets") or [], (r.get("chunk_offsets") or [])[1:])]
    return {"requests": len(records), "ttft_p99": _p99([r[TTFT] for r in records if r.get(TTFT) is not None]),
            "itl_p99": _p99(gaps)}


def protection(logs: list[dict], name: str) -> dict[str, Any]:
    """The verdict for the class whose requests are named ``name``: each side's figures, the penalties (None where
    a side is too small or had no value), and ``why`` when it cannot be judged."""
    kept = [r for r in logs if measured(r)]
    mine = [r for r in kept if r.get("name") == name and r["ok"]]
    others = [r["start"] for r in kept if r.get("name") != name]
    out: dict[str, Any] = {"name": name, "ttft_penalty": None, "itl_penalty": None, "why": None}
    if not any(r.get("name") == name for r in kept):  # a typo, or a name the locustfile never gives
        names = sorted({str(r.get("name")) for r in kept if r.get("name")})[:8]
        out["why"] = (f"no request was named {name!r}: --protect takes a request name the run gave"
                      + (f" ({', '.join(names)})" if names else " (its requests had no name=)"))
        return out
    if not others:
        out["why"] = f"no request but {name}'s ran: nothing to compare against"
        return out
    first = min(others)
    out["alone"] = _side([r for r in mine if r["start"] + (r.get(E2E) or 0.0) <= first])
    out["beside"] = _side([r for r in mine if r["start"] >= first])
    small = [side for side in ("alone", "beside") if out[side]["requests"] < MIN_REQUESTS]
    if small:
        out["why"] = (f"{' and '.join(small)}: fewer than {MIN_REQUESTS} of {name}'s requests "
                      f"({out['alone']['requests']} alone, {out['beside']['requests']} beside the others)")
        return out
    for metric in (TTFT, ITL):
        a, b = out["alone"][f"{metric}_p99"], out["beside"][f"{metric}_p99"]
        out[f"{metric}_penalty"] = b / a - 1.0 if a and b is not None else None
    return out


def from_logs(logs: list[dict], options: Any) -> dict[str, Any] | None:
    """The protection feature's part (``features/protection.py``): the verdict for ``--protect``'s class, if given."""
    name = options.get("protect") if hasattr(options, "get") else getattr(options, "protect", "")
    return protection(logs, str(name)) if name else None
