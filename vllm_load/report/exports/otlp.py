"""The run's LLM metrics over OpenTelemetry (OTLP/HTTP, protobuf) at its end: the same names, buckets and labels as
the Prometheus export (``metrics/fleet/prometheus.py``: vLLM's bucket bounds under the ``vllm_load:`` prefix), built
from the merged exact histograms, so that a collector (and whatever it feeds) gets the numbers the summary has.

``--otlp-endpoint http://collector:4318`` posts one ExportMetricsServiceRequest to ``/v1/metrics``; headers (an
API key) come from ``--otlp-header``. Needs ``opentelemetry-proto`` (``pip install 'vllm-load[otel]'``)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from typing import Any

import numpy as np

from vllm_load.errors import UsageError
from vllm_load.metrics.fleet.prometheus import EXPORTED, _cumulative


def _proto() -> Any:
    try:
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
        from opentelemetry.proto.common.v1 import common_pb2
        from opentelemetry.proto.metrics.v1 import metrics_pb2
    except ImportError:
        raise UsageError("--otlp-endpoint needs opentelemetry-proto: pip install 'vllm-load[otel]'") from None
    return metrics_service_pb2, common_pb2, metrics_pb2


def check_available() -> None:
    """Before the run: --otlp-endpoint without the package is one line and exit 2, not a failure at the end."""
    _proto()


def request_for(stats: Any, start: float, end: float, attributes: dict[str, str]) -> Any:
    """The ExportMetricsServiceRequest of a run: one cumulative histogram per exported metric, and the counters."""
    service, common, metrics = _proto()
    t0, t1 = int(start * 1e9), int(end * 1e9)

    def attrs(d: dict[str, str]) -> list:
        return [common.KeyValue(key=k, value=common.AnyValue(string_value=str(v))) for k, v in d.items()]

    out = []
    for key, name, bounds, doc in EXPORTED:
        hist = stats.hists[key]
        cumulative, total = _cumulative(hist, bounds)
        counts = np.diff(np.concatenate([[0.0], cumulative])).astype(np.int64)
        point = metrics.HistogramDataPoint(start_time_unix_nano=t0, time_unix_nano=t1, count=int(hist.count),
                                           sum=total, bucket_counts=[int(c) for c in counts],
                                           explicit_bounds=[float(b) for b in bounds], attributes=attrs({}))
        if hist.count:
            point.min, point.max = float(hist.min), float(hist.max)
        out.append(metrics.Metric(name=name, description=doc, unit="s", histogram=metrics.Histogram(
            data_points=[point], aggregation_temporality=metrics.AGGREGATION_TEMPORALITY_CUMULATIVE)))

    def counter(name: str, doc: str, values: list[tuple[dict[str, str], int]]) -> Any:
        points = [metrics.NumberDataPoint(start_time_unix_nano=t0, time_unix_nano=t1, as_int=int(v),
                                          attributes=attrs(a)) for a, v in values]
        return metrics.Metric(name=name, description=doc, sum=metrics.Sum(
            data_points=points, aggregation_temporality=metrics.AGGREGATION_TEMPORALITY_CUMULATIVE, is_monotonic=True))

    ok = stats.requests - stats.failures
    out += [counter("vllm_load:requests", "Finished requests by outcome.",
                    [({"outcome": "ok"}, ok), ({"outcome": "failed"}, stats.failures)]),
            counter("vllm_load:prompt_tokens", "Prompt tokens of the successful requests.", [({}, stats.input_tokens)]),
            counter("vllm_load:generation_tokens", "Output tokens of the successful requests.",
                    [({}, stats.output_tokens)])]
    from opentelemetry.proto.resource.v1 import resource_pb2

    resource = resource_pb2.Resource(attributes=attrs({"service.name": "vllm-load", **attributes}))
    scope = common.InstrumentationScope(name="vllm_load")
    return service.ExportMetricsServiceRequest(resource_metrics=[metrics.ResourceMetrics(
        resource=resource, scope_metrics=[metrics.ScopeMetrics(scope=scope, metrics=out)])])


def export(endpoint: str, stats: Any, start: float, end: float, attributes: dict[str, str],
           headers: dict[str, str] | None = None, timeout: float = 10.0) -> str | None:
    """Post the run's metrics; None, or why they did not go (said once; the run's verdict does not depend on it)."""
    body = request_for(stats, start, end, attributes).SerializeToString()
    url = endpoint.rstrip("/") + ("" if endpoint.rstrip("/").endswith("/v1/metrics") else "/v1/metrics")
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/x-protobuf", **(headers or {})})
    t = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        return f"the OTLP endpoint {url} answered HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return f"the OTLP endpoint {url} cannot be reached ({getattr(exc, 'reason', exc)}, {time.monotonic() - t:.1f} s)"
    return None
