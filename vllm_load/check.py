"""One judged check: an SLO, a validity check or a feature's: its name, the value judged, whether it passed, and
its one-line detail. At the ground floor, so that a feature module (``vllm_load/features/``) can make one without
reaching up into ``metrics``."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class Check:
    slo: str
    value: float | None
    passed: bool
    detail: str

    def to_json(self) -> dict:
        return asdict(self)
