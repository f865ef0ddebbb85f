"""The emulator's OpenTelemetry spans, as vLLM's ``--otlp-traces-endpoint`` exports them: one ``llm_request`` span
per request that carried a ``traceparent``, under its trace id, with the emulator's own queue, prefill and decode
times (the attributes of vLLM 0.32's ``OutputProcessor.do_tracing``), posted in batches over OTLP/HTTP protobuf.
A run's ``--otlp-receiver`` then joins them exactly as it joins a real vLLM's."""

from __future__ import annotations

import sys
from typing import Any

import gevent
from geventhttpclient import HTTPClient, URL

from vllm_load.client.trace_context import HEADER, trace_id
from vllm_load.metrics.fleet.spans import export_request

#: seconds between exports (vLLM's batch exporter: 5 s; shorter here, so that a test's run ends sooner)
INTERVAL = 0.5


def trace_of(environ: dict) -> str | None:
    """The trace id of a request's W3C traceparent (the client's one parser of it), or None."""
    return trace_id({HEADER: environ.get("HTTP_TRACEPARENT", "")})


class SpanExporter:
    def __init__(self, endpoint: str, service: str) -> None:
        self.url = URL(endpoint)
        self.service = service  # its replica name (vLLM's: OTEL_SERVICE_NAME)
        self.client = HTTPClient.from_url(self.url, concurrency=1, connection_timeout=2.0, network_timeout=5.0)
        self.pending: list[dict[str, Any]] = []
        self.sent = 0
        self.failed = 0  # spans whose export failed (said once on stderr)
        self.loop = gevent.spawn(self._loop)  # stopped with the server (an emulator served in a test's process)

    def add(self, row: dict[str, Any]) -> None:
        self.pending.append(row)

    def _loop(self) -> None:
        while True:
            gevent.sleep(INTERVAL)
            if not self.pending:
                continue
            batch, self.pending = self.pending, []
            try:
                resp = self.client.post(self.url.request_uri, body=export_request(batch, self.service),
                                        headers={"Content-Type": "application/x-protobuf"})
                resp.read()
                if resp.status_code != 200:
                    raise OSError(f"HTTP {resp.status_code}")
                self.sent += len(batch)
            except Exception as exc:  # the collector is down: vLLM's exporter drops the batch and logs it too
                if not self.failed:
                    sys.stderr.write(f"emulator: span export to {self.url} failed: {exc}\n")
                self.failed += len(batch)
