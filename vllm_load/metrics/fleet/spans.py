"""The server's OpenTelemetry spans of the run's requests, joined to the client's records by trace id.

vLLM started with ``--otlp-traces-endpoint`` exports one ``llm_request`` span per request, under the trace id of the
request's ``traceparent`` (every request of a run carries its own: ``client/trace_context.py``), with its own times
(vLLM 0.32's ``OutputProcessor.do_tracing``, seconds): ``time_in_queue`` queued to scheduled,
``time_in_model_prefill`` scheduled to the first token, ``time_in_model_decode`` first to last token,
``time_to_first_token`` and ``e2e`` from its arrival, and ``gen_ai.request.id`` (the response id); and the exporting service's ``service.name``
(a replica's ``OTEL_SERVICE_NAME``: which replica served the request, where a router names none). The receiver
(``plugin/sources/span_receiver.py``) keeps them as lines of ``spans.jsonl``; here they become each record's server parts
where the stream's per-request metrics gave none, and the join is counted: spans, joined, unmatched.
"""

from __future__ import annotations

from typing import Any, Iterable
from vllm_load.metric_table import (CLIENT_OVERHEAD, E2E, KV_TRANSFER, SEND_LAG, SERVER_DECODE, SERVER_PREFILL,
                                    SERVER_QUEUE, TTFT)
from vllm_load.metrics.shape.breakdown import BEFORE_SERVER

#: vLLM's span of a request (the others, model loading and KV-cache allocation at start-up, are not requests)
REQUEST_SPAN = "llm_request"
#: span attribute -> the key it is kept under
ATTRIBUTES = {
    "gen_ai.latency.time_in_queue": "queue",
    "gen_ai.latency.time_in_model_prefill": "prefill",
    "gen_ai.latency.time_in_model_decode": "decode",
    "gen_ai.latency.time_to_first_token": TTFT,
    "gen_ai.latency.e2e": E2E,
    "gen_ai.request.id": "request_id",
    "gen_ai.usage.prompt_tokens": "prompt_tokens",
    "gen_ai.usage.completion_tokens": "completion_tokens",
}


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind in ("double_value", "int_value", "string_value", "bool_value") else None


def parse_export(body: bytes) -> list[dict[str, Any]]:
    """The request spans of one OTLP/HTTP ExportTraceServiceRequest (protobuf), each a flat dict: its trace id
    (lower-case hex) and the attributes above. Raises ValueError on a body that is not one."""
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    msg = trace_service_pb2.ExportTraceServiceRequest()
    try:
        msg.ParseFromString(body)
    except DecodeError as exc:
        raise ValueError(f"not an OTLP trace export: {exc}") from None
    out = []
    for resource in msg.resource_spans:
        service = next((_value(a.value) for a in resource.resource.attributes if a.key == "service.name"), None)
        # the replica that served it: each replica's OTEL_SERVICE_NAME (OpenTelemetry's default names no one)
        replica = service if isinstance(service, str) and not service.startswith("unknown_service") else None
        for scope in resource.scope_spans:
            for span in scope.spans:
                if span.name != REQUEST_SPAN:
                    continue
                row: dict[str, Any] = {"trace_id": span.trace_id.hex()}
                if span.start_time_unix_nano:
                    row["start"] = span.start_time_unix_nano / 1e9
                if replica:
                    row["replica"] = replica
                for attr in span.attributes:
                    key = ATTRIBUTES.get(attr.key)
                    if key is not None:
                        row[key] = _value(attr.value)
                out.append(row)
    return out


def export_request(spans: Iterable[dict[str, Any]], service: str = "unknown_service") -> bytes:
    """An ExportTraceServiceRequest of request spans (the emulator's, as vLLM sends them), from a service of that
    name: the inverse of ``parse_export``."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from opentelemetry.proto.common.v1 import common_pb2

    msg = trace_service_pb2.ExportTraceServiceRequest()
    resource = msg.resource_spans.add()
    resource.resource.attributes.add(key="service.name", value=common_pb2.AnyValue(string_value=service))
    scope = resource.scope_spans.add()
    names = {v: k for k, v in ATTRIBUTES.items()}
    for row in spans:
        span = scope.spans.add(name=REQUEST_SPAN, trace_id=bytes.fromhex(row["trace_id"]),
                               span_id=bytes.fromhex(row.get("span_id", "0" * 15 + "1")), kind=2)
        span.start_time_unix_nano, span.end_time_unix_nano = row.get("start_ns", 0), row.get("end_ns", 0)
        for key, value in row.items():
            name = names.get(key)
            if name is None or value is None:
                continue
            any_value = (common_pb2.AnyValue(string_value=value) if isinstance(value, str) else
                         common_pb2.AnyValue(int_value=value) if isinstance(value, int) else
                         common_pb2.AnyValue(double_value=float(value)))
            span.attributes.add(key=name, value=any_value)
    return msg.SerializeToString()


def _before_server(r: dict, span: dict) -> None:
    """The time from the request's send (its intended start and its send lag: the client's clock) to its arrival at
    the API server (its span's start: the server's clock): the network and any router. Exact on one host; across
    machines it rests on their clocks' alignment (NTP), which the report says."""
    if span.get("start") is not None and r.get("start") is not None:
        r[BEFORE_SERVER] = span["start"] - r["start"] - (r.get(SEND_LAG) or 0.0)


def _disaggregated(r: dict, prefill: dict, decode: dict) -> None:
    """A request served by a prefill and a decode instance (vLLM's router in P/D mode passes its traceparent to both):
    the prefill's queue and prefill, the decode's time to its first token (pulling the prompt's KV from the prefill,
    then one step) as ``kv_transfer``, the decode's decode; which instances served it."""
    r[SERVER_QUEUE], r[SERVER_PREFILL] = prefill.get("queue"), prefill.get("prefill")
    r[KV_TRANSFER], r[SERVER_DECODE] = decode.get(TTFT), decode.get("decode")
    r["server_ttft"] = (prefill.get(E2E) or 0.0) + (decode.get(TTFT) or 0.0)
    r["span_ttft"], r["server_e2e"] = r["server_ttft"], (prefill.get(E2E) or 0.0) + (decode.get(E2E) or 0.0)
    if r.get(TTFT) is not None:
        r[CLIENT_OVERHEAD] = r[TTFT] - r["server_ttft"]
    if decode.get("replica"):
        r["replica"] = decode["replica"]
    if prefill.get("replica"):
        r["prefill_replica"] = prefill["replica"]


def join(records: list[dict], spans: list[dict]) -> dict[str, int]:
    """Each record's server parts from its span (by trace id, else by response id) where the stream gave none;
    ``span_ttft`` and ``server_e2e`` from the span always. Two spans under one trace id are a prefill and a decode
    instance's (P/D, the earlier one the prefill): the parts come from both, whatever the stream said (the decode's
    own metrics know nothing of the prefill). Returns the join's counts: spans received, joined (to a record),
    unmatched (no record of this run's: another client's, or a request not logged), and the successful records
    left without a span."""
    by_trace: dict[str, list[dict]] = {}
    for s in spans:
        if s.get("trace_id"):
            by_trace.setdefault(s["trace_id"], []).append(s)
    by_id = {s["request_id"]: s for s in spans if s.get("request_id")}
    used: set[int] = set()
    for r in records:
        found = by_trace.get(r.get("trace_id") or "")
        if found and len(found) >= 2:
            pair = sorted(found, key=lambda s: s.get("start") or 0.0)
            used.update(id(s) for s in pair)
            _disaggregated(r, pair[0], pair[-1])
            _before_server(r, pair[0])
            continue
        span = found[0] if found else by_id.get(r.get("response_id") or "")
        if span is None:
            continue
        used.add(id(span))
        _before_server(r, span)
        r["span_ttft"], r["server_e2e"] = span.get(TTFT), span.get(E2E)
        if span.get("replica"):
            r["replica"] = span["replica"]
        if r.get(SERVER_QUEUE) is None and span.get("queue") is not None and span.get("prefill") is not None:
            r[SERVER_QUEUE], r[SERVER_PREFILL] = span["queue"], span["prefill"]
            r[SERVER_DECODE] = span.get("decode")
            r["server_ttft"] = span["queue"] + span["prefill"]
            if r.get(TTFT) is not None:
                r[CLIENT_OVERHEAD] = r[TTFT] - r["server_ttft"]
    ok = [r for r in records if r.get("ok")]
    return {"spans": len(spans), "joined": len(used), "unmatched": len(spans) - len(used),
            "requests_without": sum(1 for r in ok if r.get("span_ttft") is None and r.get("server_e2e") is None)}
