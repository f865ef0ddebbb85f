"""The server side's samples on the client's clock: the sidecar's series for a run's window, and while a run goes
on (``LiveServer``: the sidecar's or a Prometheus')."""

from __future__ import annotations

import base64
import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable

from vllm_load.client.apis.openai_api import auth_header, public_url
from vllm_load.metrics.fleet.server import server_summary


def _get(url: str, token: str, timeout: float) -> bytes:
    """A GET of the sidecar; a ``user:password@`` in its URL goes as Basic auth (urllib took it for part of the host
    name: "unreachable (Name or service not known)"), the token as the bearer."""
    parts = urllib.parse.urlsplit(url)
    headers = auth_header(token)
    if parts.username is not None:
        pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        headers = {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode(), **headers}
        url = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
    req = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read()


def fetch_samples(sidecar_url: str, start: float, end: float, token: str = "", timeout: float = 15.0,
                  fresh: bool = False) -> tuple[list[dict], str | None]:
    """The sidecar's samples from ``start`` to ``end`` on our clock, and why there are none when there are
    none. ``sidecar_url`` may list one sidecar per replica (``--sidecar-url a,b`` beside ``--host a,b``): each
    is read onto our clock and the series are merged into the fleet's (``merge_series``); one that cannot be
    read leaves the server side missing, with its reason (a fleet's sums without it would be wrong)."""
    urls = [u.strip() for u in sidecar_url.split(",") if u.strip()]
    if len(urls) < 2:
        return _fetch_one(sidecar_url, start, end, token, timeout, fresh)
    got = [_fetch_one(u, start, end, token, timeout, fresh) for u in urls]
    whys = [why for _, why in got if why]
    if whys:
        return [], "; ".join(whys)
    return merge_series([series for series, _ in got]), None


#: per-replica values that do not add up over replicas: the fleet's is the largest (a cache's usage, a hit-rate
#: gauge); every other number (requests running and waiting, counters, rates) and histogram bucket is summed
MAXED = frozenset({"kv_cache_usage", "cpu_cache_usage", "prefix_cache_hit_rate_gauge", "block_size"})


def merge_series(series: list[list[dict]]) -> list[dict]:
    """Several sidecars' series (each on our clock) as one: at every instant any of them sampled, each
    one's latest sample so far, merged (``merge_samples``); from the first instant all of them have one."""
    times = sorted({s["t"] for one in series for s in one})
    at = [0] * len(series)
    out = []
    for t in times:
        latest = []
        for k, one in enumerate(series):
            while at[k] < len(one) and one[at[k]]["t"] <= t:
                at[k] += 1
            if at[k] == 0:
                break
            latest.append(one[at[k] - 1])
        else:
            out.append({**merge_samples(latest), "t": t})
    return out


def merge_samples(samples: list[dict]) -> dict:
    """One sample of the fleet from one per replica (``_merged``); a field some replica lacks is left out (a
    partial sum would read as the fleet's)."""
    keys = set.intersection(*(set(s) for s in samples)) - {"t", "t_server"}
    return {key: _merged(key, [s[key] for s in samples]) for key in keys}


def _merged(key: str, values: list) -> Any:
    """Numbers summed (MAXED keys: the largest); dicts key by key (per-label counters, a label one replica has
    not seen counting 0 there; histograms); histogram
    buckets ([bound, count] pairs) summed by bound; anything else (a source's name) as the first replica has it."""
    first = values[0]
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        return max(values) if key in MAXED else sum(values)
    if isinstance(first, dict) and all(isinstance(v, dict) for v in values):
        if all(isinstance(x, (int, float)) for v in values for x in v.values()):  # counters by label: a label
            return {k: sum(v.get(k, 0.0) for v in values) for k in set().union(*values)}  # one lacks is its 0
        return merge_samples(values)
    if key == "buckets" and all(isinstance(v, list) for v in values):
        total: dict[float, float] = {}
        for buckets in values:
            for le, count in buckets:
                total[le] = total.get(le, 0.0) + count
        return [[le, c] for le, c in sorted(total.items())]
    return first


def _fetch_one(sidecar_url: str, start: float, end: float, token: str, timeout: float, fresh: bool = False
               ) -> tuple[list[dict], str | None]:
    """One sidecar's samples, shifted onto our clock; ``fresh``: it takes one more first (a sidecar of an earlier
    release ignores the ask).

    Sample times are shifted by the clock offset measured against the sidecar's /health (midpoint of
    the round trip), so client and server share the Locust master's clock.
    """
    base = sidecar_url.rstrip("/")
    try:
        t0 = time.time()
        health = json.loads(_get(base + "/health", token, timeout))
        t1 = time.time()
        offset = float(health["now"]) - (t0 + t1) / 2  # sidecar clock minus ours
        body = _get(f"{base}/series?start={start + offset}&end={end + offset}" + ("&fresh=1" if fresh else ""),
                    token, timeout)
    except urllib.error.HTTPError as exc:  # it answered: say what, not "unreachable"
        fix = (": give --sidecar-token (the sidecar's --token)" if exc.code in (401, 403) else "")
        return [], f"sidecar {public_url(sidecar_url)} refused the read (HTTP {exc.code} {exc.reason}){fix}"
    except (urllib.error.URLError, OSError, ValueError, KeyError, http.client.HTTPException) as exc:
        # HTTPException: a sidecar stopping mid-answer (IncompleteRead) at a run's end
        return [], f"sidecar {public_url(sidecar_url)} unreachable ({getattr(exc, 'reason', exc) or type(exc).__name__})"
    samples = []
    for raw in body.decode().splitlines():
        sample = json.loads(raw)
        sample["t_server"] = sample["t"]
        sample["t"] = sample["t"] - offset
        samples.append(sample)
    if not samples:
        return [], f"sidecar {public_url(sidecar_url)} had no samples for the run's window (last error: {health.get('last_error')})"
    return samples, None


class LiveServer:
    """The server side while a run goes on, for the web UI and the saturation watch: new samples fetched every
    ``interval`` seconds (only what arrived since the last poll), summarised like the end-of-run report.
    ``fetch(since, until)`` is the source: the sidecar's series (``sidecar``) or a Prometheus' (``prometheus``)."""

    def __init__(self, fetch: Callable[[float, float], tuple[list[dict], str | None]], start: float,
                 interval: float = 5.0) -> None:
        import gevent

        self.fetch, self.interval = fetch, interval
        #: the samples' numbers (what the charts, the saturation watch and the maxima read); the first and the latest
        #: kept whole besides, for the deltas of the histograms and per-label counters. Every sample was kept whole:
        #: a vLLM's histograms made the client grow ~0.07 MB a second beside a sidecar
        self.samples: list[dict] = []
        self.first: dict | None = None
        self.last: dict | None = None
        self.since = start
        self.why: str | None = "no sample yet"
        self._greenlet = gevent.spawn(self._poll)

    @classmethod
    def sidecar(cls, url: str, start: float, token: str = "", interval: float = 5.0) -> "LiveServer":
        return cls(lambda since, until: fetch_samples(url, since, until, token, timeout=5.0), start, interval)

    @classmethod
    def prometheus(cls, url: str, selector: str, start: float, token: str = "", interval: float = 5.0) -> "LiveServer":
        from vllm_load.plugin.sources.prometheus_source import fetch_range

        return cls(lambda since, until: fetch_range(url, selector, since, until, token, timeout=5.0), start, interval)

    def _poll(self) -> None:
        import gevent

        while True:
            new, why = self.fetch(self.since, time.time() + 1)
            self.take([s for s in new if s["t"] > self.since], why)
            gevent.sleep(self.interval)

    def take(self, new: list[dict], why: str | None = None) -> None:
        """New samples: their numbers kept, the first and latest whole."""
        if new:
            self.first = self.first or new[0]
            self.last = new[-1]
            self.samples.extend({k: v for k, v in s.items() if not isinstance(v, (dict, list))} for s in new)
            self.since = new[-1]["t"]
            self.why = None
        elif not self.samples:
            self.why = why

    def summary(self) -> dict | None:
        if self.first is None or self.last is None:
            return None
        return server_summary([self.first, *self.samples[1:-1], self.last] if len(self.samples) > 1 else [self.last])

    def stop(self) -> None:
        self._greenlet.kill(block=False)
