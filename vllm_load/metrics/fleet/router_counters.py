"""What the router did about a fault, from its own counters (``--router-metrics``: vllm-router's Prometheus
endpoint, read at each fault action's start and at the run's end): the client sees a request fail or succeed, the
router alone knows it retried it on a dead worker first, gave up on it (its 500), or opened that worker's circuit
breaker. Measured against vllm-router 0.1.17 over two emulators, one killed: 8 retries, 2 given up after 5 attempts
each (the client's two 500s), the dead worker's breaker opened once, then every request went to the other."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from vllm_load.redact import redact_urls

#: counter sample -> key: the route's totals
TOTALS = {"vllm_router_retries_total": "retries", "vllm_router_retries_exhausted_total": "gave_up",
          "vllm_router_request_errors_total": "errors"}


def parse(text: str) -> dict[str, Any]:
    """The counters a fault moves: ``retries``, ``gave_up``, ``errors`` (summed over routes), and per worker
    ``failures`` (its circuit breaker's failure outcomes), ``opened`` (its breaker's moves to open), ``served`` (its
    breaker's success outcomes: ``processed_requests_total`` counts the failed attempts too, and a dead worker was
    said to have served 10) and ``attempts`` (the requests it processed, failed ones included). Raises ValueError
    when ``text`` holds no vllm-router counter."""
    out: dict[str, Any] = {"retries": 0.0, "gave_up": 0.0, "errors": 0.0, "failures": {}, "opened": {}, "served": {},
                           "attempts": {}}
    seen = outcomes = False
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.name.startswith("vllm_router_"):
                continue
            seen = True
            worker = redact_urls(s.labels.get("worker", ""))  # a worker's URL as the router has it, no credentials
            if s.name in TOTALS:
                out[TOTALS[s.name]] += float(s.value)
            elif s.name == "vllm_router_cb_outcomes_total" and s.labels.get("outcome") == "failure":
                out["failures"][worker] = out["failures"].get(worker, 0.0) + float(s.value)
            elif s.name == "vllm_router_cb_outcomes_total" and s.labels.get("outcome") == "success":
                outcomes = True
                out["served"][worker] = out["served"].get(worker, 0.0) + float(s.value)
            elif s.name == "vllm_router_cb_state_transitions_total" and s.labels.get("to") == "open":
                out["opened"][worker] = out["opened"].get(worker, 0.0) + float(s.value)
            elif s.name == "vllm_router_processed_requests_total":
                out["attempts"][worker] = float(s.value)
    if not seen:
        raise ValueError("it serves no vllm_router_* counter")
    if not outcomes:  # no breaker outcomes: what a worker served is what it processed less its failures
        out["served"] = {w: n - out["failures"].get(w, 0.0) for w, n in out["attempts"].items()}
    return out


def increase(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """``after`` less ``before``, key by key and worker by worker (a counter absent before counts from 0)."""
    out: dict[str, Any] = {}
    for key, value in after.items():
        if isinstance(value, dict):
            out[key] = {w: v - before.get(key, {}).get(w, 0.0) for w, v in value.items()
                        if v - before.get(key, {}).get(w, 0.0)}
        else:
            out[key] = value - before.get(key, 0.0)
    return out


def per_action(faults: list[dict], end: dict | None) -> list[dict]:
    """Each action's record with ``router``: the increase from its start to the next action's start (the run's end
    for the last); ``router_error`` where a read failed. Records without a router read are left as they were."""
    out = []
    for i, f in enumerate(faults):
        f = dict(f)
        start = f.pop("router_at", None)
        if start is None:
            out.append(f)
            continue
        stop = faults[i + 1].get("router_at") if i + 1 < len(faults) else end
        if isinstance(start, str) or isinstance(stop, str) or stop is None:
            f["router_error"] = next((x for x in (start, stop) if isinstance(x, str)), "not read at the run's end")
        else:
            f["router"] = increase(start, stop)
        out.append(f)
    return out


def text(counts: dict[str, Any]) -> str:
    """``8 retries, 2 given up, 10 failures on http://r2:8000, its breaker opened``."""
    parts = [f"{counts['retries']:.0f} retries", f"{counts['gave_up']:.0f} given up"]
    for worker, failed in sorted(counts.get("failures", {}).items()):
        opened = counts.get("opened", {}).get(worker)
        parts.append(f"{failed:.0f} failures on {worker}" + (", its breaker opened" if opened else ""))
    return ", ".join(parts)
