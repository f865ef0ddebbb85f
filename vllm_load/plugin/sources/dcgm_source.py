"""GPU telemetry during a run: a DCGM exporter's /metrics read every second by the master (or local runner) on its
own clock (--dcgm-url), or the same fields read at the run's end from a Prometheus that scrapes the exporter
(--prometheus-url with --dcgm-selector); kept for the run's end (``dcgm.jsonl`` and the summary's energy block)."""

from __future__ import annotations

import http.client
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
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
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


class PrometheusDcgm:
    """The DCGM fields of the GPUs ``selector`` picks, read from Prometheus over the run's window when it stops (the
    poller's ``samples``/``error``/``stop`` shape). Prometheus holds the exporter's scrapes (every 15-30 s as usually
    configured): the energy counter at the window's edges is its last scrape before each, so the energy is exact to
    a scrape interval at either edge; a run of many scrape intervals is what makes the figure meaningful."""

    def __init__(self, url: str, selector: str, token: str, start: float) -> None:
        self.url, self.selector, self.token, self.start = url, selector.strip(), token, start
        self.samples: list[dict[str, Any]] = []
        self.error: str | None = None

    def stop(self) -> None:
        from vllm_load.plugin.sources.prometheus_source import query_range

        by_time: dict[float, dict[str, Any]] = {}
        for name, key in FIELDS.items():
            result, why = query_range(self.url, f"{name}{self.selector}", self.start - 2, time.time() + 1, self.token)
            if why:
                self.error = why
                return
            for series in result:
                labels = series.get("metric") or {}
                gpu = labels.get("UUID") or f"{labels.get('Hostname', '')}/{labels.get('gpu', '0')}"
                for t, value in series.get("values", []):
                    sample = by_time.setdefault(float(t), {"t": float(t), "gpus": {}})
                    sample["gpus"].setdefault(gpu, {})[key] = float(value)
        self.samples = [by_time[t] for t in sorted(by_time)]
        if not self.samples:
            self.error = f"Prometheus at {self.url} has no DCGM_FI_DEV_* series for {self.selector or 'any GPU'}"
