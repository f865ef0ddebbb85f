"""The routing verdict: how a fleet (behind a router, or ``--host a,b``) served the run: each replica's share, the
sessions kept on one replica, and the prefix-cache hits kept of those the sessions made achievable, counted from
the request logs at the run's end by its mechanism (``metrics/fleet/routing.py``: ``at_logs``, handed the server's
own KV block and prefix-cache counters), said on the console, in summary.md and in the report's Routing section (a
row per replica), and gated: ``--slo 'session_stickiness>=100%'``, ``cache_hits_of_achievable``, ``replica_imbalance``.

Why a module: the verdict was written into eight hubs (the summary's fields, the report's analyses, the SLO
lookup, the console, the report and its template, the web UI); here it is one file and its mechanism."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vllm_load.feature_spec import Feature
from vllm_load.metric_table import INPUT_TOKENS

#: vLLM's KV-cache block (its default --block-size): the prefix cache hits whole blocks only
BLOCK = 16
#: where the achieved hits come from: the answers' usage, else the fleet's own counters
ANSWERS, COUNTERS = "the answers' cached tokens", "the replicas' own vllm:prefix_cache_hits (sidecars)"
#: why the achieved hits are not known, and what gives them
NO_CACHED_TOKENS = ("not known: the answers carry no cached tokens (start vLLM with --enable-prompt-tokens-details, "
                    "or give each replica's sidecar: --sidecar-url a,b)")
#: its SLO metrics, each a key of its part
METRICS = {"cache_hits_of_achievable": "%", "replica_imbalance": "", "session_stickiness": "%"}
#: the report's table of replicas
HEAD = ["replica", "requests", "failed", "input tokens", "cached tokens"]


def describe(r: Mapping[str, Any] | None) -> str:
    """One line: the replicas' shares, the sessions' stickiness, the hits kept ('' without a verdict)."""
    if not r:
        return ""
    replicas = r.get("replicas") or {}
    shares = ", ".join(f"{name} {row.get('requests', 0)}" for name, row in replicas.items())
    out = f"routing ({r.get('source', '')}): {len(replicas)} replicas ({shares}; imbalance " \
          f"{r.get('replica_imbalance', 1.0):.2f})"
    if r.get("unattributed"):
        out += (f"; {r['unattributed']} failed requests named no replica (no span or header: they failed before one "
                "answered)")
    if r.get("session_stickiness") is not None:
        out += (f"; {r.get('sticky_sessions', 0)} of {r.get('sessions', 0)} sessions kept on one replica "
                f"({r['session_stickiness']:.0%})")
    block = r.get("cache_block") or BLOCK
    blocks = f" in the server's {block}-token blocks" if block != BLOCK else ""
    achievable = r.get("cache_hits_achievable") or 0
    if r.get("cache_hits_of_achievable") is not None:
        counted = f", from {COUNTERS}" if r.get("cache_hits_source") == COUNTERS else ""
        out += (f"; prefix-cache hits {r.get('cache_hits_achieved')} of {achievable} achievable tokens{blocks} "
                f"({r['cache_hits_of_achievable']:.0%}{counted})")
    elif achievable and r.get("cache_hits_unknown"):
        out += f"; prefix-cache hits of {achievable} achievable tokens{blocks} {r['cache_hits_unknown']}"
    return out


class Routing(Feature):
    name = "routing"
    tone = "note"
    parts = ("metrics/fleet/routing.py",)
    at_logs = "vllm_load.metrics.fleet.routing:from_logs"
    slo_metrics = METRICS

    def from_logs(self, logs: list[dict[str, Any]], options: Mapping[str, Any],
                  measured: Mapping[str, Any] | None = None,
                  server: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        hook = self.hook("at_logs")
        return hook(logs, options, server) if hook is not None else None

    def slo_value(self, part: Mapping[str, Any], metric: str, name: str | None) -> tuple[float | None, str]:
        if not part:
            return None, ("no request said which replica served it: give --capture-header NAME (a response header "
                          "naming the replica), or --host a,b")
        value = part.get(metric)
        if value is not None:
            return float(value), ""
        if metric != "cache_hits_of_achievable":
            return None, "no session had two turns"
        if part.get("cache_hits_unknown"):
            return None, f"the prefix-cache hits are {part['cache_hits_unknown']}"
        return None, "no turn could hit the prefix cache (sessions of one turn)"

    def lines(self, part: Mapping[str, Any], options: Mapping[str, Any]) -> list[str]:
        return [describe(part)]

    def section(self, part: Mapping[str, Any]) -> dict[str, Any] | None:
        rows = [[name, row.get("requests", 0), row.get("failed", 0), row.get(INPUT_TOKENS, 0),
                 "not known" if row.get("cached_tokens") is None else row["cached_tokens"]]
                for name, row in (part.get("replicas") or {}).items()]
        return {"id": "routing", "title": "Routing", "head": HEAD, "rows": rows, "table_id": "routing-replicas"}


FEATURE = Routing()
