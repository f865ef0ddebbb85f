"""Bad input stops a run before it starts with one line that names the fix and exit 2 (real Locust processes);
a run directory that fills up mid-run still gives the verdict, in one error line and exit code 6."""

import contextlib
import resource
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT, Proc, run_in_process

CHAT, SWEEP = str(ROOT / "locustfiles/chat.py"), str(ROOT / "locustfiles/sweep.py")
MIXED = str(ROOT / "locustfiles/mixed.py")
ROOT_LF = str(ROOT / "locustfiles") + "/"


@pytest.fixture(scope="module")
def emulator():
    emu = Proc(["-m", "server.emulator", "--port", "0", "--ttft", "0.01", "--itl", "0.002"])
    yield emu
    emu.stop()


def _a_file(tmp: Path) -> str:
    (tmp / "a-file").write_text("x")
    return str(tmp / "a-file")


#: (locustfile, arguments, what the one line says); "{host}" is the test emulator, "{tmp}" the test's folder
CASES = [
    (CHAT, ["--request-rate", "nan"], "--request-rate nan is not a finite number"),
    (CHAT, ["--burstiness", "nan"], "--burstiness nan is not a finite number"),
    (CHAT, ["--request-timeout", "0"], "--request-timeout must be > 0"),
    (CHAT, ["--drain-timeout", "-1"], "--drain-timeout '-1' is not a duration"),
    (CHAT, ["--metrics-port", "70000"], "--metrics-port 70000 is no TCP port"),
    (CHAT, ["--host", "ftp://127.0.0.1:21"], "the ftp:// scheme is not served; use http:// or https://"),
    (CHAT, ["--host", "127.0.0.1:8000"], "has no scheme: write --host http://127.0.0.1:8000"),
    (CHAT, ["--host", "http://127.0.0.1:8000,,http://127.0.0.1:8001"], "has an empty entry: separate the targets'"),
    (CHAT, ["--host", "http://127.0.0.1:8000,127.0.0.1:8001"], "has no scheme: write --host http://127.0.0.1:8001"),
    (CHAT, ["--tokenizer", "builtin:nope"], "the built-ins are builtin:mistral-7b-v0.1 and builtin:mistral-tekken"),
    (CHAT, ["-u", "0"], "-u 0 starts no user"),
    (CHAT, ["--warmup", "30s"], "--warmup 30s is not shorter than the run (-t) (5 s)"),
    (CHAT, ["--sweep", "4,8"], "--sweep is read by locustfiles/sweep.py only"),
    (CHAT, ["--turns", "5"], "--turns is read by locustfiles/multiturn.py only"),
    (SWEEP, ["--sweep", "4,abc,-2"], "must list positive levels"),
    (CHAT, ["--slo", "ttft.p99<=1s", "--slo", "ttft.p99<=1s"], "gives ttft.p99 twice"),
    (CHAT, ["--slo", "ttft.p99<=1s", "--slo", "ttft.p99<=2s"], "gives ttft.p99 with two thresholds"),
    (CHAT, ["--slo", "ttft.p99<=1s,ttft.p99>=2s"], "cannot both hold"),
    (CHAT, ["--run-dir", "{file}"], "is a file, not a directory"),
    (CHAT, ["--run-dir", "/proc/vllm-load/run"], "cannot be written"),
    (CHAT, ["--num-requests", "-3"], "--num-requests must be >= 0"),
    (CHAT, ["--emulator-reasoning-tokens", "lots"], "--emulator-reasoning-tokens 'lots' is not a length"),
    (CHAT, ["--emulator-spec-tokens", "2", "--emulator-spec-acceptance", "1.5"], "--emulator-spec-acceptance within 0..1"),
    (CHAT, ["--emulator-spec-tokens", "2", "--emulator-profile", "cpu-tiny"], "drop --emulator-profile"),
    (CHAT, ["--otlp-endpoint", "collector:4318"], "--otlp-endpoint 'collector:4318' is not an http(s) URL"),
    (CHAT, ["--router-metrics", "router:29000", "--fault", "1s: exec: true"], "--router-metrics 'router:29000' is not an"),
    (CHAT, ["--router-metrics", "http://127.0.0.1:29000/metrics"], "give --fault or --fault-plan"),
    (MIXED, ["--batch-after", "soon"], "--batch-after 'soon' is not a duration"),
    (MIXED, ["--batch-input-tokens", "0"], "--batch-input-tokens '0' is not a length"),
    (CHAT, ["--batch-after", "5s"], "--batch-after is read by locustfiles/mixed.py only"),
    (CHAT, ["--metric-percentiles", "50,abc"], "--metric-percentiles '50,abc' must list percentiles between 0 and 100"),
    (CHAT, ["--metric-percentiles", "50,100"], "must list percentiles between 0 and 100"),
    (CHAT, ["--ramp-up-strategy", "exponential", "--ramp-up-end-rps", "10"], "and --ramp-up-start-rps > 0"),
    (CHAT, ["--ramp-up-strategy", "linear", "--ramp-up-end-rps", "10", "--request-rate", "5"], "drop --request-rate"),
    (CHAT, ["--ramp-up-strategy", "linear", "--ramp-up-end-rps", "10", "--ramp-up-end-users", "8"], "drop one pair"),
    (CHAT, ["--ramp-up-strategy", "exponential", "--ramp-up-end-users", "8"], "--ramp-up-start-users >= 1"),
    (CHAT, ["--dcgm-selector", "{gpu=\"0\"}"], "give --prometheus-url"),
    (CHAT, ["--prometheus-url", "http://127.0.0.1:9", "--dcgm-selector", "gpu=0"], "is not a label selector"),
    (ROOT_LF + "embeddings.py", ["--batch-size", "0"], "--batch-size must be >= 1"),
    (CHAT, ["--images-per-request", "1", "--image-size", "512by512"], "--image-size '512by512' is not WxH"),
    (CHAT, ["--batch-size", "4"], "--batch-size is read by locustfiles/embeddings.py or locustfiles/rerank.py only"),
    (CHAT, ["--rate-schedule", "{file}"], "its first line must be the header at,rate[,between,burstiness]"),
    (CHAT, ["--rate-schedule", "/nonexistent/day.csv"], "--rate-schedule /nonexistent/day.csv: cannot be read (No such file"),
    # unbounded inputs read 2-3 GB in 3-9 s; a \xff line, a 3,000-deep schema, a 200 KB CSV field were tracebacks
    (CHAT, ["--rate-schedule", "/dev/zero"], "--rate-schedule /dev/zero: line 1 is longer than 64 KB"),
    (CHAT, ["--fault-plan", "/dev/zero"], "--fault-plan /dev/zero: line 1 is longer than 64 KB"),
    (CHAT, ["--fault-plan", "{bytes:ff0a}"], "line 1 is not UTF-8 text (byte 0xff)"),
    (CHAT, ["--rate-schedule", "{bytes:61742c726174650a}" + "{csv_field}"], "line 2 is longer than 64 KB"),
    (CHAT, ["--response-format", "json_schema:/dev/zero"], "schema /dev/zero: line 1 is longer than 16 MiB"),
    (CHAT, ["--response-format", "json_schema:{deep}"], "JSON nested over 200 levels deep"),
    (CHAT, ["--response-format", "json_schema:{five}"], "a JSON schema is an object, not int"),
    # a pattern that nests quantifiers froze the loop on one answer of 34 a's and a '!': -t 5s never ended
    (CHAT, ["--response-format", "json_schema:{nested}"], "nests quantifiers, which can take exponential time"),
    (CHAT, ["--fault", "1s: exec: " + "x" * 70000], "at most 64 KB a line"),
    # the results store and its gates (vllm_load/features/history.py)
    (CHAT, ["--baseline", "lst 3"], "--baseline 'lst 3': write 'last N'"),
    (CHAT, ["--label", "commit"], "--label 'commit': write KEY=VALUE"),
    (CHAT, ["--results-db", "postgresql://ci:hunter2@db.example/history"], "a password in the URL would be logged"),
    (CHAT, ["--slo", "ttft.p99<=baseline*1.1ms"], "a factor takes no unit"),
]


def _made(tmp_path, arg: str) -> str:
    """An argument with its file made: {file}, {bytes:HEX}, {csv_field} (a 200 KB field), {deep}, {five}."""
    arg = arg.replace("{file}", _a_file(tmp_path))
    made = {"{deep}": '{"properties": ' * 3000 + "{}" + "}" * 3000, "{five}": "5",
            "{nested}": '{"type": "object", "properties": {"a": {"type": "string", "pattern": "^(\\\\w+\\\\s?)*$"}}}'}
    for mark, text in made.items():
        if mark in arg:
            (tmp_path / mark.strip("{}")).write_text(text)
            arg = arg.replace(mark, str(tmp_path / mark.strip("{}")))
    if arg.startswith("{bytes:"):
        head, _, rest = arg.partition("}")
        data = bytes.fromhex(head[len("{bytes:"):]) + (b"0," + b"9" * 200_000 + b"\n" if rest == "{csv_field}" else b"")
        (tmp_path / "made.bin").write_bytes(data)
        arg = str(tmp_path / "made.bin")
    return arg


@pytest.mark.parametrize("locustfile, args, says", CASES, ids=[" ".join(c[1])[:40] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(tmp_path, emulator, locustfile, args, says):
    args = [_made(tmp_path, a) for a in args]
    host = [] if "--host" in args else ["--host", emulator.url]
    r = run_in_process(["-f", locustfile, "--headless", "-t", "5s", *host, *args], cwd=tmp_path, timeout=60)
    errors = [ln for ln in r.stderr.splitlines() if "error" in ln.lower()]
    assert r.returncode == 2, (r.returncode, r.stdout[-1500:], r.stderr[-1500:])
    assert len(errors) == 1 and says in errors[0], r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert len((r.stdout + r.stderr).encode()) < 1024, r.stdout + r.stderr


def test_openai_api_key_is_read_when_no_key_is_given(tmp_path):
    emu = Proc(["-m", "server.emulator", "--port", "0", "--ttft", "0.01", "--itl", "0.002", "--api-key", "k-env"])
    try:
        args = ["-f", CHAT, "--headless", "-u", "1", "-r", "1", "-t", "60s", "--num-requests", "2", "--host", emu.url,
                "--output-tokens", "4", "--run-dir", str(tmp_path / "run")]
        with_key = run_in_process(args, cwd=tmp_path, env_extra={"OPENAI_API_KEY": "k-env"})
        without = run_in_process(args, cwd=tmp_path, timeout=60)
    finally:
        emu.stop()
    assert with_key.returncode == 0, with_key.stdout[-2000:] + with_key.stderr[-2000:]
    assert without.returncode == 2 and "401" in without.stderr  # the emulator refuses a request without it
    assert "k-env" not in with_key.stdout + with_key.stderr + (tmp_path / "run" / "config.json").read_text()


def test_a_host_with_credentials_in_it_is_refused_without_echoing_them(tmp_path):
    """http://user:password@host: one line, exit 2, and the password in no output (the server check echoed the
    whole URL, and such a URL never reached a server: discovery could not resolve it)."""
    res = run_in_process(["-f", CHAT, "--headless", "-u", "1", "-t", "2s", "--host", "http://user:s3cr3tpw@127.0.0.1:9",
                          "--run-dir", str(tmp_path / "run")], cwd=tmp_path)
    errors = [line for line in res.stderr.splitlines() if line.startswith("vllm-load: error:")]
    assert res.returncode == 2 and len(errors) == 1, res.stderr[-2000:]
    assert "--host 'http://127.0.0.1:9' carries credentials (user:password@): give the key with --api-key" in errors[0]
    assert "s3cr3tpw" not in res.stdout + res.stderr


@contextlib.contextmanager
def tiny_filesystem(path: Path, size: str = "200k"):
    """A 200 KB tmpfs at ``path``: (path, None); where mounting is not permitted, a file-size limit of as much
    in the child: (path, preexec)."""
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True).returncode == 0
    try:
        yield None if mounted else (lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000)))
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.e2e
def test_a_run_dir_that_fills_up_gives_one_line_its_verdict_and_exit_6(tmp_path, emulator):
    import os
    import sys

    with tiny_filesystem(tmp_path / "tiny") as limit:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        r = subprocess.run([sys.executable, "-m", "locust", "-f", CHAT, "--headless", "-u", "8", "-r", "8", "-t", "60s",
                            "--host", emulator.url, "--output-tokens", "64", "--slo", "ttft.p99<=10s",
                            "--run-dir", str(tmp_path / "tiny" / "run")],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, preexec_fn=limit)
        log = (tmp_path / "tiny" / "run" / "requests.jsonl").read_bytes()
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("vllm-load: error")]
    assert r.returncode == 6, r.stdout[-2000:] + r.stderr[-2000:]
    assert len(errors) == 1 and "cannot write the request log" in errors[0], errors
    assert "Traceback" not in r.stdout + r.stderr
    assert "TTFT (ms)" in r.stdout and "SLO verdict: PASS" in r.stdout  # the table and the verdict
    assert "is incomplete (exit code 6)" in r.stdout
    assert log.endswith(b"\n")  # no torn line: a failed write is cut back to the last whole one
    assert "--run-time limit reached" not in r.stderr  # stopped by the failure, not after 60 s


def test_the_web_forms_start_refuses_mixed_pys_bad_values_with_the_command_lines_line():
    """The form's values are checked as the command line's are (``web_gate.screen_swarm`` runs the same checks on
    a copy of the options): a locustfile's own options too, by its classes' ``check_options``."""
    import argparse

    from locust.argument_parser import get_parser

    from vllm_load.locustfiles.mixed import Batch, Interactive
    from vllm_load.plugin.prepare import validate
    from vllm_load.plugin.webui import web_gate

    opts = get_parser().parse_args(["-f", MIXED])
    env = argparse.Namespace(host="http://127.0.0.1:8000", shape_class=None, user_classes=[Interactive, Batch])
    shown = {"batch_after", "batch_input_tokens", "protect", "baseline"}

    def screen(form: dict) -> str | None:
        return web_gate.screen_swarm(form, shown, opts, env, validate.check_options)

    assert screen({"batch_after": ["soon"]}) == ("--batch-after 'soon' is not a duration: write e.g. 30s, 15m, 1h or "
                                                 "a number of seconds")
    assert screen({"batch_input_tokens": ["0"]}).startswith("--batch-input-tokens '0' is not a length")
    assert screen({"batch_after": ["5s"], "protect": ["interactive"]}) is None
    assert screen({"baseline": ["lst 3"]}).startswith("--baseline 'lst 3': write 'last N'")  # a feature's own check
