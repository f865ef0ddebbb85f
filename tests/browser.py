"""A real headless Chromium driven over the DevTools protocol (websocket-client): pages load, scripts run, a
form is clicked as a person would, and the page's own requests carry the browser's Origin and Sec-Fetch-* headers."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import wait_for


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _answers(url: str) -> bool:
    """Whether an HTTP server answers at ``url`` (any status: a 4xx page is still a page), allowing 5 s for a page
    rendered on a busy host: beside a real vLLM's start, ``helpers.answers`` (a 200 within 2 s) in its place had 2
    browser tests fail, this one none (one run each)."""
    try:
        urllib.request.urlopen(url, timeout=5).close()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


class Browser:
    def __init__(self, profile: Path) -> None:
        exe = chromium()
        if exe is None:
            pytest.fail("CI must install chromium (.ci/run does)")
        profile.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                      f"--user-data-dir={profile}", "--remote-debugging-port=0",
                                      "--remote-allow-origins=*", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = profile / "DevToolsActivePort"
        port = wait_for(lambda: port_file.exists() and port_file.read_text().split("\n")[0].strip(), timeout=60,
                        what="Chromium's DevTools port")
        pages = wait_for(lambda: [t for t in json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json"))
                                  if t.get("type") == "page"], timeout=30, what="a page target")
        import websocket

        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=60)
        self._id = 0

    def call(self, method: str, **params: Any) -> dict:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, expression: str) -> Any:
        out = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in out:
            raise RuntimeError(f"{expression[:80]}: {out['exceptionDetails']}")
        return out.get("result", {}).get("value")

    def goto(self, url: str, ready: str = "document.readyState === 'complete'", timeout: float = 60.0,
             probe: bool = True) -> None:
        """Open ``url`` once its server answers (``probe``: a GET first; off where the page counts its loads), and
        wait for ``ready``. A navigation before the server listens lands on Chromium's error page, which never becomes ready: the web UI tests started Locust and navigated at
        once, and on a busy CI host (Locust's start-up took longer than Chromium's) waited out 60 s there."""
        deadline = time.monotonic() + timeout
        if probe:
            wait_for(lambda: _answers(url), timeout=timeout, what=f"{url} to answer", poll=0.2)
        self.call("Page.navigate", url=url)
        while time.monotonic() < deadline:
            try:
                if self.eval("location.protocol") == "chrome-error:":  # a server that went away and came back
                    self.call("Page.navigate", url=url)
                elif self.eval(f"Boolean({ready})"):
                    return
            except RuntimeError:
                pass  # the page is being replaced
            time.sleep(0.1)
        raise AssertionError(f"{url} was not ready ({ready}) within {timeout:g} s")

    def set_width(self, width: int, height: int = 900) -> None:
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def screenshot(self, path: Path) -> Path:
        import base64

        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))
        return path

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


#: what a page probe reads after the page's load: canvases with ink (lines and axes drawn), and the legends' labels
INKED_JS = ("b.setAttribute('data-inked',[...document.querySelectorAll('.uplot canvas')].filter(c=>{"
            "const d=c.getContext('2d').getImageData(0,0,c.width,c.height).data;let n=0;"
            "for(let i=3;i<d.length;i+=4)if(d[i])n++;return n>1000}).length);"
            "b.setAttribute('data-legend',[...document.querySelectorAll('.u-legend .u-label')].map(e=>e.textContent)"
            ".join('|'));")
#: headless Chromium as the page tests run it (no network, no sync, a profile of the test's own)
HEADLESS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync")


def probe_page(browser: str, page: Path, reads: str, profile: Path, size: str = "1280,900") -> tuple[str, dict]:
    """``page`` as headless Chromium draws it, with ``reads`` (script run on load, ``b`` the body, setting its
    ``data-*`` attributes) appended: the DOM it dumps and those attributes."""
    probe = page.with_name("probe-" + page.name)
    probe.write_text(page.read_text().replace(
        "</body>", f"<script>window.addEventListener('load',()=>{{const b=document.body;{reads}}})</script></body>"))
    out = subprocess.run([browser, *HEADLESS, f"--user-data-dir={profile}", f"--window-size={size}", "--dump-dom",
                          probe.as_uri()], capture_output=True, text=True, timeout=90)
    import re

    body = out.stdout.split("<body", 1)[1].split(">", 1)[0] if "<body" in out.stdout else ""
    attr = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body))
    assert attr, out.stderr[-2000:]
    return out.stdout, attr
