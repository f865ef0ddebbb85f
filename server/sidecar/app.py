"""Sidecar beside vLLM: scrape /metrics into a time series, write it as JSON-lines, serve it over HTTP.

    python -m server.sidecar --vllm-url http://127.0.0.1:8000 [--interval 1s] [--listen 127.0.0.1:9101]
    python -m server.sidecar --log-file vllm.log     # or --log-file - : parse vLLM's stats log lines

GET /series?start=T0&end=T1 returns the samples of a window as JSON-lines; GET /health tells the
sidecar's clock, so a Locust master on another machine can put both sides on one clock. A request whose ``Host``
is not one of the sidecar's names (loopback, ``--listen``'s host, this machine's names when it listens on every
interface, each ``--allowed-host``) or that a browser page sent (``Origin``, a cross-site ``Sec-Fetch-Site``) is
refused: a page elsewhere that rebound its DNS name to this machine could otherwise read the series.
"""

from __future__ import annotations

import argparse
import math
import hmac
import ipaddress
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any, Callable
from urllib.parse import parse_qs, urlparse

from .vllm_schema import derive, parse_log_line, parse_metrics

MAX_SAMPLES = 200_000  # ~2 days at 1 s: the in-memory window; the JSON-lines file keeps everything


def parse_interval(text: str) -> float:
    t = text.strip().lower()
    try:
        value = float(t[:-2]) / 1000 if t.endswith("ms") else float(t[:-1]) if t.endswith("s") else float(t)
    except ValueError:
        raise ValueError(f"--interval {text!r} is not a duration: use e.g. 1s, 500ms or 2") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"--interval must be a positive finite duration, got {text!r}")
    return value


class Series:
    """Thread-safe list of samples, appended to a JSON-lines file as they arrive."""

    def __init__(self, out: Path | None) -> None:
        self.samples: list[dict] = []
        self.lock = threading.Lock()
        self.fh: IO[str] | None = open(out, "a", buffering=1, encoding="utf-8") if out else None
        self.last_error: str | None = None

    def add(self, sample: dict) -> None:
        with self.lock:
            prev = self.samples[-1] if self.samples else None
            sample = derive(sample, prev)
            self.samples.append(sample)
            if len(self.samples) > MAX_SAMPLES:
                del self.samples[: len(self.samples) - MAX_SAMPLES]
            if self.fh:
                self.fh.write(json.dumps(sample) + "\n")

    def window(self, start: float, end: float) -> list[dict]:
        with self.lock:
            return [s for s in self.samples if start <= s["t"] <= end]


def scrape_once(url: str, series: Series, timeout: float) -> None:
    """One sample of vLLM's /metrics into the series (a failure is said once, until it is back)."""
    target = url.rstrip("/") + "/metrics"
    try:
        with urllib.request.urlopen(target, timeout=timeout) as resp:
            text = resp.read().decode("utf-8", "replace")
        sample = parse_metrics(text)
        sample["t"] = time.time()
        sample["source"] = "metrics"
        series.add(sample)
        if series.last_error:
            sys.stderr.write(f"sidecar: {target} is back\n")
        series.last_error = None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        msg = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
        if msg != series.last_error:
            sys.stderr.write(f"sidecar: cannot scrape {target} ({msg})\n")
        series.last_error = msg


def scrape_forever(url: str, interval: float, series: Series, stop: threading.Event) -> None:
    next_at = time.monotonic()
    while not stop.is_set():
        scrape_once(url, series, max(1.0, 2 * interval))
        next_at += interval
        stop.wait(max(0.0, next_at - time.monotonic()))


def follow_log(stream: IO[str], series: Series, stop: threading.Event, follow: bool = True) -> None:
    """Parse stats lines as they are written (like ``tail -f`` for a file; stdin ends at EOF)."""
    while not stop.is_set():
        line = stream.readline()
        if not line:
            if not follow:
                return
            stop.wait(0.2)
            continue
        sample = parse_log_line(line)
        if sample is not None:
            sample["t"] = time.time()
            series.add(sample)


def make_handler(series: Series, token: str, scrape: Callable[[], None] | None = None,
                 names: frozenset[str] | None = None) -> type[BaseHTTPRequestHandler]:
    """``scrape``: take a sample now (``/series?fresh=1``: a run's end reads a series that includes its last
    requests, instead of one up to an interval old); None when the samples come from a log. ``names``: the
    ``Host`` names it answers to (default: loopback's)."""
    from vllm_load.host_names import LOOPBACK_NAMES, refusal

    names = LOOPBACK_NAMES if names is None else names

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet: the sidecar's output is its data
            pass

        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            why = refusal(self.headers.get("Host") or "", self.headers.get("Origin"),
                          self.headers.get("Sec-Fetch-Site"), names, "this sidecar")
            if why is not None:
                return self._send(403, json.dumps({"error": why + " (add --allowed-host NAME)"}).encode())
            if token and not hmac.compare_digest((self.headers.get("Authorization") or "").encode(),
                                                 f"Bearer {token}".encode()):
                return self._send(401, b'{"error": "missing or wrong bearer token"}')
            url = urlparse(self.path)
            if url.path == "/health":
                body = {"ok": True, "now": time.time(), "samples": len(series.samples), "last_error": series.last_error}
                return self._send(200, json.dumps(body).encode())
            if url.path == "/series":
                q = parse_qs(url.query)
                try:
                    start = float(q.get("start", ["0"])[0])
                    end = float(q.get("end", ["inf"])[0])
                except ValueError:
                    return self._send(400, b'{"error": "start and end are unix times in seconds"}')
                if scrape is not None and q.get("fresh", ["0"])[0] == "1":
                    scrape()
                lines = "".join(json.dumps(s) + "\n" for s in series.window(start, end))
                return self._send(200, lines.encode(), "application/x-ndjson")
            return self._send(404, b'{"error": "not found"}')

    return Handler


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m server.sidecar", description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-url", default="http://127.0.0.1:8000", help="vLLM server to scrape")
    ap.add_argument("--interval", default="1s", help="scrape interval (1s, 500ms, …)")
    ap.add_argument("--listen", default="127.0.0.1:9101", help="HOST:PORT to serve the series on (port 0: free port)")
    ap.add_argument("--out", default="server-series.jsonl", help="JSON-lines file the samples are appended to ('' for none)")
    ap.add_argument("--log-file", default="", help="parse vLLM stats log lines from this file ('-' for stdin) instead of /metrics")
    ap.add_argument("--token", default=os.environ.get("VLLM_LOAD_SIDECAR_TOKEN", ""),
                    help="require this bearer token on the HTTP API (default: $VLLM_LOAD_SIDECAR_TOKEN, the name "
                    "the master's --sidecar-token reads: one secret for both)")
    ap.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                    help="a name the sidecar answers to besides loopback, --listen's host and (listening on every "
                    "interface) this machine's names: the one the master's --sidecar-url uses (repeatable)")
    ap.add_argument("--wait-for-server", default="0",
                    help="wait this long (30s, 15m, …) for vLLM's /health before serving, with a progress line every 10 s")
    return ap


class BadArguments(ValueError):
    """An argument the sidecar refuses, or a port or file it cannot take: its one line (exit 2)."""


def build(argv: list[str]) -> Sidecar:
    """The sidecar of these arguments, bound and scraping (``start`` or ``serve_forever`` serves it)."""
    args = build_parser().parse_args(argv)
    try:
        interval = parse_interval(args.interval)
        host, _, port_text = args.listen.rpartition(":")
        port = int(port_text)
        if not 0 <= port <= 65535:
            raise ValueError(port_text)
    except ValueError as exc:
        raise BadArguments(str(exc) if "interval" in str(exc) else "--listen must be HOST:PORT, the port 0-65535") \
            from None
    from vllm_load.errors import UsageError
    from vllm_load.runtime.server_wait import wait_for_server
    from vllm_load.workload.lengths import parse_duration

    try:
        wait = parse_duration(args.wait_for_server, "--wait-for-server")
        if wait > 0 and not args.log_file:
            wait_for_server(args.vllm_url, wait, models=False, prefix="sidecar",
                            say=lambda line: print(line, file=sys.stderr, flush=True))
    except UsageError as exc:
        raise BadArguments(str(exc)) from None
    host = host.strip("[]") or "127.0.0.1"
    if not _is_loopback(host) and not args.token:
        sys.stderr.write(f"sidecar: warning: serving on {host} without --token: anyone who reaches it can read the series\n")
    try:
        return Sidecar.bind(host, port, args.vllm_url, interval, Path(args.out) if args.out else None, args.token,
                            log_file=args.log_file, allowed=tuple(args.allowed_host))
    except OSError as exc:
        raise BadArguments(f"{exc}: check --out and --listen") from None


def main(argv: list[str] | None = None) -> int:
    from vllm_load.lifeline import from_environment

    from_environment()  # embedded in a run: gone with it, however it ends
    try:
        sidecar = build(sys.argv[1:] if argv is None else argv)
    except BadArguments as exc:
        sys.stderr.write(f"sidecar: error: {exc}\n")
        return 2
    source = sidecar.log_file or sidecar.vllm_url
    print(f"vllm-load sidecar listening on {sidecar.url} scraping {source}", flush=True)
    try:
        sidecar.server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        sidecar.stopping.set()
    return 0


class Sidecar:
    """A sidecar bound to its port, its scraper (or log follower) running; ``serve_forever`` (``main``) or ``start``
    (a thread of its own: a sidecar inside a test's or a run's process) serves it."""

    def __init__(self, server: ThreadingHTTPServer, series: Series, stopping: threading.Event, vllm_url: str,
                 log_file: str) -> None:
        self.server, self.series, self.stopping = server, series, stopping
        self.vllm_url, self.log_file = vllm_url, log_file
        host, port = server.server_address[:2]
        self.url = f"http://{host}:{port}"

    @classmethod
    def bind(cls, host: str, port: int, vllm_url: str, interval: float, out: Path | None, token: str = "",
             log_file: str = "", allowed: tuple[str, ...] = ()) -> Sidecar:
        from vllm_load.host_names import allowed_names

        series = Series(out)
        scrape = None if log_file else (lambda: scrape_once(vllm_url, series, max(1.0, 2 * interval)))
        server = ThreadingHTTPServer((host, port), make_handler(series, token, scrape, allowed_names(host, allowed)))
        stopping = threading.Event()
        if log_file:
            stream = sys.stdin if log_file == "-" else open(log_file, encoding="utf-8", errors="replace")
            worker = threading.Thread(target=follow_log, args=(stream, series, stopping, log_file != "-"), daemon=True)
        else:
            worker = threading.Thread(target=scrape_forever, args=(vllm_url, interval, series, stopping), daemon=True)
        worker.start()
        return cls(server, series, stopping, vllm_url, log_file)

    def start(self) -> Sidecar:
        # polled each 50 ms for its stop (socketserver's 0.5 s made every embedded run's end wait up to 0.5 s more)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.stopping.is_set():
            return
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()
        if self.series.fh is not None:
            self.series.fh.close()


if __name__ == "__main__":
    sys.exit(main())
