"""The routing verdict's arithmetic (``metrics/fleet/routing.py``), on request records as the logs hold them: each replica's
share, each session's stickiness, and the prefix-cache hits a session made achievable against those its own next
turn achieved (the real router and fleets: tests/test_router.py, test_real_vllm_fleet.py)."""

from __future__ import annotations

from vllm_load.metrics.fleet.routing import BLOCK, routing


def _turn(session: str, start: float, replica: str, input_tokens: int, output_tokens: int, cached: int | None,
          ok: bool = True) -> dict:
    return {"session": session, "start": start, "target": replica, "ok": ok, "input_tokens": input_tokens,
            "output_tokens": output_tokens, "cached_tokens": cached}


def test_each_turn_is_judged_on_its_own_hits_against_what_its_session_made_achievable():
    records = [
        _turn("kept", 0.0, "a", 100, 20, 0), _turn("kept", 1.0, "a", 200, 20, 112),  # the second turn hit 112
        _turn("moved", 0.5, "b", 100, 20, 48), _turn("moved", 1.5, "a", 200, 20, 0),  # its history was on b
        _turn("alone", 0.7, "b", 64, 8, 16),  # one turn: nothing achievable, its own hit counts nowhere
    ]
    r = routing(records)
    assert r.replicas["a"].requests == 3 and r.replicas["b"].requests == 2
    assert r.sessions == 2 and r.sticky_sessions == 1 and r.session_stickiness == 0.5
    # each next turn could hit the last turn's prompt and answer, in whole blocks, its last prompt token computed
    assert r.cache_hits_achievable == 2 * (120 // BLOCK * BLOCK)
    assert r.cache_hits_achieved == 112 + 0  # the turns' own hits: not the earlier turns' (48 on b)
    assert r.cache_hits_of_achievable == 112 / 224
    assert r.replica_imbalance == 3 / 2.5


def test_a_failed_turn_makes_nothing_achievable_and_warm_ups_are_left_out():
    records = [_turn("s", 0.0, "a", 100, 20, 0), _turn("s", 1.0, "a", 200, 20, 0, ok=False),
               _turn("s", 2.0, "a", 300, 20, 96), {**_turn("w", 0.0, "b", 100, 20, 0), "warmup": True}]
    r = routing(records)
    assert set(r.replicas) == {"a"} and r.replicas["a"].requests == 3
    assert r.cache_hits_achievable == 0 and r.cache_hits_achieved == 0 and r.cache_hits_of_achievable is None


def test_hits_the_answers_do_not_carry_are_the_replicas_counters_or_not_known_never_zero():
    """vLLM sends a request's cached tokens only with --enable-prompt-tokens-details: through a router without it,
    the verdict printed "0 of 38400 achievable tokens (0%)" while the replicas' counters rose by 38,400."""
    from vllm_load.features.routing import describe as routing_line
    from vllm_load.metrics.fleet.routing import NO_CACHED_TOKENS
    from vllm_load.metrics.judge.slo import evaluate, parse_slo_option

    records = [_turn("s", 0.0, "a", 100, 20, None), _turn("s", 1.0, "a", 200, 20, None)]
    unknown = routing(records)
    assert unknown.cache_hits_achievable == 112 and unknown.cache_hits_achieved is None
    assert unknown.cache_hits_of_achievable is None and unknown.cache_hits_unknown == NO_CACHED_TOKENS
    assert unknown.replicas["a"].cached_tokens is None
    line = routing_line(unknown)
    assert "(0%)" not in line and "of 112 achievable tokens not known: the answers carry no cached tokens" in line
    check, = evaluate(parse_slo_option(["cache_hits_of_achievable>=0.9"]), {"features": {"routing": dict(unknown)}})
    assert not check.passed and "not known: the answers carry no cached tokens" in check.detail, check
    counted = routing(records, server_hits=112.0)  # the fleet's own counters over the run (its sidecars)
    assert counted.cache_hits_achieved == 112 and counted.cache_hits_of_achievable == 1.0
    assert "prefix-cache hits 112 of 112 achievable tokens (100%, from the replicas' own" in routing_line(counted)
    told = routing([_turn("s", 0.0, "a", 100, 20, 0), _turn("s", 1.0, "a", 200, 20, 0)], server_hits=500.0)
    assert told.cache_hits_achieved == 0 and told.cache_hits_of_achievable == 0.0  # the answers' own zeros stand


def test_a_two_replica_fleet_behind_a_router_is_two_replicas_when_requests_fail():
    """A failed request has no span: its replica fell back to the router's URL, a third name ("3 replicas
    (http://127.0.0.1:14812 157, r1 48, r2 8; imbalance 2.21)" for a 2-replica fleet)."""
    from vllm_load.features.routing import describe as routing_line
    from vllm_load.metrics.fleet.routing import Replicas

    router = "http://127.0.0.1:14812"
    records = ([{"start": i, "ok": True, "target": router, "replica": "r1"} for i in range(48)]
               + [{"start": i, "ok": True, "target": router, "replica": "r2"} for i in range(8)]
               + [{"start": i, "ok": False, "target": router} for i in range(157)])
    found = routing(records)
    assert sorted(found.replicas) == ["r1", "r2"] and found.unattributed == 157
    assert found.replica_imbalance == 48 / 28
    assert "2 replicas (r1 48, r2 8" in routing_line(found) and "157 failed requests named no replica" in \
        routing_line(found)
    # --host a,b without a router: a failed request is its target's, as it was
    direct = [{"start": 0, "ok": False, "target": "http://a"}, {"start": 1, "ok": True, "target": "http://b"}]
    name = Replicas(direct, None)
    assert [name(r) for r in direct] == ["http://a", "http://b"] and routing(direct).unattributed == 0


def test_a_replica_named_by_its_spans_keeps_its_name_for_its_failed_requests():
    """--host a,b with each replica's spans (OTEL_SERVICE_NAME r1, r2): a target whose answers carry one name is that
    replica, so its failed requests (no span) are r2's too, not a third name "http://b"; a router's target whose
    answers carry two names leaves its failed ones unattributed."""
    from vllm_load.metrics.fleet.routing import Replicas

    direct = ([{"start": i, "ok": True, "target": "http://a", "replica": "r1"} for i in range(5)]
              + [{"start": i, "ok": True, "target": "http://b", "replica": "r2"} for i in range(3)]
              + [{"start": 9 + i, "ok": False, "target": "http://b"} for i in range(4)])
    found = routing(direct)
    assert {k: (v["requests"], v["failed"]) for k, v in found.replicas.items()} == {"r1": (5, 0), "r2": (7, 4)}
    assert found.unattributed == 0
    routed = [*direct[:8], {"start": 1, "ok": True, "target": "http://b", "replica": "r1"}, direct[-1]]
    assert Replicas(routed, None)(direct[-1]) is None  # http://b served as r2 and r1: a router, not one replica
