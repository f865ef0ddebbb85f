"""The web UI's LLM tab, live SLO status and report link, on a real Locust process."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

from tests.conftest import ROOT


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.read().decode()


def test_llm_tab_live_rows_slo_status_and_report_link(tmp_path, emulator_factory):
    emu = emulator_factory("--ttft", "0.02", "--itl", "0.005")
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles/chat.py"), "--host", emu.url,
                             "--web-host", "127.0.0.1", "--web-port", str(port), "--autostart", "-u", "2", "-r", "2",
                             "-t", "4s", "--autoquit", "30", "--output-tokens", "16", "--slo", "ttft.p99<=2s",
                             "--run-dir", str(tmp_path / "run")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        rows, page, report = [], "", ""
        while time.monotonic() < deadline and not report:
            try:
                _, page = get(base + "/")
                _, body = get(base + "/stats/requests")
            except OSError:
                time.sleep(0.2)  # polling for the UI to come up; the condition is checked, not assumed
                continue
            llm = [t for t in json.loads(body).get("extended_stats", []) if t["key"] == "llm"]
            rows = llm[0]["data"] if llm else []
            if any(r["metric"] == "Report of the last run" for r in rows):
                report = get(base + "/vllm-load/report")[1]
            else:
                time.sleep(0.2)
        assert '"extended_tabs"' in page and '"LLM"' in page
        names = [r["metric"] for r in rows]
        assert "TTFT (ms)" in names and "Output tok/s (live, last 10 s)" in names
        assert any(r["metric"] == "SLO ttft.p99<=2s" and r["count"] == "PASS" for r in rows)
        assert "SLO verdict" in report and "data:image/png;base64," in report
    finally:
        proc.terminate()
        proc.wait(timeout=30)
