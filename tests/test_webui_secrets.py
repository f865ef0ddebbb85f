"""The web UI gives no secret away: no page or JSON endpoint carries one, a swarm to another host does not take
the API key there, and the UI listens on 127.0.0.1 unless told otherwise (a real Locust process)."""

import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


import pytest

from tests.helpers import ROOT, free_port, listening, wait_for

KEY, SIDECAR, PROM = "sk-SECRET-key-7f3a9", "sidecar-SECRET-tok-41c2", "prom-SECRET-tok-88d0"

#: every page and JSON endpoint of Locust's UI and vllm-load's (the report only exists after a run)
PATHS = ["/", "/stats/requests", "/stats/requests/csv", "/stats/failures/csv", "/stats/report", "/exceptions",
         "/exceptions/csv", "/tasks", "/logs", "/user_classes", "/vllm-load/live", "/vllm-load/live.json",
         "/metrics", "/vllm-load/llm_stats.csv", "/vllm-load/report", "/vllm-load/state"]


class Capture:
    """An HTTP server that records each request's path and Authorization header and answers 404."""

    def __init__(self):
        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                seen.append((self.path, self.headers.get("Authorization")))
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = _answer

            def log_message(self, *_a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


def fetch(url, data=None):
    req = urllib.request.Request(url, data=None if data is None else urllib.parse.urlencode(data).encode())
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def swarm_form(host, **extra):
    return {"user_count": "1", "spawn_rate": "1", "host": host, "api_key": "", "sidecar_token": "",
            "prometheus_token": "", **extra}


@pytest.mark.e2e
def test_no_page_carries_a_secret_and_a_swarm_elsewhere_sends_no_key(tmp_path, emulator_factory):
    emu = emulator_factory("--ttft", "0.01", "--itl", "0.002")
    capture = Capture()
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("VLLM_LOAD_API_KEY", None)
    proc = subprocess.Popen([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles/chat.py"), "--host", emu.url,
                             "--web-port", str(port), "--api-key", KEY, "--sidecar-token", SIDECAR,
                             "--prometheus-token", PROM, "--prometheus-url", "http://127.0.0.1:9",
                             "--output-tokens", "4", "--run-dir", str(tmp_path / "run")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: listening(proc.pid, port), timeout=60, what="the web UI to listen")
        assert set(listening(proc.pid, port)) == {"127.0.0.1"}  # not every interface (Locust's default)
        page = fetch(base + "/")[1]
        assert "api_key" in page and "set: leave empty to keep it" in page  # the form says a key is set
        # a run against the configured host: the key goes there (empty fields keep the configured secrets)
        status, body = fetch(base + "/swarm", swarm_form(emu.url))
        assert status == 200 and json.loads(body)["success"], body
        wait_for(lambda: json.loads(fetch(base + "/stats/requests")[1])["total_rps"] > 0, timeout=60,
                 what="requests with the kept key")
        fetch(base + "/stop", {})
        wait_for(lambda: fetch(base + "/vllm-load/report")[0] == 200, timeout=60, what="the run's report")
        for path in PATHS:
            status, body = fetch(base + path)
            for secret in (KEY, SIDECAR, PROM):
                assert secret not in body, f"{path} ({status}) carries a secret"
        # the UI moves the run to another host without entering the key again: the key stays here
        status, body = fetch(base + "/swarm", swarm_form(capture.url))
        assert KEY not in body
        wait_for(lambda: capture.seen, timeout=30, what="the new host to be contacted")
        fetch(base + "/stop", {})
        assert all(auth is None for _path, auth in capture.seen), capture.seen
        # entered again in the form, it is the user's choice: sent there
        fetch(base + "/swarm", swarm_form(capture.url, api_key="typed-again"))
        wait_for(lambda: ("/v1/models", "Bearer typed-again") in capture.seen, timeout=30,
                 what="the re-entered key at the new host")
    finally:
        proc.terminate()
        out = proc.communicate(timeout=60)[0]
        capture.close()
    for secret in (KEY, SIDECAR, PROM):
        assert secret not in out  # nor in the console
    assert "is not sent to http://127.0.0.1" in out


@pytest.mark.e2e
def test_a_wider_bind_warns_that_the_ui_has_no_login(tmp_path, emulator_factory):
    emu = emulator_factory()
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles/chat.py"), "--host", emu.url,
                             "--web-host", "0.0.0.0", "--web-port", str(port), "--output-tokens", "4"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = wait_for(lambda: next((x for x in iter(proc.stdout.readline, "") if "no login" in x or "target" in x),
                                     None), timeout=60, what="the start-up lines")
        assert "listens on every interface with no login" in line
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
