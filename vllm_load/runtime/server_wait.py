"""Wait for a server that is still starting (vLLM loads a 7B model for minutes) instead of failing at once.

Used by the locustfiles (``--wait-for-server``) and the sidecar: poll ``/health`` and then ``/v1/models``
until both answer, say why not every ~10 s, and give up with the last reason when the time is up.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Callable

from vllm_load.errors import UsageError
from vllm_load.client.apis.openai_api import auth_header

#: seconds between progress lines while waiting
PROGRESS_EVERY = 10.0
def _show(seconds: float) -> str:
    if seconds >= 120 and seconds % 60 == 0:
        return f"{seconds / 60:g} m"
    return f"{seconds:.0f} s"


def probe(url: str, api_key: str = "", models: bool = True, timeout: float = 5.0) -> str | None:
    """None when the server is ready (``/health`` 200 and, with ``models``, ``/v1/models`` lists a model),
    else why not, in a few words."""
    base = url.rstrip("/")
    paths = ("/health", "/v1/models") if models else ("/health",)
    for path in paths:
        try:
            req = urllib.request.Request(base + path, headers=auth_header(api_key))
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                body = resp.read()
            if path == "/v1/models" and not json.loads(body).get("data"):
                return "/v1/models lists no model yet"
        except urllib.error.HTTPError as exc:
            return f"{path} answered HTTP {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            return f"not reachable: {getattr(reason, 'strerror', None) or reason}".lower()
        except ValueError:
            return f"{path} did not answer JSON"
    return None


def wait_for_server(url: str, seconds: float, api_key: str = "", models: bool = True,
                    say: Callable[[str], None] = print, prefix: str = "vllm-load") -> float:
    """Block until ``url`` is ready or ``seconds`` pass (then UsageError with the last reason); returns
    how long it waited. One progress line about every 10 s."""
    start = time.monotonic()
    why = probe(url, api_key, models)
    if why is None:
        return 0.0
    next_line = start
    while True:
        waited = time.monotonic() - start
        if waited >= seconds:
            raise UsageError(f"{url} was not ready after {_show(seconds)} ({why}): start the server, or raise "
                             "--wait-for-server")
        if time.monotonic() >= next_line:
            say(f"{prefix}: waiting for {url} ({why}) {_show(waited)} / {_show(seconds)}")
            next_line += PROGRESS_EVERY
        time.sleep(min(1.0, max(0.05, seconds - waited)))
        why = probe(url, api_key, models)
        if why is None:
            waited = time.monotonic() - start
            say(f"{prefix}: {url} is ready after {waited:.1f} s")
            return waited
