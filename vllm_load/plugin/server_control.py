"""Putting the server in a known state between measurements: vLLM's ``POST /reset_prefix_cache``.

Without it, a sweep's step, a tune's probe or a repeated run inherits the prefix cache the last one filled, and its
hit rate (and so its TTFT) describes the order of the measurements. vLLM serves the endpoint only in dev mode
(``VLLM_SERVER_DEV_MODE=1``); a server that refuses it is said once, and the run goes on.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Callable

from vllm_load.client.openai_api import auth_header, public_url

PATH = "/reset_prefix_cache"


class CacheReset:
    """--reset-prefix-cache for one process's runs: every target's cache emptied before each measurement."""

    def __init__(self, hosts: tuple[str, ...], api_key: str, say: Callable[[str], None]) -> None:
        self.hosts, self.api_key, self.say = hosts, api_key, say
        self.refused: set[str] = set()  # targets that said no once (said once)

    def __call__(self, why: str) -> int:
        """Reset every target that takes it; the number that did."""
        done = 0
        for host in self.hosts:
            if host in self.refused:
                continue
            req = urllib.request.Request(host.rstrip("/") + PATH, data=b"", method="POST",
                                         headers=auth_header(self.api_key))
            try:
                with urllib.request.urlopen(req, timeout=10) as resp:
                    resp.read()
                done += 1
            except urllib.error.HTTPError as exc:
                self.refused.add(host)
                self.say(f"vllm-load: {public_url(host)} refused {PATH} (HTTP {exc.code}; vLLM serves it with "
                         "VLLM_SERVER_DEV_MODE=1): its prefix cache is not reset between measurements")
            except OSError as exc:
                self.say(f"vllm-load: {PATH} at {public_url(host)} failed before {why}: {exc}")
        if done:
            self.say(f"vllm-load: prefix cache reset on {done} target(s) before {why}")
        return done
