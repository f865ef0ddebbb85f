"""Secure by default (real processes on 127.0.0.1): the web UI answers only its own page and its own names, takes
only its form's fields, covers every route with --web-login; a worker receives no secret; children die with their
parent; the end of a run runs once; bad input is one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
from datetime import datetime
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from tests.helpers import ROOT, free_port, listening, run_locust, wait_for

CHAT = str(ROOT / "locustfiles" / "chat.py")
KEY, SIDECAR_TOKEN, HEADER_TOKEN = "sk-SECRET-4b1d", "side-SECRET-77aa", "hdr-SECRET-09ff"


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), **extra)
    for name in ("VLLM_LOAD_API_KEY", "OPENAI_API_KEY", "VLLM_LOAD_WEB_PASSWORD"):
        if name not in extra:
            env.pop(name, None)
    return env


def request(url: str, data: dict | list | None = None, headers: dict | None = None,
            method: str | None = None) -> tuple[int, dict, str]:
    body = None if data is None else urllib.parse.urlencode(data).encode()
    req = urllib.request.Request(url, data=body, headers=headers or {}, method=method)

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a, **k):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(req, timeout=15) as r:
            return r.status, dict(r.headers), r.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read().decode(errors="replace")


class UI:
    """A Locust web UI (chat.py against the embedded emulator) on a free port, until close()."""

    def __init__(self, tmp: Path, *extra: str, env: dict | None = None) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.out = tmp / "ui.out"
        self.proc = subprocess.Popen([sys.executable, "-m", "locust", "-f", CHAT, "--web-port", str(self.port),
                                      "--output-tokens", "4", "--run-dir", str(tmp / "run"), *extra],
                                     cwd=tmp, env=env or _env(), stdout=self.out.open("w"), stderr=subprocess.STDOUT)
        wait_for(lambda: self.proc.poll() is not None or listening(self.proc.pid, self.port), timeout=120,
                 what="the web UI to listen")
        assert self.proc.poll() is None, self.out.read_text()[-3000:]

    def state(self) -> str:
        return json.loads(request(self.base + "/stats/requests")[2])["state"]

    def close(self) -> str:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        return self.out.read_text()


def _form(**extra: str) -> dict:
    return {"user_count": "1", "spawn_rate": "1", **extra}


def test_the_ui_refuses_foreign_pages_names_fields_and_values_and_a_browser_starts_from_its_own_form(tmp_path):
    from tests.browser import Browser

    ui = UI(tmp_path)
    attacker = _AttackerPage(ui.base)
    browser = Browser(tmp_path / "chromium")
    try:
        own = {"Origin": ui.base}
        # a foreign Host (DNS rebinding), a foreign origin, a cross-site fetch: refused before Locust sees them
        assert request(ui.base + "/", headers={"Host": "evil.example"})[0] == 403
        status, _h, body = request(ui.base + "/swarm", _form(), {"Origin": "http://evil.example"})
        assert status == 403 and "may not change" in body
        assert request(ui.base + "/swarm", _form(), {"Sec-Fetch-Site": "cross-site"})[0] == 403
        assert request(ui.base + "/swarm", _form(), {"Referer": "http://evil.example/page"})[0] == 403
        # no CORS: another page cannot read an answer
        headers = request(ui.base + "/stats/requests", headers={"Origin": "http://evil.example"})[1]
        assert not any(h.lower().startswith("access-control-") for h in headers)
        # fields the form does not show, a field twice, values the command line refuses: one line each
        for form, said in ((_form(run_dir=str(tmp_path / "elsewhere")), "no field 'run_dir'"),
                           (_form(dataset="/etc/passwd"), "no field 'dataset'"),
                           (_form(html_file=str(tmp_path / "x.html")), "no field 'html_file'"),
                           (_form(mlflow_uri="http://evil.example"), "no field 'mlflow_uri'"),
                           ([*_form().items(), ("host", ui_host(ui)), ("host", "http://evil.example")],
                            "'host' was given 2 times"),
                           (_form(request_rate="nan"), "--request-rate nan is not a finite number"),
                           (_form(request_timeout="0"), "--request-timeout must be > 0")):
            status, _h, body = request(ui.base + "/swarm", form, own)
            answer = json.loads(body)
            assert status == 200 and answer["success"] is False and said in answer["message"], (form, body)
        # the same from a real browser on another origin (127.0.0.1, another port): nothing starts
        browser.goto(attacker.url, ready="document.title === 'sent'", probe=False)  # its server is up: it counts loads
        assert attacker.loaded  # the title is set once the UI answered the page's request
        port = attacker.url.rsplit(":", 1)[1].rstrip("/")
        refused = [x for x in ui.out.read_text().splitlines() if "web UI refused POST /swarm" in x]
        assert any(f"127.0.0.1:{port}" in x or "same-site" in x for x in refused), refused
        assert ui.state() == "ready" and not (tmp_path / "elsewhere").exists()
        # the UI's own form in the browser starts a run
        browser.goto(ui.base + "/", ready="document.querySelector('form button[type=submit]') !== null")
        browser.eval("document.querySelector('form button[type=submit]').click()")
        wait_for(lambda: ui.state() in ("running", "spawning"), timeout=60, what="the form's start")
        wait_for(lambda: json.loads(request(ui.base + "/stats/requests")[2])["total_rps"] > 0, timeout=60,
                 what="requests of the form's run")
    finally:
        browser.close()
        attacker.close()
        ui.close()


def ui_host(ui: UI) -> str:
    return json.loads(request(ui.base + "/swarm", _form(bogus="1"), {"Origin": ui.base})[2])["host"]


class _AttackerPage:
    """A page on another origin whose script posts a start to the UI, as a page the operator merely visits."""

    def __init__(self, ui_base: str) -> None:
        page = ("<html><body><script>"
                f"fetch('{ui_base}/swarm', {{method: 'POST', mode: 'no-cors', headers: "
                "{'Content-Type': 'application/x-www-form-urlencoded'}, body: 'user_count=5&spawn_rate=5'})"
                ".catch(() => null).finally(() => { document.title = 'sent'; });"
                "</script></body></html>").encode()
        outer = self
        self.loaded = False

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                outer.loaded = True
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *_a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def test_web_login_covers_every_route_the_plugins_too_and_the_logged_in_ui_works(tmp_path):
    ui = UI(tmp_path, "--web-login", env=_env(VLLM_LOAD_WEB_PASSWORD="open-sesame-3"))
    try:
        for path in ("/", "/stats/requests", "/vllm-load/report", "/vllm-load/live", "/vllm-load/live.json",
                     "/vllm-load/state",
                     "/metrics", "/vllm-load/llm_stats.csv", "/logs"):
            status, headers, _ = request(ui.base + path)
            assert status == 302 and headers.get("Location", "").endswith("/login"), (path, status)
        status, _h, body = request(ui.base + "/swarm", _form(), {"Origin": ui.base})
        assert status == 401 and "log in first" in body
        assert request(ui.base + "/login")[0] == 200
        # a wrong password: back to the login; the right one: a session that reaches every page
        assert request(ui.base + "/login_submit", {"username": "x", "password": "wrong"},
                       {"Origin": ui.base})[1]["Location"].endswith("/login")
        status, headers, _ = request(ui.base + "/login_submit", {"username": "x", "password": "open-sesame-3"},
                                     {"Origin": ui.base})
        assert status == 302 and headers["Location"].endswith("/")
        cookie = headers["Set-Cookie"].split(";")[0]
        assert request(ui.base + "/", headers={"Cookie": cookie})[0] == 200
        assert request(ui.base + "/vllm-load/live.json", headers={"Cookie": cookie})[0] == 200
        status, _h, body = request(ui.base + "/swarm", _form(), {"Origin": ui.base, "Cookie": cookie})
        assert status == 200 and json.loads(body)["success"], body
        # a guesser: 5 failed logins in a minute close the form, to the right password too, and each is logged
        for _ in range(4):
            request(ui.base + "/login_submit", {"username": "x", "password": "guess"}, {"Origin": ui.base})
        status, headers, body = request(ui.base + "/login_submit", {"username": "x", "password": "open-sesame-3"},
                                        {"Origin": ui.base})
        assert status == 429 and "too many failed logins" in body and int(headers["Retry-After"]) > 0, body
    finally:
        out = ui.close()
    assert "open-sesame-3" not in out and "the password is in $VLLM_LOAD_WEB_PASSWORD" in out
    assert out.count("web UI: a failed login from 127.0.0.1") == 5, out[-3000:]


def test_web_login_without_a_password_makes_one_in_a_private_file(tmp_path):
    ui = UI(tmp_path, "--web-login")
    try:
        line = wait_for(lambda: next((x for x in ui.out.read_text().splitlines() if "--web-login" in x), None),
                        timeout=30, what="the password line")
        path = Path(line.split("the password is in ", 1)[1].split(" (", 1)[0])
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        word = path.read_text().strip()
        assert len(word) >= 20 and word not in ui.out.read_text()
        status, headers, _ = request(ui.base + "/login_submit", {"username": "me", "password": word},
                                     {"Origin": ui.base})
        assert headers["Location"].endswith("/") and request(
            ui.base + "/", headers={"Cookie": headers["Set-Cookie"].split(";")[0]})[0] == 200
    finally:
        ui.close()


#: joins a master as any process on this host could, and prints the first spawn message it is sent (its own
#: process: Locust monkey-patches whoever imports it)
_INTRUDER = """
import json, sys
from locust import __version__
from locust.rpc import Message, rpc
client = rpc.Client("127.0.0.1", int(sys.argv[1]), "intruder_0")
client.send(Message("client_ready", __version__, "intruder_0"))
while True:
    msg = client.recv()
    if msg.type == "spawn":
        print(json.dumps(msg.data, default=str), flush=True)
        break
"""


def test_a_joining_worker_receives_no_secret_and_the_master_binds_loopback(tmp_path, emulator_factory):
    emu = emulator_factory()
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "locust", "-f", CHAT, "--master", "--headless",
                             "--expect-workers", "1", "-u", "1", "-r", "1", "-t", "20s", "--host", emu.url,
                             "--master-bind-port", str(port), "--api-key", KEY, "--sidecar-token", SIDECAR_TOKEN,
                             "--header", f"Authorization: Bearer {HEADER_TOKEN}", "--header", "X-Team: blue",
                             "--output-tokens", "4", "--run-dir", str(tmp_path / "run")],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    intruder = None
    try:
        assert wait_for(lambda: listening(proc.pid, port), timeout=60, what="the master's port") == ["127.0.0.1"]
        intruder = subprocess.Popen([sys.executable, "-c", _INTRUDER, str(port)], env=_env(), text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        wire = intruder.communicate(timeout=90)[0]
        spawn = json.loads(wire)
        for secret in (KEY, SIDECAR_TOKEN, HEADER_TOKEN):
            assert secret not in wire
        options = spawn["parsed_options"]
        assert "api_key" not in options and "sidecar_token" not in options
        assert options["header"] == ["X-Team: blue"]  # what is not a credential still goes
    finally:
        if intruder is not None and intruder.poll() is None:
            intruder.kill()
        proc.kill()
        proc.communicate(timeout=30)


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.quiet_cores  # within 5 s: timing is the subject
def test_kill_9_of_a_processes_master_stops_its_workers_within_5_s(tmp_path, emulator_factory):
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002", "--request-log", str(tmp_path / "served.jsonl"))
    port = str(free_port())
    proc = subprocess.Popen([sys.executable, "-m", "locust", "-f", CHAT, "--headless", "--processes", "2",
                             "-u", "4", "-r", "4", "-t", "60s", "--host", emu.url, "--output-tokens", "4",
                             "--master-bind-port", port, "--master-port", port, "--run-dir", str(tmp_path / "run")],
                            cwd=tmp_path, env=_env(), stdout=(tmp_path / "out.txt").open("w"), stderr=subprocess.STDOUT)
    served = tmp_path / "served.jsonl"
    wait_for(lambda: served.exists() and len(served.read_text().splitlines()) > 20, timeout=120,
             what="the workers' requests")
    workers = _children(proc.pid)
    assert len(workers) >= 2
    master_port = [c.laddr for c in psutil.Process(proc.pid).net_connections("inet") if c.status == "LISTEN"]
    assert all(a.ip == "127.0.0.1" for a in master_port), master_port  # --processes: loopback only
    proc.kill()
    killed = time.monotonic()
    wait_for(lambda: not _alive(workers), timeout=5, what="the workers to stop after their master's kill -9")
    # nothing was served after the last worker went (a quiet emulator: its log stops growing)
    lines = len(served.read_text().splitlines())
    assert time.monotonic() - killed < 5.5
    assert len(served.read_text().splitlines()) == lines
    proc.wait(timeout=10)
    out = (tmp_path / "out.txt").read_text()
    assert out.count("its --processes master is gone: stopping") == 2 and "Traceback" not in out, out[-3000:]


def test_kill_9_of_a_run_leaves_no_embedded_emulator_or_sidecar(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "locust", "-f", CHAT, "--headless", "-u", "2", "-r", "2",
                             "-t", "60s", "--output-tokens", "4", "--run-dir", str(tmp_path / "run")],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    wait_for(lambda: len(_children(proc.pid)) >= 2 and (tmp_path / "run" / "config.json").exists(), timeout=120,
             what="the run with its emulator and sidecar")
    children = _children(proc.pid)
    assert {"emulator", "sidecar"} <= {part for c in children for part in ("emulator", "sidecar")
                                       if part in " ".join(c.cmdline())}
    proc.kill()
    proc.wait(timeout=10)
    wait_for(lambda: not _alive(children), timeout=5, what="the emulator and sidecar to go with their run")


def test_two_sigterms_during_the_end_write_one_summary_equal_to_the_log(tmp_path, emulator_factory):
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.005")
    proc = subprocess.Popen([sys.executable, "-m", "locust", "-f", CHAT, "--headless", "-u", "8", "-r", "8",
                             "-t", "60s", "--host", emu.url, "--output-tokens", "16", "--run-dir",
                             str(tmp_path / "run")],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "run" / "requests.jsonl"
    wait_for(lambda: log.exists() and log.stat().st_size > 0, timeout=120, what="requests")
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert "Traceback" not in err, err[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())["summary"]
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    measured = [r for r in logged if not r.get("warmup") and not r.get("removed")]
    assert summary["requests"] == len(measured), (summary["requests"], len(measured))
    assert out.count("vllm-load: report ") == 1


def test_an_unreachable_mlflow_adds_at_most_10_s(tmp_path, emulator_factory):
    pytest.importorskip("mlflow")
    import socket

    emu = emulator_factory()
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(16)  # accepts connections, never answers
    try:
        res = run_locust(["-f", CHAT, "--headless", "-u", "1", "-r", "1", "-t", "3s", "--host", emu.url,
                          "--output-tokens", "4", "--mlflow-uri", f"http://user:pw@127.0.0.1:{hole.getsockname()[1]}",
                          "--run-dir", str(tmp_path / "run")], cwd=tmp_path, timeout=300)
    finally:
        hole.close()
    assert "the run was not logged to MLflow" in res.stdout, res.stdout[-2000:]
    assert "user:pw" not in res.stdout + res.stderr
    # from -t's end to Locust's exit (Locust's own log times): the drain, the report and the tracker's 8 s bound,
    # where MLflow's own retries held a 6 s run for 258 s
    stamps = {}
    for line in res.stderr.splitlines():
        for key in ("--run-time limit reached", "Shutting down (exit code"):
            if key in line:
                stamps[key] = datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f")
    took = (stamps["Shutting down (exit code"] - stamps["--run-time limit reached"]).total_seconds()
    assert took <= 10 + 5, took


def test_a_ramp_from_0_over_a_request_count_sends_them_all(tmp_path):
    res = run_locust(["-f", CHAT, "--headless", "-u", "1", "-r", "1", "--num-requests", "20", "--ramp-up-strategy",
                      "linear", "--ramp-up-start-rps", "0", "--ramp-up-end-rps", "20", "--burstiness", "inf",
                      "--output-tokens", "4", "--run-dir", str(tmp_path / "run")], cwd=tmp_path, timeout=120)
    # request i at 20·i/19 req/s, request 0's rate (0) taken from request 1's: constant gaps (burstiness inf) of
    # 19/20 s, then 19/(20·i): all 20 due within 4.27 s, where a 1 % rate floor sent 1 request in 59 s
    assert res.returncode == 0, res.stdout[-2000:]
    starts = sorted(json.loads(x)["start"] for x in (tmp_path / "run" / "requests.jsonl").read_text().splitlines())
    due = 0.95 + sum(19 / (20 * i) for i in range(1, 19))
    assert len(starts) == 20 and starts[-1] - starts[0] == pytest.approx(due, abs=0.01), starts[-1] - starts[0]


def test_credentials_in_url_options_reach_no_file_or_line(tmp_path, emulator_factory, sidecar_factory):
    emu = emulator_factory()
    side = sidecar_factory("--vllm-url", emu.url)
    sidecar = side.url.replace("http://", "http://operator:hunter2@")
    res = run_locust(["-f", CHAT, "--headless", "-u", "1", "-r", "1", "-t", "3s", "--host", emu.url,
                      "--output-tokens", "4", "--sidecar-url", sidecar, "--dcgm-url",
                      "http://gpu:s3cret@127.0.0.1:9/metrics", "--run-dir", str(tmp_path / "run")],
                     cwd=tmp_path, timeout=120)
    assert res.returncode in (0, 1), res.stderr[-2000:]
    for text in (res.stdout, res.stderr, *(p.read_text(errors="replace") for p in (tmp_path / "run").rglob("*")
                                           if p.is_file())):
        assert "hunter2" not in text and "s3cret" not in text
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["options"]["sidecar_url"] == side.url  # the URL stays, without its user and password


# --- one-line refusals of bad input ------------------------------------------------------------------------------

def test_sidecar_and_emulator_refuse_bad_ports_and_intervals_in_one_line():
    for module, args in (("server.sidecar", ["--listen", ":99999"]), ("server.sidecar", ["--interval", "inf"]),
                         ("server.sidecar", ["--interval", "nan"]), ("server.emulator", ["--port", "70000"])):
        res = subprocess.run([sys.executable, "-m", module, *args], env=_env(), capture_output=True, text=True,
                             timeout=60, cwd=ROOT)
        assert res.returncode == 2 and "Traceback" not in res.stderr, (args, res.stderr[-1500:])
        assert len(res.stderr.strip().splitlines()) == 1 and "error:" in res.stderr, res.stderr


def test_trace_and_dataset_inputs_that_misbehaved_are_one_line_errors(tmp_path):
    from vllm_load.errors import UsageError
    from vllm_load.workload.inputs.datasets import read_records
    from vllm_load.workload.inputs.input_files import read_text
    from vllm_load.workload.inputs.trace import read_trace

    bad = {
        "nan.jsonl": '{"timestamp": 0, "input_length": 4, "output_length": 4}\n'
                     '{"timestamp": NaN, "input_length": 4, "output_length": 4}\n',
        "inf.jsonl": '{"timestamp": 0, "input_length": 4, "output_length": 1e999}\n',
        "nan.csv": "timestamp,input_length,output_length\n0,4,4\nnan,4,4\n",
    }
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(UsageError) as err:
            read_trace(tmp_path / name)
        assert "\n" not in str(err.value) and name in str(err.value)
    (tmp_path / "wide.csv").write_text("text\n" + "x" * 200_000 + "\n")
    with pytest.raises(UsageError, match="line 2"):
        read_records(tmp_path / "wide.csv")
    endless = tmp_path / "endless.jsonl"
    with endless.open("w") as fh:
        fh.write('{"text": "a"}\n')
        fh.write("y" * (3 << 20))
    # the same rule at a smaller size: refused at line 2, not read whole
    with pytest.raises(UsageError, match="line 2 is longer than 1 MiB"):
        read_text(endless, "dataset", "--dataset", 1 << 20, None)


def test_options_that_misbehaved_are_refused_in_one_line(tmp_path):
    for extra, said in ((["--images-per-request", "10000"], "--images-per-request 10000 is more than 64"),
                        (["--audio-seconds", "3600"], "--audio-seconds 3600 is more than 120"),
                        (["--sidecar-url", "http://127.0.0.1:9101,http://127.0.0.1:9101/"], "lists http://127.0.0.1:9101 twice")):
        res = run_locust(["-f", CHAT, "--headless", "-u", "1", "-t", "5s", *extra, "--run-dir",
                          str(tmp_path / "run")], cwd=tmp_path, timeout=120)
        errors = [line for line in res.stderr.splitlines() if line.startswith("vllm-load: error:")]
        assert res.returncode == 2 and len(errors) == 1 and said in errors[0], (extra, res.stderr[-1500:])
        assert "Traceback" not in res.stderr


def test_a_num_requests_run_that_time_ended_is_invalid(tmp_path, emulator_factory):
    emu = emulator_factory()
    res = run_locust(["-f", CHAT, "--headless", "-u", "2", "-r", "2", "-t", "3s", "--host", emu.url,
                      "--output-tokens", "4", "--num-requests", "1000000", "--run-dir", str(tmp_path / "run")],
                     cwd=tmp_path, timeout=120)
    assert res.returncode == 4, res.stdout[-2000:]
    assert "of the 1000000 requests asked finished before the run ended" in res.stdout


def test_the_web_gate_rules_one_by_one():
    from vllm_load.host_names import allowed_names, host_name
    from vllm_load.plugin.webui.web_gate import refusal
    from vllm_load.plugin.swarm.worker_secrets import scrub
    from vllm_load.redact import redact_all, redact_urls

    names = allowed_names("127.0.0.1", ["ui.internal"])
    assert host_name("[::1]:8089") == "::1" and host_name("LOCALHOST:1") == "localhost"
    assert refusal("GET", "127.0.0.1:8089", None, None, None, names) is None
    assert refusal("GET", "ui.internal", None, None, None, names) is None
    assert "not this UI's name" in refusal("GET", "evil.example:8089", None, None, None, names)
    assert refusal("POST", "127.0.0.1:8089", "http://127.0.0.1:8089", None, "same-origin", names) is None
    assert refusal("POST", "127.0.0.1:8089", None, None, None, names) is None  # not a browser
    assert refusal("POST", "127.0.0.1:8089", "null", None, None, names)
    assert refusal("POST", "127.0.0.1:8089", "http://127.0.0.1:8090", None, None, names)  # another port
    assert refusal("POST", "127.0.0.1:8089", None, "http://127.0.0.1:8089/", "same-site", names)
    assert scrub({"api_key": "k", "otlp_token": "t", "header": ["Authorization: Bearer x", "X-A: 1"], "n": 1}) == {
        "header": ["X-A: 1"], "n": 1}
    assert redact_urls("to http://u:p@h:1/x and https://k@h2, s3://a:b@bucket/") == \
        "to http://h:1/x and https://h2, s3://bucket/"
    assert redact_all({"a": ["http://u:p@h"], "b": 2}) == {"a": ["http://h"], "b": 2}


def test_no_answer_of_the_ui_may_be_framed_by_another_sites_page():
    """Clickjacking: a page elsewhere that framed the UI could have the operator press its buttons through a
    transparent frame. Every answer (a page, the stats, a refusal) says only the UI's own pages may frame it, over
    whatever the app said."""
    from vllm_load.host_names import allowed_names
    from vllm_load.plugin.webui.web_gate import GateMiddleware

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/html"), ("X-Frame-Options", "ALLOWALL")])
        return [b"<html></html>"]

    gate = GateMiddleware(app, allowed_names("127.0.0.1", []))
    for env in ({"REQUEST_METHOD": "GET", "HTTP_HOST": "127.0.0.1:8089", "PATH_INFO": "/"},
                {"REQUEST_METHOD": "GET", "HTTP_HOST": "evil.example", "PATH_INFO": "/"}):  # refused: 403
        said: list = []
        gate(env, lambda status, headers, exc_info=None: said.append((status, headers)))
        (status, headers), = said
        framing = [(k, v) for k, v in headers if k.lower() in ("x-frame-options", "content-security-policy")]
        assert sorted(framing) == [("Content-Security-Policy", "frame-ancestors 'self'"),
                                   ("X-Frame-Options", "SAMEORIGIN")], (status, headers)


def test_users_a_ramp_removes_mid_request_are_not_failures(tmp_path):
    from tests.helpers import run_in_process

    res = run_in_process(["-f", CHAT, "--headless", "-t", "6s", "--ramp-up-strategy", "linear", "--ramp-up-start-users",
                          "8", "--ramp-up-end-users", "1", "--output-tokens", "32", "--emulator-itl", "0.05",
                          "--run-dir", str(tmp_path / "run")], cwd=tmp_path, timeout=120)
    assert (tmp_path / "run" / "summary.json").exists(), res.stdout[-3000:] + res.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())["summary"]
    logged = [json.loads(x) for x in (tmp_path / "run" / "requests.jsonl").read_text().splitlines()]
    removed = [r for r in logged if r.get("removed")]
    # 8 users going to 1 over 6 s, each request 1.6 s long: users leave mid-request; the healthy server is not
    # blamed for them (exit 1 before)
    assert removed and summary["removed_excluded"] == len(removed), res.stdout[-2000:]
    assert summary["failed"] == 0 and res.returncode == 0, res.stdout[-2000:]
    assert f"load shape: {len(removed)} requests were cut" in res.stdout


def test_a_request_cut_while_the_drain_still_waits_is_removed_and_one_cut_after_it_failed():
    """The end's drain waits for the requests in flight; a load shape's last tick can remove a user during that wait
    (beside a busy suite a ramp's did, and its request was counted failed): only a cut once the wait is over (its
    timeout, a second Ctrl-C) is the server's failure."""
    from types import SimpleNamespace

    import gevent.event

    from vllm_load.client.record import RequestRecord
    from vllm_load.plugin.load.generator import Generator
    from vllm_load.plugin.requests.llm import LLM

    recorded: list = []
    gen = SimpleNamespace(draining=False, drain_over=False, idle=gevent.event.Event(), flush_log=lambda: None,
                          steady=SimpleNamespace(close=lambda _t: None), on_record=recorded.append)
    handle = SimpleNamespace(_sessions={})
    gen.draining = True  # the drain began: a user removed now is the shape's doing
    LLM._cancelled(handle, gen, RequestRecord("chat", 0.0, 1.0, False, cancelled=True), None)
    assert Generator.drain(gen, 0.01) is False and gen.drain_over  # one request still in flight at the timeout
    LLM._cancelled(handle, gen, RequestRecord("chat", 0.0, 1.0, False, cancelled=True), None)
    assert [r.removed for r in recorded] == [True, False]


def test_a_sidecar_that_refuses_the_token_is_not_called_unreachable(sidecar_factory, emulator_factory, tmp_path):
    from vllm_load.plugin.sources.server_side import fetch_samples

    emu = emulator_factory()
    side = sidecar_factory("--vllm-url", emu.url, "--token", "right", "--out", str(tmp_path / "s.jsonl"))
    samples, why = fetch_samples(side.url, time.time() - 5, time.time(), token="wrong")
    assert samples == [] and "refused the read (HTTP 401" in why and "--sidecar-token" in why, why
    assert "unreachable" not in why


def test_each_process_reads_its_own_secrets_and_a_wide_master_says_its_port_is_open(tmp_path):
    import argparse

    from vllm_load.errors import UsageError
    from vllm_load.plugin.webui.ui_guard import master_warning
    from vllm_load.plugin.swarm.worker_secrets import OwnHeaders, read_key_file, scrub

    key_file = tmp_path / "key"
    key_file.write_text("  sk-from-file \n")
    opts = argparse.Namespace(api_key="", api_key_file=str(key_file), header=["Authorization: Bearer mine", "X-A: 1"])
    read_key_file(opts)
    assert opts.api_key == "sk-from-file"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(UsageError, match="is empty"):
        read_key_file(argparse.Namespace(api_key_file=str(tmp_path / "empty")))
    # an endless file (it was read until the kernel killed the process at 23.9 GB): one line, at once
    with pytest.raises(UsageError, match="--api-key-file /dev/zero holds more than 64 KB"):
        read_key_file(argparse.Namespace(api_key_file="/dev/zero"))
    # a worker's own credential header survives a spawn message that carries the master's others only
    own = OwnHeaders(opts)
    opts.header = scrub({"header": ["X-A: 1", "Authorization: Bearer master's"]})["header"]
    own.restore(opts)
    assert opts.header == ["X-A: 1", "Authorization: Bearer mine"]
    assert master_warning("127.0.0.1", 5557) is None
    said = master_warning("0.0.0.0", 5557)
    assert "unauthenticated" in said and "ssh -N -L 5557:127.0.0.1:5557" in said and "never its secrets" in said
