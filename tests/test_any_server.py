"""Any OpenAI server, measured honestly (the emulator speaking other servers' stream shapes; the real
`transformers serve` is in test_transformers_serve.py): streams that end after their finish_reason without
[DONE], usage in the last choice's chunk, no usage at all; the master's port."""

from __future__ import annotations

import json
import socket

import pytest

from tests.helpers import ROOT, free_port, run_in_process, run_locust
from vllm_load.rundir.reqlog import read_log

CHAT = str(ROOT / "locustfiles" / "chat.py")
OTHER_SERVER = ("--owned-by", "local", "--reject", "ignore_eos,min_tokens,continuous_usage_stats")


def _lines(chunks: list[dict], done: bool = False) -> list[bytes]:
    out = [b"data: " + json.dumps(c).encode() + b"\n" for c in chunks]
    return out + ([b"data: [DONE]\n"] if done else [])


def _transformers_shape(words: int, finish: str | None = "length", usage: bool = True) -> list[dict]:
    chunks = [{"id": "x", "choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
    chunks += [{"id": "x", "choices": [{"index": 0, "delta": {"content": f" w{i}"}}]} for i in range(words)]
    if finish:
        last: dict = {"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
        if usage:
            last["usage"] = {"prompt_tokens": 7, "completion_tokens": words + 1, "total_tokens": words + 8}
        chunks.append(last)
    return chunks


@pytest.mark.parametrize("parser", ["python", "native"])
def test_a_final_usage_in_the_last_choice_is_the_total_and_no_done_is_whole(parser):
    from vllm_load.client import _rxnative
    from vllm_load.client.sse import StreamState

    def parse(lines: list[bytes]) -> StreamState:
        st = StreamState()
        if parser == "python":
            for n, line in enumerate(lines):
                st.feed(line, n * 0.01)
        else:
            parsed, taken = _rxnative.parse_sse([(line, 10**9 + n * 10**7) for n, line in enumerate(lines)], 0.0)
            assert taken == len(lines)  # the C parser took every line itself
            st.absorb(parsed)
        return st

    st = parse(_lines(_transformers_shape(5)))
    # 5 chunks of a token each (the usage says 6: one token made no text), not one chunk carrying all 6
    assert st.chunk_tokens == [1] * 5 and not st.continuous_usage and st.completion_tokens == 6
    assert st.incomplete() is None and st.finish_reason == "length"
    cut = parse(_lines(_transformers_shape(5, finish=None)))
    assert cut.incomplete() == "stream ended before a finish_reason or [DONE] after 5 tokens"
    # vLLM's continuous usage (usage in every chunk, from the first) still gives each chunk its exact tokens
    vllm = [{"id": "v", "choices": [{"index": 0, "delta": {"content": ""}}], "usage": {"prompt_tokens": 3,
                                                                                       "completion_tokens": 0}}]
    vllm += [{"id": "v", "choices": [{"index": 0, "delta": {"content": "ab"}}],
              "usage": {"prompt_tokens": 3, "completion_tokens": 2 * (i + 1)}} for i in range(3)]
    st = parse(_lines(vllm, done=True))
    assert st.continuous_usage and st.chunk_tokens == [2, 2, 2]


def test_without_usage_the_output_is_the_deltas_never_above_max_tokens():
    from vllm_load.client.sse import StreamState
    from vllm_load.client.stream import counted_output

    st = StreamState()
    for n, line in enumerate(_lines(_transformers_shape(9, finish="stop", usage=False))):
        st.feed(line, n * 0.01)
    assert counted_output(st, 16) == 9 and counted_output(st, 4) == 4
    st.finish_reason = "length"
    assert counted_output(st, 12) == 12  # it stopped for that length: max_tokens exactly


@pytest.mark.parametrize("style", ["transformers", "no-usage"])
def test_other_servers_streams_are_measured_whole(tmp_path, emulator_factory, style):
    # two tokens a delta: a client that took a delta for a token would count half
    emu = emulator_factory("--stream-style", style, *OTHER_SERVER, "--tokens-per-chunk", "2", "--ttft", "0.005",
                           "--itl", "0.002")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", CHAT, "--headless", "-u", "2", "-r", "2", "-t", "4s", "--host", emu.url,
                          "--output-tokens", "8-24", "--run-dir", str(run_dir)], tmp_path, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = read_log(run_dir / "requests.jsonl")
    assert logs and all(r["ok"] for r in logs), [r["error"] for r in logs][:3]
    for r in logs:
        asked = r["max_tokens"]  # a cap here: an OpenAI server is not asked for exact lengths
        assert r["output_tokens_asked"] is None
        if style == "transformers":  # the server's usage: what it generated
            assert r["tokens_from_usage"] and r["output_tokens"] == asked
        else:  # counted from the deltas: never above max_tokens, max_tokens where it stopped for length
            assert not r["tokens_from_usage"] and r["output_tokens"] <= asked
            if r["finish_reason"] == "length":
                assert r["output_tokens"] == asked
    out = res.stdout
    assert "ITL (per chunk; tokens per chunk unknown)" in out and "ITL (per chunk = per token)" not in out
    if style == "no-usage":
        assert "their output tokens were counted from the stream's deltas" in out


def test_openai_mode_forced_against_vllm_says_so(tmp_path, emulator_factory):
    emu = emulator_factory()
    res = run_in_process(["-f", CHAT, "--headless", "-u", "1", "-r", "1", "-t", "2s", "--host", emu.url,
                          "--server-kind", "openai", "--output-tokens", "4", "--run-dir", str(tmp_path / "run")],
                         tmp_path, timeout=120)
    assert res.returncode == 0, res.stdout[-2000:]
    assert "--server-kind openai (the server says it is vLLM" in res.stdout
    assert "the server is not vLLM" not in res.stdout


@pytest.mark.e2e
def test_a_master_port_in_use_is_one_line_and_processes_follow_their_masters_port(tmp_path, emulator_factory):
    """A process's own: the master's port settled once per process, before Locust forks the --processes workers."""
    emu = emulator_factory()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        res = run_locust(["-f", CHAT, "--headless", "--processes", "2", "-u", "2", "-t", "3s", "--host", emu.url,
                          "--master-bind-port", str(port), "--run-dir", str(tmp_path / "a")], tmp_path, timeout=60)
    errors = [x for x in res.stderr.splitlines() if x.startswith("vllm-load: error:")]
    assert res.returncode == 2 and len(errors) == 1 and f"port {port}" in errors[0], res.stderr[-2000:]
    assert "--master-bind-port" in errors[0] and "Traceback" not in res.stderr
    # only --master-bind-port: the forked workers join it (they joined 5557, and the run hung past -t)
    res = run_locust(["-f", CHAT, "--headless", "--processes", "2", "-u", "2", "-r", "2", "-t", "60s",
                      "--num-requests", "4", "--host",  # by its count: 4 s on a busy host once sent nothing
                      emu.url, "--output-tokens", "4", "--master-bind-port", str(free_port()), "--run-dir",
                      str(tmp_path / "b")], tmp_path, timeout=90)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert len(list((tmp_path / "b").glob("requests-*.jsonl"))) == 2


def test_reset_prefix_cache_before_a_run_leaves_no_hit_carried_over(tmp_path, emulator_factory):
    """The same prompts twice (--salt, --seed): the second run hits what the first cached, unless the cache is
    reset before it."""
    emu = emulator_factory("--enable-prompt-tokens-details", "--ttft", "0.005", "--itl", "0.002")
    same = ["-f", CHAT, "--headless", "-u", "1", "-r", "1", "--num-requests", "6", "--host", emu.url,
            "--input-tokens", "96", "--output-tokens", "4", "--salt", "fixed", "--seed", "3"]

    def first_cached(name, *extra):
        res = run_in_process([*same, *extra, "--run-dir", str(tmp_path / name)], tmp_path, timeout=120)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        logs = sorted(read_log(tmp_path / name / "requests.jsonl"), key=lambda r: r["start"])
        return logs[0]["cached_tokens"], res.stdout

    assert first_cached("a")[0] == 0
    assert first_cached("b")[0] > 0  # the first run's blocks, carried over
    cached, out = first_cached("c", "--reset-prefix-cache")
    assert cached == 0 and "prefix cache reset on 1 target(s) before the run" in out


def test_a_server_that_refuses_the_reset_is_said_once(emulator_factory, sidecar_factory, tmp_path):
    from vllm_load.plugin.sources.server_control import CacheReset

    emu = emulator_factory()
    other = sidecar_factory("--vllm-url", emu.url, "--out", str(tmp_path / "s.jsonl"))  # an HTTP server without it
    said: list[str] = []
    reset = CacheReset((other.url, emu.url), "", said.append)
    assert reset("step 1") == 1 and reset("step 2") == 1
    refusals = [x for x in said if "refused /reset_prefix_cache" in x]
    assert len(refusals) == 1 and "VLLM_SERVER_DEV_MODE=1" in refusals[0]  # once, not at every step
    assert said[-1] == "vllm-load: prefix cache reset on 1 target(s) before step 2"
