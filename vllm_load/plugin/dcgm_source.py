"""GPU telemetry during a run (--dcgm-url): a DCGM exporter's /metrics read every second by the master (or local
runner) on its own clock, kept for the run's end (``dcgm.jsonl`` and the summary's energy block)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from typing import Any

import gevent
from prometheus_client.parser import text_string_to_metric_families

#: DCGM exporter field -> sample key (energy in mJ since boot, as the exporter counts it)
FIELDS = {"DCGM_FI_DEV_POWER_USAGE": "power_w", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "energy_mj",
          "DCGM_FI_DEV_GPU_UTIL": "util", "DCGM_FI_DEV_FB_USED": "fb_mib", "DCGM_FI_DEV_SM_CLOCK": "sm_mhz"}


def parse(text: str) -> dict[str, dict[str, float]]:
    """gpu (its UUID, else its index) -> field -> value."""
    gpus: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = FIELDS.get(s.name) or FIELDS.get(s.name.removesuffix("_total"))
            if key:
                gpu = s.labels.get("UUID") or s.labels.get("gpu") or "0"
                gpus.setdefault(gpu, {})[key] = float(s.value)
    return gpus


class DcgmPoller:
    """Reads ``url`` every ``interval`` seconds; ``samples`` on this process's clock (the midpoint of each read)."""

    def __init__(self, url: str, interval: float = 1.0) -> None:
        self.url, self.interval = url, interval
        self.samples: list[dict[str, Any]] = []
        self.error: str | None = None
        self._greenlet = gevent.spawn(self._poll)

    def read(self) -> None:
        t0 = time.time()
        try:
            with urllib.request.urlopen(self.url, timeout=5.0) as resp:
                text = resp.read().decode()
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self.error = f"DCGM exporter {self.url} cannot be read ({getattr(exc, 'reason', exc)})"
            return
        gpus = parse(text)
        if not gpus:
            self.error = f"DCGM exporter {self.url} serves no DCGM_FI_DEV_* fields"
            return
        self.samples.append({"t": (t0 + time.time()) / 2, "gpus": gpus})

    def _poll(self) -> None:
        while True:
            self.read()
            gevent.sleep(self.interval)

    def stop(self) -> None:
        self._greenlet.kill(block=False)
        self.read()  # the run's end, read once more: the window's last edge lies between two samples
