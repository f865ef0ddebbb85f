"""``--otlp-receiver HOST:PORT``: an OTLP/HTTP trace endpoint in the run (the master of a swarm) that vLLM's
``--otlp-traces-endpoint`` exports its per-request spans to, so that the report can say where each request's time
went on the server without any collector (``metrics/fleet/spans.py`` joins them to the requests).

Protobuf only (``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`` on vLLM: its default is gRPC). Loopback by
default; a foreign ``Host`` (DNS rebinding) or any browser ``Origin`` is refused, bodies are bounded."""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

import gevent
import gevent.event
from gevent.pywsgi import WSGIServer

from vllm_load.errors import UsageError
from vllm_load.metrics.fleet.spans import parse_export
from vllm_load.host_names import LOOPBACK_NAMES, host_name

log = logging.getLogger(__name__)
PATH = "/v1/traces"
#: the largest export accepted: vLLM's batch exporter sends at most 512 spans (~300 KB) at a time
MAX_BODY = 16 << 20
#: the most spans a run keeps: a P/D fleet's two per request for 100,000 requests. Every span sent was kept: three
#: valid 16 MB exports took the process from 159 to 686 MB and made the run untrustworthy; past this the rest of
#: an export is dropped, counted, and the run's end says so
MAX_SPANS = 200_000
#: how long the end of a run waits for the spans of its last requests: vLLM's batch exporter sends every 5 s
#: (OTEL_BSP_SCHEDULE_DELAY), so twice that and some
WAIT_S = 12.0


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT (or PORT: on 127.0.0.1); a clear one-line error otherwise."""
    host, _, port = text.rpartition(":") if ":" in text else ("127.0.0.1", "", text)
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"--otlp-receiver {text!r}: give HOST:PORT (e.g. 127.0.0.1:4318) or a port")
    return host, int(port)


def check_available() -> None:
    try:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2  # noqa: F401
    except ImportError:
        raise UsageError("--otlp-receiver needs opentelemetry-proto: pip install 'vllm-load[otel]'") from None


class SpanReceiver:
    """The spans received since the run started (``clear`` at each start), with counts of what was refused."""

    def __init__(self, address: str) -> None:
        check_available()
        self.host, port = parse_address(address)
        self.spans: list[dict[str, Any]] = []
        self.exports = 0  # export requests taken
        self.refused = 0  # requests answered 4xx (wrong path, host, type, size or body)
        self.dropped = 0  # spans past MAX_SPANS in this run, not kept
        self._arrived = gevent.event.Event()
        self.server = WSGIServer((self.host, port), self._app, log=None, error_log=None)
        try:
            self.server.start()
        except OSError as exc:
            raise UsageError(f"--otlp-receiver {address}: cannot listen there ({exc.strerror or exc})") from None

    @property
    def endpoint(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.server.server_port}{PATH}"

    def banner(self) -> str:
        wide = "" if host_name(self.host) in LOOPBACK_NAMES else (
            f"; warning: it listens on {'every interface' if self.host in ('0.0.0.0', '::') else self.host}, "
            "unauthenticated: anything that reaches the port can send spans into the run's report (at most "
            f"{MAX_SPANS} spans a run; no secret is there to take). Keep it on a private network")
        return (f"vllm-load: OTLP trace receiver at {self.endpoint}: start vLLM with --otlp-traces-endpoint "
                f"{self.endpoint} and OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf (its spans say where each "
                f"request's time went){wide}")

    def clear(self) -> None:
        self.spans, self.dropped = [], 0

    def complete(self, expected: int) -> bool:
        """Spans of ``expected`` requests came: as many trace ids, and where the fleet is disaggregated (a trace with
        a prefill's and a decode's span), two for each."""
        traces = Counter(s.get("trace_id") for s in self.spans)
        if len(traces) < expected:
            return False
        return not any(n >= 2 for n in traces.values()) or all(n >= 2 for n in traces.values())

    def wait_for(self, expected: int, timeout: float = WAIT_S) -> bool:
        """Until the spans of ``expected`` requests came, at most ``timeout`` seconds; whether they did."""
        deadline = time.monotonic() + timeout
        while not self.complete(expected):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._arrived.clear()
            self._arrived.wait(left)
        return True

    def close(self) -> None:
        self.server.stop(timeout=1)

    def _own_host(self, value: str) -> bool:
        """A Host naming this receiver: a loopback name or its address (bound to every address, any name: replicas
        on other machines name it as they reach it; browsers are refused by Origin and by the protobuf type, which
        no cross-origin page can send without a preflight this receiver never answers)."""
        if self.host in ("0.0.0.0", "::"):
            return True
        return host_name(value) in (*LOOPBACK_NAMES, self.host.lower())

    def _refuse(self, start_response: Any, status: str, why: str) -> list[bytes]:
        self.refused += 1
        start_response(status, [("Content-Type", "text/plain")])
        return [why.encode()]

    def _app(self, environ: dict, start_response: Any) -> list[bytes]:
        if not self._own_host(environ.get("HTTP_HOST", "")) or environ.get("HTTP_ORIGIN"):
            return self._refuse(start_response, "403 Forbidden", "foreign Host or a browser's request")
        if environ.get("PATH_INFO") != PATH:
            return self._refuse(start_response, "404 Not Found", f"spans go to {PATH}")
        if environ.get("REQUEST_METHOD") != "POST":
            return self._refuse(start_response, "405 Method Not Allowed", "POST only")
        if not environ.get("CONTENT_TYPE", "").startswith("application/x-protobuf"):
            return self._refuse(start_response, "415 Unsupported Media Type",
                                "protobuf only: set OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf on the server")
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            return self._refuse(start_response, "413 Content Too Large", f"at most {MAX_BODY} bytes")
        try:
            # parsed off the loop: a 16 MB export held it ~0.3 s (and the run's trust with it); in a thread the
            # loop's longest wait is ~30 ms (benchmarks/span_parse.py)
            spans = gevent.get_hub().threadpool.apply(parse_export, (environ["wsgi.input"].read(length),))
        except ValueError as exc:
            return self._refuse(start_response, "400 Bad Request", str(exc))
        self.exports += 1
        room = max(0, MAX_SPANS - len(self.spans))
        self.dropped += max(0, len(spans) - room)
        self.spans.extend(spans[:room])
        self._arrived.set()
        start_response("200 OK", [("Content-Type", "application/x-protobuf")])
        return [b""]  # an empty ExportTraceServiceResponse: everything accepted
