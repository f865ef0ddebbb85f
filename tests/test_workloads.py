"""What a run can send: request options (headers, extra body, temperature, several models, switches for
strict servers), the tokenizer vLLM loaded, warm-up exclusion, reproducible runs."""

from __future__ import annotations

import itertools
import re
import json

import pytest

from tests.helpers import ROOT, run_in_process
from tests.test_e2e import load_run

CHAT = str(ROOT / "locustfiles" / "chat.py")


def _sent(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_headers_extra_body_temperature_and_models_reach_the_server(emulator_factory, tmp_path):
    sent = tmp_path / "sent.jsonl"
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002", "--request-log", str(sent),
                           "--served-model-name", "alias-a", "--lora-modules", "lora-b")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", CHAT, "--headless", "-u", "2", "-r", "2", "-t", "3s", "--host", emu.url,
                          "--output-tokens", "8", "--header", "X-Tenant: team-a", "--header", "X-Api-Token: sekrit-value",
                          "--extra-body", '{"top_k": 5, "repetition_penalty": 1.1}', "--temperature", "0.5",
                          "--model", "alias-a,lora-b", "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    # no --tokenizer: the model vLLM loaded (/v1/models root), not the served alias, and it says so
    assert "tokenizer emulator/mistral-7b-v0.1 (from the server's /v1/models root)" in res.stdout
    reqs = _sent(sent)
    assert reqs and all(r["body"]["top_k"] == 5 and r["body"]["repetition_penalty"] == 1.1
                        and r["body"]["temperature"] == 0.5 for r in reqs)
    assert all(r["headers"]["X-Tenant"] == "team-a" and r["headers"]["X-Api-Token"] == "***" for r in reqs)
    models = [r["body"]["model"] for r in reqs]
    assert set(models) == {"alias-a", "lora-b"} and abs(models.count("alias-a") - models.count("lora-b")) <= 4
    stats, logs = load_run(run_dir)
    assert set(stats["summary"]["names"]) == {"alias-a", "lora-b"}  # grouped per model
    assert all(r["input_tokens"] == r["input_tokens_asked"] for r in logs)
    # the credential never reaches a file of the run
    for f in run_dir.rglob("*"):
        assert f.is_dir() or "sekrit-value" not in f.read_text(errors="replace"), f.name
    assert "X-Api-Token: ***" in (run_dir / "config.json").read_text()


def test_a_server_that_refuses_min_tokens_and_continuous_usage_works_with_the_switches(emulator_factory, tmp_path):
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002", "--reject", "min_tokens,continuous_usage_stats")
    # both runs end by what they are about, not by a time (2 s on a busy host once held fewer than 20 refusals)
    refused = run_in_process(["-f", CHAT, "--headless", "-u", "1", "-t", "60s", "--host", emu.url, "--output-tokens",
                              "8", "--run-dir", str(tmp_path / "a")], cwd=tmp_path)
    # the same refusal 20 times with nothing taken: stopped at once, the server's words and the switches to give
    assert refused.returncode == 2, refused.stdout[-2000:]
    assert ("the server refused the first 20 requests with HTTP 400 (Unrecognized request argument supplied: "
            "min_tokens): the server does not take a field vLLM takes: give --no-ignore-eos") in refused.stdout
    ok = run_in_process(["-f", CHAT, "--headless", "-u", "1", "-t", "60s", "--num-requests", "6", "--host", emu.url,
                         "--output-tokens", "8", "--no-ignore-eos", "--no-continuous-usage",
                         "--run-dir", str(tmp_path / "b")], cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    _, logs = load_run(tmp_path / "b")
    assert len(logs) == 6 and all(r["ok"] and not r["continuous_usage"] and r["tokens_from_usage"] for r in logs)
    assert all(r["output_tokens"] == 8 and sum(r["chunk_tokens"]) == 8 for r in logs)  # one token per text chunk


def test_warmup_requests_are_logged_and_left_out_of_every_number(emulator_factory, tmp_path):
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", CHAT, "--headless", "-u", "2", "-r", "2", "-t", "5s", "--host", emu.url,
                          "--output-tokens", "8", "--warmup", "3s", "--slo", "ttft.p99<=2s", "--run-dir", str(run_dir)],
                         cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    stats, logs = load_run(run_dir)
    s = stats["summary"]
    warm = [r for r in logs if r["warmup"]]
    measured = [r for r in logs if not r["warmup"]]
    assert warm and measured
    assert s["warmup_excluded"] == len(warm) and s["requests"] == len(measured)
    assert s["metrics"]["ttft"]["count"] == len(measured)
    # warm-up: the run's first 3 s; the measured requests all started after it
    started = json.loads((run_dir / "config.json").read_text())["started"]
    assert max(r["start"] for r in warm) < started + 3.0 <= min(r["start"] for r in measured)
    # the measured window is the run minus its warm-up: from the warm-up's end (or the first measured request) to the
    # run's end (5 s of load minus 3 s, less whatever a busy host took to start: 1.24 s once)
    end = stats["end"]
    assert s["duration_s"] == pytest.approx(end - max(started + 3.0, min(r["start"] for r in measured)), abs=1e-3)
    assert f"warm-up: {len(warm)} requests" in res.stdout
    assert "warm-up (excluded)" in (run_dir / "report.html").read_text()


def _run(emu, tmp_path, tag, *extra):
    run_dir = tmp_path / tag
    # ended by its count: the same 24 requests each time (3 s of 12 req/s sent 16 on a busy host); at 48 req/s,
    # 0.5 s a run (the arrivals compared are the schedule's, whatever the rate)
    res = run_in_process(["-f", CHAT, "--headless", "-u", "1", "-r", "1", "-t", "60s", "--num-requests", "24",
                          "--host", emu.url, "--input-tokens", "20-300", "--output-tokens", "2-12", "--request-rate",
                          "48", "--run-dir", str(run_dir), *extra], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    _, logs = load_run(run_dir)
    logs.sort(key=lambda r: r["start"])
    return logs, json.loads((run_dir / "config.json").read_text())


@pytest.mark.parametrize("salt", [None, "fixed-salt"])
def test_seed_repeats_lengths_and_arrivals_and_salt_repeats_content(emulator_factory, tmp_path, salt):
    emu = emulator_factory("--ttft", "0.005", "--itl", "0.001", "--request-log", str(tmp_path / "all.jsonl"))
    extra = ["--seed", "7"] + (["--salt", salt] if salt else [])
    a, cfg_a = _run(emu, tmp_path, "a", *extra)
    b, cfg_b = _run(emu, tmp_path, "b", *extra)
    n = min(len(a), len(b))
    assert n >= 20
    lens = lambda logs: [(r["input_tokens_asked"], r["output_tokens_asked"]) for r in logs[:n]]  # noqa: E731
    assert lens(a) == lens(b) and len(set(lens(a))) > n // 2
    gaps = lambda logs: [y["start"] - x["start"] for x, y in zip(logs, logs[1:n])]  # noqa: E731
    assert gaps(a) == pytest.approx(gaps(b), abs=1e-3)  # the same arrival times, from the run's start
    assert cfg_a["plan"]["seed"] == 7 and (cfg_a["plan"]["salt"] == cfg_b["plan"]["salt"]) == bool(salt)
    bodies = _sent(tmp_path / "all.jsonl")

    def content(rec: dict) -> str:
        """What the server received for this request: found by the trace id its traceparent carried (by position
        in the server's log, a request of run a still in flight at its end was once taken for b's first)."""
        return next(x for x in bodies if rec["trace_id"] in x["headers"].get("Traceparent", ""))["body"][
            "messages"][0]["content"]

    assert (content(a[0]) == content(b[0])) == bool(salt)  # the first request of each run
    # no seed: other lengths
    c, _ = _run(emu, tmp_path, "c")
    assert lens(c[:n]) != lens(a)[: len(c)]


def test_tls_targets_are_verified_unless_told_otherwise(emulator_factory, tmp_path):
    import subprocess

    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002", "--ssl-keyfile", str(key), "--ssl-certfile", str(cert))
    assert emu.url.startswith("https://")
    args = ["-f", CHAT, "--headless", "-u", "1", "-t", "2s", "--host", emu.url, "--output-tokens", "4"]
    refused = run_in_process([*args, "--run-dir", str(tmp_path / "a")], cwd=tmp_path)
    assert refused.returncode == 2
    errors = [line for line in refused.stderr.splitlines() if line.startswith("vllm-load: error:")]
    assert len(errors) == 1 and "pass --ca-bundle FILE with its CA, or --insecure" in errors[0]
    for tag, extra in (("b", ["--ca-bundle", str(cert)]), ("c", ["--insecure"])):
        ok = run_in_process([*args, *extra, "--run-dir", str(tmp_path / tag)], cwd=tmp_path)
        assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
        _, logs = load_run(tmp_path / tag)
        assert logs and all(r["ok"] and r["input_tokens"] == r["input_tokens_asked"] for r in logs)
        # TLS hides the kernel's stamps: the console says the clock timed the chunks, not the native reader
        assert "chunks timed by the clock as the client's loop read each line (https://" in ok.stdout
        assert "kernel stamps)" not in ok.stdout


def test_a_weighted_model_mix_sends_each_model_its_share(emulator_factory, tmp_path):
    """--model base:0.6,lora-a:0.3,lora-b:0.1 (``--model a,b`` sent equal turns): each model gets its share of the
    requests the server received, exactly to within a request a process, interleaved, and the metrics per model."""
    sent = tmp_path / "sent.jsonl"
    emu = emulator_factory("--ttft", "0.005", "--itl", "0.002", "--request-log", str(sent),
                           "--served-model-name", "base", "--lora-modules", "lora-a", "lora-b")
    run_dir = tmp_path / "run"
    res = run_in_process(["-f", CHAT, "--headless", "-u", "2", "-r", "2", "-t", "60s", "--num-requests", "100",
                          "--host", emu.url, "--output-tokens", "4", "--model", "base:0.6,lora-a:0.3,lora-b:0.1",
                          "--run-dir", str(run_dir)], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    models = [r["body"]["model"] for r in _sent(sent)]
    counts = {m: models.count(m) for m in ("base", "lora-a", "lora-b")}
    assert sum(counts.values()) == len(models) >= 100
    assert abs(counts["base"] - 0.6 * len(models)) <= 1 and abs(counts["lora-a"] - 0.3 * len(models)) <= 1
    assert abs(counts["lora-b"] - 0.1 * len(models)) <= 1, counts
    # the choice is interleaved: no burst of one model (two users' requests reach the server in either order)
    from vllm_load.workload.model_mix import ModelMix

    mix = ModelMix(("base", "lora-a", "lora-b"), (0.6, 0.3, 0.1))
    dealt = [mix.next() for _ in range(30)]
    assert max(len(list(group)) for _, group in itertools.groupby(dealt)) == 2, dealt
    assert [dealt[i:i + 10].count("lora-b") for i in (0, 10, 20)] == [1, 1, 1]
    stats, _logs = load_run(run_dir)
    assert {k: v["requests"] for k, v in stats["summary"]["names"].items()} == counts  # grouped per model


@pytest.mark.parametrize("text,said", [("base:0", "a model's weight must be a number above 0"),
                                       ("base:0.5,lora", "give every model a weight or none"),
                                       ("base,base", "names a model twice")])
def test_a_bad_model_mix_is_one_line(text, said):
    from vllm_load.errors import UsageError
    from vllm_load.workload.model_mix import parse_models

    with pytest.raises(UsageError, match=said):
        parse_models(text)
    # a name's last ':' and a number is its weight; any other ':' is the name's own
    assert parse_models("llama3:8b,org/m") == (("llama3:8b", "org/m"), ())
    assert parse_models("a:3, b:1") == (("a", "b"), (0.75, 0.25))


def test_load_lora_loads_an_adapter_for_the_run_and_unloads_it_after(emulator_factory, tmp_path):
    """--load-lora NAME=PATH: the adapter loaded into the target through vLLM's dynamic route before the run's checks
    (so --model can name it), its load time said, every request sent to it, and unloaded once the run ends (the
    server's /v1/models as before). A server without the route, or a malformed value, is one line and exit 2."""
    import urllib.request

    sent = tmp_path / "sent.jsonl"
    emu = emulator_factory("--ttft", "0.005", "--itl", "0.001", "--request-log", str(sent),
                           "--allow-runtime-lora-updating")

    def served() -> list[str]:
        return [m["id"] for m in json.loads(urllib.request.urlopen(emu.url + "/v1/models").read())["data"]]

    before = served()
    res = run_in_process(["-f", CHAT, "--headless", "-u", "2", "-r", "2", "-t", "60s", "--num-requests", "12",
                          "--host", emu.url, "--output-tokens", "4", "--load-lora", "sql-lora=/adapters/sql",
                          "--model", "sql-lora", "--run-dir", str(tmp_path / "run")], cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert re.search(r"vllm-load: loaded LoRA adapter sql-lora on http://127\.0\.0\.1:\d+ in \d+\.\d\d s", res.stdout)
    assert "vllm-load: unloaded LoRA adapter sql-lora from" in res.stdout
    models = [r["body"]["model"] for r in _sent(sent)]
    assert len(models) == 12 and set(models) == {"sql-lora"}
    assert served() == before and "sql-lora" not in before  # the server left as it was

    plain = emulator_factory("--ttft", "0.005", "--itl", "0.001")
    for args, says in ((["--host", plain.url, "--load-lora", "sql-lora=/adapters/sql"],
                        "has no /v1/load_lora_adapter (HTTP 404): vLLM serves it with "
                        "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"),
                       (["--host", emu.url, "--load-lora", "sql-lora"], "--load-lora 'sql-lora': give NAME=PATH")):
        bad = run_in_process(["-f", CHAT, "--headless", "-u", "1", "-t", "2s", *args,
                              "--run-dir", str(tmp_path / "bad")], cwd=tmp_path, timeout=60)
        assert bad.returncode == 2 and says in bad.stderr, bad.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["-t", "SIGTERM", "SIGINT"])
def test_a_locust_process_unloads_its_adapters_however_its_run_ends(emulator_factory, tmp_path, ending):
    """The quitting path never called the unload: a real process left its --load-lora adapters on the server."""
    import os
    import signal
    import subprocess
    import sys
    import urllib.request

    from tests.helpers import wait_for

    emu = emulator_factory("--ttft", "0.005", "--itl", "0.002", "--allow-runtime-lora-updating")

    def served() -> list[str]:
        return [m["id"] for m in json.loads(urllib.request.urlopen(emu.url + "/v1/models").read())["data"]]

    before = served()
    proc = subprocess.Popen([sys.executable, "-m", "locust", "-f", CHAT, "--headless", "-u", "1", "-r", "1", "-t",
                             "4s" if ending == "-t" else "60s", "--host", emu.url, "--output-tokens", "4",
                             "--load-lora", "sql-lora=/adapters/sql", "--model", "sql-lora", "--allow-untrustworthy",
                             "--run-dir", str(tmp_path / "run")], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # SIGINT as in a terminal: a suite started in the background (nohup ... &) hands its
                            # children SIGINT ignored, and the run went on to its -t (62 s, over the test's budget)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_for(lambda: "sql-lora" in served(), timeout=60, what="the adapter loaded")
        if ending != "-t":
            wait_for(lambda: (tmp_path / "run" / "requests.jsonl").exists()
                     and (tmp_path / "run" / "requests.jsonl").stat().st_size, timeout=60, what="requests")
            proc.send_signal(getattr(signal, ending))
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "vllm-load: unloaded LoRA adapter sql-lora from" in out, out[-2000:] + err[-2000:]
    assert served() == before  # the server left as it was
