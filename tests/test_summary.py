"""The run summary: one frozen value, built once and completed once, read as a mapping, written and read back
with its format."""

import dataclasses
import json

import pytest

from vllm_load.client.record import RequestRecord
from vllm_load.metrics.stats import LLMStats
from vllm_load.metrics.summary import FORMAT, RunSummary, json_default


def _stats() -> LLMStats:
    stats = LLMStats()
    for i in range(10):
        stats.add(RequestRecord(api="chat", start=1000.0 + i, e2e=0.5, ok=i != 9, ttft=0.1, chunk_offsets=[0.1, 0.2],
                                chunk_tokens=[1, 1], output_tokens=2, input_tokens=16, input_tokens_asked=16,
                                tokens_from_usage=True, name="turn 1" if i % 2 else "turn 2",
                                error=None if i != 9 else "HTTP 500: boom"))
    return stats


def test_a_summary_cannot_be_changed_in_place_only_replaced():
    s = _stats().summary(duration=10.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.requests = 0  # type: ignore[misc]
    with pytest.raises(TypeError):
        s["requests"] = 0  # type: ignore[index]
    done = s.replace(workers=["w1"])
    assert done["workers"] == ["w1"] and "workers" not in s and done["requests"] == s["requests"] == 10


def test_it_reads_as_the_mapping_of_the_fields_it_has():
    s = _stats().summary(duration=10.0)
    assert s["succeeded"] == 9 and s.get("energy") is None and "energy" not in s and "media_items" not in s
    with pytest.raises(KeyError):
        s["energy"]  # noqa: B018
    assert set(s["names"]) == {"turn 1", "turn 2"} and s["names"]["turn 1"]["requests"] == 5
    assert dict(s) == {k: s[k] for k in s} and len(s) == len(list(s))
    # by attribute, an absent field is None; it stays absent through replace and the JSON
    assert s.succeeded == 9 and s.energy is None and s.media_items is None and s.metrics["ttft"].count == 9
    done = s.replace(workers=["w1"])
    assert done.workers == ["w1"] and "energy" not in done and "energy" not in done.to_json()
    assert RunSummary.of(s) is s and RunSummary.of(s.to_json()).requests == 10


def test_json_round_trip_keeps_every_field_and_the_groups():
    s = _stats().summary(duration=10.0).replace(workers=["w1"], clock={"w1": {"offset_ms": 0.1}})
    data = json.loads(json.dumps({"summary": s}, default=json_default))["summary"]
    assert data["format"] == FORMAT and "format" not in data["names"]["turn 1"]
    back = RunSummary.from_json(data)
    assert back == s and isinstance(back["names"]["turn 2"], RunSummary)
    assert back.to_json() == s.to_json()


def test_an_older_file_is_upgraded_and_a_newer_ones_unknown_keys_are_kept():
    old = RunSummary.from_json({"requests": 2, "duration_s": 2.0, "good_requests": 1, "goodput": 0.5,
                                "metrics": {"itl": {"count": 2}, "itl_chunk": {"count": 1}}})  # format 1
    assert old["good_request_fraction"] == 0.5 and old["goodput"] == 0.5 and set(old["metrics"]) == {"itl_token", "itl"}
    newer = RunSummary.from_json({"format": FORMAT + 1, "requests": 3, "a_later_field": {"x": 1}})
    assert newer["requests"] == 3 and newer["a_later_field"] == {"x": 1}
    assert newer.to_json()["a_later_field"] == {"x": 1}


def test_an_unknown_field_is_refused_where_the_code_builds_one():
    with pytest.raises(TypeError):
        RunSummary(requestz=1)  # type: ignore[call-arg]


def test_the_nested_parts_are_read_by_attribute_and_written_as_before():
    """Each part given to a summary (built in the run, or read back from its JSON) reads by attribute, nested parts
    included (a timing tail, a replica's row, an outage), an absent key as its default; the JSON is the same
    objects, key for key."""
    import orjson

    from vllm_load.metrics.summary_parts import ClientVerdict, MetricSummary, OutageWindow, Tail, Timing

    given = {
        "requests": 4,
        "client": {"saturated": True, "reasons": ["w1: lag"], "cause": "client"},
        "timing": {"requests": 4, "parts": {"server_queue": {"count": 4, "mean": 0.01, "p99": 0.02, "max": 0.03}},
                   "tails": {"ttft": {"p99": {"value": 0.5, "requests": 1, "split": {"server_queue": 0.02}}}},
                   "by_replica": {"a": {"requests": 2, "tails": {"ttft": {"p99": {"value": 0.4, "requests": 1,
                                                                                   "split": {}}}}}},
                   "spans": {"spans": 5, "joined": 4, "unmatched": 1, "requests_without": 0}},
        "outages": [{"start": 1.0, "end": 3.5, "outage": True, "text": "down"}],
        "saturation": None,
    }
    for s in (RunSummary(**given), RunSummary.from_json(json.loads(json.dumps(RunSummary(**given).to_json())))):
        assert isinstance(s.client, ClientVerdict) and s.client.saturated and s.client.reasons == ["w1: lag"]
        assert s.client.notes == () and s.client.advice == "" and s.client.read_lag_max == 0.0  # absent: default
        assert isinstance(s.timing, Timing) and isinstance(s.timing.parts["server_queue"], MetricSummary)
        assert s.timing.parts["server_queue"].at("p99") == 0.02 and s.timing.parts["server_queue"].at("p90") is None
        assert isinstance(s.timing.tail("ttft"), Tail) and s.timing.tail("ttft").value == 0.5
        assert s.timing.groups("replica")["a"].tail("ttft").value == 0.4 and s.timing.groups("name") == {}
        assert s.timing.spans.unmatched == 1
        assert isinstance(s.outages[0], OutageWindow) and s.outages[0].outage and s.outages[0].seconds == 0.0
        assert s.saturation is None and s.energy is None  # given as None, and absent
        assert s.to_json() == {"format": FORMAT, **given}  # the same objects, written as they were given
        assert orjson.loads(orjson.dumps(s.to_json())) == json.loads(json.dumps(s.to_json()))
    with pytest.raises(AttributeError):  # an absent key's default is shared: no reader may change it
        RunSummary(client={}).client.reasons.append("x")  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        Timing().parts["x"] = 1  # type: ignore[index]
