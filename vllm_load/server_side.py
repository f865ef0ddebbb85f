"""Fetch the sidecar's series for a run's window into the run directory, on the client's clock."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path


def _get(url: str, token: str, timeout: float) -> bytes:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read()


def fetch_series(sidecar_url: str, start: float, end: float, out: Path, token: str = "", timeout: float = 15.0) -> str | None:
    """Write ``out`` (server.jsonl) and return None, or return why the server side is missing.

    Sample times are shifted by the clock offset measured against the sidecar's /health (midpoint of
    the round trip), so client and server share the Locust master's clock.
    """
    base = sidecar_url.rstrip("/")
    try:
        t0 = time.time()
        health = json.loads(_get(base + "/health", token, timeout))
        t1 = time.time()
        offset = float(health["now"]) - (t0 + t1) / 2  # sidecar clock minus ours
        body = _get(f"{base}/series?start={start + offset - 2}&end={end + offset + 2}", token, timeout)
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        return f"sidecar {sidecar_url} unreachable ({getattr(exc, 'reason', exc)})"
    lines = []
    for raw in body.decode().splitlines():
        sample = json.loads(raw)
        sample["t_server"] = sample["t"]
        sample["t"] = sample["t"] - offset
        lines.append(json.dumps(sample))
    if not lines:
        return f"sidecar {sidecar_url} had no samples for the run's window (last error: {health.get('last_error')})"
    tmp = out.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(out)
    return None
