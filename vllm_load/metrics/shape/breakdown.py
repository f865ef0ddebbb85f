"""Where each request's time went: the client's timeline joined to the server's own times of that request.

A p99 TTFT of 480 ms says that something is slow, not what. vLLM says per request (its per-request metrics, in the
stream's last chunk) how long the request waited to be scheduled, how long from its scheduling to its first token
(the prefill), and from its first token to its last (the decode); the client's TTFT beyond the engine's is the client,
the network, a router and the API server. With the server's spans (--otlp-receiver), whose TTFT runs from the
request's arrival at the API server, the API server's own share is split out (input processing, the engine busy
between steps: 214 ms a request against two real replicas behind vllm-router, which "client/network" held), and
the rest is the client's, the network's and the router's. Here, from the request logs: each part's percentiles
(exact, over the requests that carried them; SLOs such as ``server_queue.p99<=100ms``), and for TTFT and E2E at
p50/p90/p99 the mean split of the requests in that tail.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable
from vllm_load.metric_table import CLIENT_OVERHEAD, E2E, KV_TRANSFER, SERVER_DECODE, SERVER_PREFILL, SERVER_QUEUE, TTFT
from vllm_load.metrics.records import nearest_rank
from vllm_load.metrics.summary_parts import SpansJoined, Timing

#: the tails' parts a span adds: the API server's share of TTFT, and the rest outside the server; with the span's start,
#: that rest splits into the way to the server (the span's start less the request's send: network and router) and the
#: client's side (its send lag, the answer's way back, the read)
API_SERVER, OUTSIDE, BEFORE_SERVER, CLIENT_SIDE = "api_server", "outside", "before_server", "client_side"
#: a request's parts, seconds (records' fields): the server's queue, prefill, decode, their TTFT, the client's rest, and
#: with a span the way to the server
PARTS = (SERVER_QUEUE, SERVER_PREFILL, KV_TRANSFER, SERVER_DECODE, "server_ttft", CLIENT_OVERHEAD, BEFORE_SERVER)
#: what each tail is split into (an E2E's client part is what the server's three parts leave of it)
SPLITS = {TTFT: (SERVER_QUEUE, SERVER_PREFILL, KV_TRANSFER, CLIENT_OVERHEAD),
          E2E: (SERVER_QUEUE, SERVER_PREFILL, KV_TRANSFER, SERVER_DECODE, "client")}
#: the same with the spans' TTFT: the API server's share, and what lies outside the server
SPAN_SPLITS = {TTFT: (SERVER_QUEUE, SERVER_PREFILL, API_SERVER, OUTSIDE),
               E2E: (SERVER_QUEUE, SERVER_PREFILL, SERVER_DECODE, API_SERVER, "outside_e2e")}
#: the same with the spans' start too: the way to the server apart from the client's side
START_SPLITS = {TTFT: (SERVER_QUEUE, SERVER_PREFILL, API_SERVER, BEFORE_SERVER, CLIENT_SIDE),
                E2E: (SERVER_QUEUE, SERVER_PREFILL, SERVER_DECODE, API_SERVER, BEFORE_SERVER, "client_side_e2e")}
REST = "client/network/router/API server"  # what the rest holds, without a span to split it
LABELS = {SERVER_QUEUE: "queue", SERVER_PREFILL: "prefill", SERVER_DECODE: "decode", "server_ttft": "server TTFT",
          KV_TRANSFER: "KV transfer", API_SERVER: "API server",
          CLIENT_OVERHEAD: REST, "client": REST, OUTSIDE: "client/network/router", "outside_e2e": "client/network/router",
          BEFORE_SERVER: "network/router to the server", CLIENT_SIDE: "client (send lag, the way back, the read)",
          "client_side_e2e": "client (send lag, the way back, the read)"}
TAILS = (50.0, 90.0, 99.0)


def _stats(values: list[float], percentiles: Iterable[float] = (50.0, 90.0, 99.0, 99.9)) -> dict[str, float]:
    """Count, mean, min, max and each of ``percentiles`` (nearest rank) of ``values``."""
    values = sorted(values)
    out = {"count": len(values), "mean": sum(values) / len(values), "max": values[-1], "min": values[0]}
    out.update({f"p{q:g}": nearest_rank(values, q) for q in percentiles})
    return out


def _api_server(r: dict) -> float:
    """The API server's share of a request's TTFT: its span's TTFT (from its arrival at the API server) beyond the
    engine's queue and prefill; 0 without a span."""
    if r.get("span_ttft") is None:
        return 0.0
    return max(0.0, r["span_ttft"] - (r.get(SERVER_QUEUE) or 0.0) - (r.get(SERVER_PREFILL) or 0.0))


def _part(r: dict, part: str) -> float:
    if part in ("client", "outside_e2e", "client_side_e2e"):
        return (r[E2E] - r[SERVER_QUEUE] - r[SERVER_PREFILL] - (r.get(SERVER_DECODE) or 0.0)
                - (r.get(KV_TRANSFER) or 0.0) - (_api_server(r) if part != "client" else 0.0)
                - ((r.get(BEFORE_SERVER) or 0.0) if part == "client_side_e2e" else 0.0))
    if part == API_SERVER:
        return _api_server(r)
    if part in (OUTSIDE, CLIENT_SIDE):
        return ((r.get(CLIENT_OVERHEAD) or 0.0) - _api_server(r)
                - ((r.get(BEFORE_SERVER) or 0.0) if part == CLIENT_SIDE else 0.0))
    return r.get(part) or 0.0


def _tails(joined: list[dict], percentiles: Iterable[float]) -> dict[str, dict[str, Any]]:
    """TTFT's and E2E's tails at each percentile: the tail's edge, its requests and their mean split."""
    tails: dict[str, dict[str, Any]] = {}
    pd = any(r.get(KV_TRANSFER) is not None for r in joined)  # disaggregated: the KV transfer is a part of its own
    # the spans' TTFT splits the API server out (a P/D pair's spans are two instances': their TTFT is the pair's)
    spans = not pd and any(r.get("span_ttft") is not None for r in joined)
    starts = spans and all(r.get(BEFORE_SERVER) is not None for r in joined)  # the spans' starts: every request's
    for metric, split in ((m, tuple(p for p in s if pd or p != KV_TRANSFER))
                          for m, s in (START_SPLITS if starts else SPAN_SPLITS if spans else SPLITS).items()):
        values = sorted(r[metric] for r in joined)
        tails[metric] = {}
        for q in sorted(set(percentiles)):
            edge = nearest_rank(values, q)
            tail = [r for r in joined if r[metric] >= edge]
            tails[metric][f"p{q:g}"] = {"value": edge, "requests": len(tail),
                                         "split": {p: sum(_part(r, p) for r in tail) / len(tail) for p in split}}
    return tails


#: the groups a run's tails are also split by, where it has more than one: the replica that served each request
#: (its response header, its span, or the client's --host target) and the request's name (name=, a turn, a step)
GROUPS = {"replica": lambda r: r.get("replica") or r.get("target"), "name": lambda r: r.get("name")}


def breakdown(records: Iterable[dict], percentiles: Iterable[float] = TAILS,
              replica_of: Callable[[dict], str | None] | None = None) -> Timing | None:
    """The parts' statistics and the tails' splits over the measured requests with the server's times, and the
    p99 tails per replica and per name where there are several; None without any. ``replica_of``: which replica
    served a record (the routing verdict's rule), else its span's replica or its target."""
    joined = [r for r in records if r.get("ok") and not r.get("warmup") and not r.get("removed")
              and r.get("server_ttft") is not None and r.get(TTFT) is not None]
    if not joined:
        return None
    percentiles = tuple(sorted(set(percentiles) | {50.0}))
    parts = {p: _stats([r[p] for r in joined if r.get(p) is not None], percentiles) for p in PARTS
             if any(r.get(p) is not None for r in joined)}
    out: dict[str, Any] = {"requests": len(joined), "parts": parts, "tails": _tails(joined, percentiles)}
    for group, key in GROUPS.items():
        key = replica_of if group == "replica" and replica_of is not None else key
        members: dict[str, list[dict]] = {}
        for r in joined:
            label = key(r)
            if label:
                members.setdefault(str(label), []).append(r)
        if len(members) > 1:  # one group is the run itself
            out[f"by_{group}"] = {label: {"requests": len(rs), "tails": _tails(rs, (99.0,))}
                                  for label, rs in sorted(members.items())}
    return Timing(out)


def spans_line(spans: SpansJoined) -> str:
    """--otlp-receiver: how the server's spans joined the requests, in one line."""
    return (f"server spans: {spans.joined} of {spans.spans} joined to this run's requests ({spans.unmatched} "
            f"unmatched); {spans.requests_without} answered requests had none")


def tail_lines(b: Timing | None) -> list[str]:
    """The console's lines: where TTFT's and E2E's tails went."""
    if not b:
        return []
    out = [spans_line(b.spans)] if b.spans else []
    for metric in (TTFT, E2E):
        said: set[tuple[float, int]] = set()
        tails = b.tails.get(metric, {})
        for q, tail in tails.items():
            if q != "p99" and q != max(tails, key=lambda k: float(k[1:])):
                continue
            if (tail.value, tail.requests) in said:  # a tail of the same requests: said once
                continue
            said.add((tail.value, tail.requests))
            split = ", ".join(f"{max(0.0, v) * 1000:.1f} {LABELS[p]}" for p, v in tail.split.items())
            over = -min(0.0, *tail.split.values())
            out.append(f"where {metric.upper()} {q} ({tail.value * 1000:.1f} ms, the {tail.requests} slowest "
                       f"requests) went, on average: {split} ms" + (
                           f" (the server's parts exceed the client's time by {over * 1000:.1f} ms: the rest is "
                           "shown as 0; the server counts time the client's clock does not)" if over > 0 else ""))
    for group in GROUPS:  # per replica, per name: TTFT's p99 each
        rows = b.groups(group)
        if rows:
            each = "; ".join(f"{label} {g.tail(TTFT).value * 1000:.1f} ms ("
                             + ", ".join(f"{v * 1000:.1f} {LABELS[p]}" for p, v in g.tail(TTFT).split.items())
                             + ")" for label, g in rows.items())
            out.append(f"TTFT p99 per {group}: {each}")
    return out
