"""The server side's samples on the client's clock: the sidecar's series for a run's window, and while a run goes
on (``LiveServer``: the sidecar's or a Prometheus')."""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from typing import Callable

from vllm_load.client.openai_api import auth_header
from vllm_load.metrics.server import server_summary


def _get(url: str, token: str, timeout: float) -> bytes:
    req = urllib.request.Request(url, headers=auth_header(token))
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read()


def fetch_samples(sidecar_url: str, start: float, end: float, token: str = "", timeout: float = 15.0
                  ) -> tuple[list[dict], str | None]:
    """The sidecar's samples from ``start`` to ``end`` (our clock), shifted onto our clock, and why there
    are none when there are none.

    Sample times are shifted by the clock offset measured against the sidecar's /health (midpoint of
    the round trip), so client and server share the Locust master's clock.
    """
    base = sidecar_url.rstrip("/")
    try:
        t0 = time.time()
        health = json.loads(_get(base + "/health", token, timeout))
        t1 = time.time()
        offset = float(health["now"]) - (t0 + t1) / 2  # sidecar clock minus ours
        body = _get(f"{base}/series?start={start + offset}&end={end + offset}", token, timeout)
    except (urllib.error.URLError, OSError, ValueError, KeyError, http.client.HTTPException) as exc:
        # HTTPException: a sidecar stopping mid-answer (IncompleteRead) at a run's end
        return [], f"sidecar {sidecar_url} unreachable ({getattr(exc, 'reason', exc) or type(exc).__name__})"
    samples = []
    for raw in body.decode().splitlines():
        sample = json.loads(raw)
        sample["t_server"] = sample["t"]
        sample["t"] = sample["t"] - offset
        samples.append(sample)
    if not samples:
        return [], f"sidecar {sidecar_url} had no samples for the run's window (last error: {health.get('last_error')})"
    return samples, None


class LiveServer:
    """The server side while a run goes on, for the web UI and the saturation watch: new samples fetched every
    ``interval`` seconds (only what arrived since the last poll), summarised like the end-of-run report.
    ``fetch(since, until)`` is the source: the sidecar's series (``sidecar``) or a Prometheus' (``prometheus``)."""

    def __init__(self, fetch: Callable[[float, float], tuple[list[dict], str | None]], start: float,
                 interval: float = 5.0) -> None:
        import gevent

        self.fetch, self.interval = fetch, interval
        self.samples: list[dict] = []
        self.since = start
        self.why: str | None = "no sample yet"
        self._greenlet = gevent.spawn(self._poll)

    @classmethod
    def sidecar(cls, url: str, start: float, token: str = "", interval: float = 5.0) -> "LiveServer":
        return cls(lambda since, until: fetch_samples(url, since, until, token, timeout=5.0), start, interval)

    @classmethod
    def prometheus(cls, url: str, selector: str, start: float, token: str = "", interval: float = 5.0) -> "LiveServer":
        from vllm_load.plugin.prometheus_source import fetch_range

        return cls(lambda since, until: fetch_range(url, selector, since, until, token, timeout=5.0), start, interval)

    def _poll(self) -> None:
        import gevent

        while True:
            new, why = self.fetch(self.since, time.time() + 1)
            new = [s for s in new if s["t"] > self.since]
            if new:
                self.samples.extend(new)
                self.since = new[-1]["t"]
                self.why = None
            elif not self.samples:
                self.why = why
            gevent.sleep(self.interval)

    def summary(self) -> dict | None:
        return server_summary(self.samples)

    def stop(self) -> None:
        self._greenlet.kill(block=False)
