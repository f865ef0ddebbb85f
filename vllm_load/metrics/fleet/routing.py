"""The routing verdict: how a fleet behind a router served the run's sessions, from the request logs.

Which replica served each request comes from the fleet: a response header naming it (``--capture-header``; the
embedded emulator sends ``X-Vllm-Load-Replica``), else the replica's own span of it (``--otlp-receiver``: its
``OTEL_SERVICE_NAME``), else the target the client chose (``--host a,b``). Per replica:
its requests and tokens; per session (``self.llm.session``, ``--session-header``): whether all its turns stayed on
one replica; and the prefix-cache hits the sessions made achievable (a replayed turn's: the blocks an earlier
prompt of its load process sent ahead of it, workload/block_reuse.py; a conversation's turn: its previous turn's
prompt and answer) against those achieved (the server's ``cached_tokens`` per request; vLLM sends them only with --enable-prompt-tokens-details: without them, the replicas'
own ``vllm:prefix_cache_hits`` over the run from their sidecars, else "not known", never 0: a run through a router
printed 0 % while the replicas' counters rose by every achievable token). A router that spreads one session's
turns over replicas loses the hits the conversation's shared prefix would have had: a run can look green while one
replica serves everything, or while every turn misses its cache.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any, Iterable
from vllm_load.metric_table import INPUT_TOKENS, OUTPUT_TOKENS
from vllm_load.features.routing import ANSWERS, BLOCK, COUNTERS, NO_CACHED_TOKENS
from vllm_load.metrics.summary_parts import Routing

#: a replayed turn's tokens in blocks an earlier prompt sent (client/record.py)
REUSABLE = "reusable_tokens"


class Replicas:
    """One name per replica over a run's records, failed requests included. A target whose named requests (by header
    or span) all carry one name is that replica (``--host a,b``: each target one vLLM): its unnamed requests (failed
    before it answered: no span, no header) take that name. A target whose requests carry several names is a
    router: an unnamed request of it is unattributed (None), not a third name for a 2-replica fleet ("3 replicas
    (http://127.0.0.1:14812 157, r1 48, r2 8)")."""

    def __init__(self, records: Iterable[dict], header: str | None) -> None:
        self.header = header
        names: dict[str, set[str]] = defaultdict(set)
        for r in records:
            named = self._named(r)
            if named not in (None, r.get("target")):
                names[r.get("target") or ""].add(named)
        self.routed = {t for t, n in names.items() if len(n) > 1}  # a router's targets: several replicas each
        self.alias = {t: next(iter(n)) for t, n in names.items() if len(n) == 1}  # a target that is one replica

    def _named(self, record: dict) -> str | None:
        named = (record.get("headers") or {}).get(self.header) if self.header else None
        return named or record.get("replica")

    def __call__(self, record: dict) -> str | None:
        named = self._named(record)
        if named:
            return named
        target = record.get("target")
        if target in self.alias:
            return self.alias[target]
        return None if target in self.routed else target


def from_logs(logs: list[dict], options: Mapping[str, Any], server: Mapping[str, Any] | None) -> dict | None:
    """The routing feature's part (``features/routing.py``): the verdict over the run's logs, replicas named by
    --capture-header's first header, hits counted in the server's own block and, without the answers' cached
    tokens, by its own counters."""
    captured = options.get("capture_header") or []
    header = str(captured[0]).lower() if captured else None
    found = routing(logs, header, block=(server or {}).get("block_size"),
                    server_hits=server.get("prefix_cache_hits") if server else None)
    return dict(found) if found is not None else None


def routing(records: Iterable[dict], header: str | None = None, block: int | None = None,
            server_hits: float | None = None) -> Routing | None:
    """The verdict over the measured requests (warm-up and removed ones aside); None when no request says its
    replica. ``block``: the server's KV block (its vllm:cache_config_info, through a sidecar; None: vLLM's default).
    ``server_hits``: the fleet's own prefix-cache hits over the run (tokens), read when no answer carried its cached
    tokens."""
    replicas: dict[str, dict[str, int | None]] = defaultdict(lambda: {"requests": 0, "failed": 0, INPUT_TOKENS: 0,
                                                                      "cached_tokens": None})
    turns: dict[str, list[dict]] = defaultdict(list)
    any_span = False
    records = [r for r in records if not (r.get("warmup") or r.get("removed"))]
    name = Replicas(records, header)
    unattributed = 0
    for r in records:
        replica = name(r)
        any_span = any_span or (replica is not None and replica == r.get("replica"))
        if replica is None:
            unattributed += r.get("target") in name.routed
            continue
        row = replicas[replica]
        row["requests"] += 1
        row["failed"] += not r.get("ok")
        row[INPUT_TOKENS] += r.get(INPUT_TOKENS) or 0
        if r.get("cached_tokens") is not None:
            row["cached_tokens"] = (row["cached_tokens"] or 0) + r["cached_tokens"]
        if r.get("session"):
            turns[r["session"]].append({**r, "replica": replica})
    if not replicas:
        return None
    counts = [row["requests"] for row in replicas.values()]
    multi = {s: sorted(rs, key=lambda x: x["start"]) for s, rs in turns.items() if len(rs) > 1}
    sticky = sum(1 for rs in multi.values() if len({x["replica"] for x in rs}) == 1)
    told = any(row["cached_tokens"] is not None for row in replicas.values())
    replayed = [r for r in records if r.get(REUSABLE) is not None]
    block = block or BLOCK
    achievable, achieved = _by_blocks(replayed, block) if replayed else _by_turns(multi.values(), block)
    source, unknown = ANSWERS, ""
    if not told:
        if server_hits is not None:
            achieved, source = int(server_hits), COUNTERS
        else:
            achieved, source, unknown = None, "", NO_CACHED_TOKENS
    return Routing({
        "source": f"the {header} response header" if header else "the replicas' spans (their OTEL_SERVICE_NAME)"
        if any_span else "the client's --host targets",
        "replicas": dict(sorted(replicas.items())),
        "replica_imbalance": max(counts) / (sum(counts) / len(counts)),
        "sessions": len(multi),
        "sticky_sessions": sticky,
        "session_stickiness": sticky / len(multi) if multi else None,
        "cache_hits_achievable": achievable,
        "cache_hits_achieved": achieved,
        "cache_hits_of_achievable": min(1.0, achieved / achievable) if achievable and achieved is not None else None,
        "cache_hits_source": source,
        "cache_hits_unknown": unknown,
        "cache_block": block,
        "unattributed": unattributed,
    })


def _hittable(shared: int, input_tokens: int, block: int) -> int:
    """Of ``shared`` prompt tokens, what a prefix cache hits: whole blocks, the last prompt token always computed."""
    return min(shared, input_tokens - 1) // block * block


def _by_blocks(records: list[dict], block: int) -> tuple[int, int]:
    """Achievable and achieved hits of replayed turns, each by the blocks an earlier prompt sent ahead of it (its
    record's ``reusable_tokens``: a primed first turn's, a subagent's on its parent's prefix)."""
    achievable = achieved = 0
    for r in records:
        if r.get("ok") and r.get(INPUT_TOKENS) is not None:
            achievable += _hittable(r[REUSABLE], r[INPUT_TOKENS], block)
            achieved += r.get("cached_tokens") or 0
    return achievable, achieved


def _by_turns(sessions: Iterable[list[dict]], block: int) -> tuple[int, int]:
    """Achievable and achieved hits of conversations that send their history again: each turn repeats its last
    turn's prompt and answer, what a replica holding them could hit."""
    achievable = achieved = 0
    for rs in sessions:
        for prev, cur in zip(rs, rs[1:]):
            if not (prev.get("ok") and cur.get("ok")) or cur.get(INPUT_TOKENS) is None:
                continue
            shared = (prev.get(INPUT_TOKENS) or 0) + (prev.get(OUTPUT_TOKENS) or 0)
            achievable += _hittable(shared, cur[INPUT_TOKENS], block)
            achieved += cur.get("cached_tokens") or 0
    return achievable, achieved
