"""--load-lora NAME=PATH: LoRA adapters loaded into every target before the run's checks, through vLLM's dynamic
``POST /v1/load_lora_adapter`` (served only when vLLM runs with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` and
``--enable-lora``), and unloaded (``/v1/unload_lora_adapter``) when the process ends: the server is left with the
adapters it had. An adapter a target already serves is used as it is and left there. How long each load took is
said: a fleet that loads adapters on demand pays it on the first request. A target without the route, or one that
cannot load the adapter, is one line (exit 2)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Callable

from vllm_load.client.apis.openai_api import auth_header, public_url
from vllm_load.errors import UsageError

LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
ALREADY = "has already been loaded"  # vLLM's 400 for a name it serves (entrypoints/openai/models/serving.py)


def parse_specs(values: list[str] | None) -> list[tuple[str, str]]:
    """``--load-lora`` values: NAME=PATH each (commas separate several)."""
    out: list[tuple[str, str]] = []
    for text in values or []:
        for item in (x.strip() for x in str(text).split(",")):
            name, sep, path = item.partition("=")
            if not item:
                continue
            if not sep or not name.strip() or not path.strip():
                raise UsageError(f"--load-lora {item!r}: give NAME=PATH (the adapter's folder as the server sees it)")
            out.append((name.strip(), path.strip()))
    return out


class LoraAdapters:
    """The adapters this process loaded, per target, to unload at its end."""

    def __init__(self, hosts: tuple[str, ...], api_key: str, say: Callable[[str], None]) -> None:
        self.hosts, self.api_key, self.say = hosts, api_key, say
        self.loaded: list[tuple[str, str]] = []  # (host, name): loaded here, unloaded by ``unload``

    def _post(self, host: str, path: str, body: dict) -> None:
        req = urllib.request.Request(host.rstrip("/") + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **auth_header(self.api_key)})
        with urllib.request.urlopen(req, timeout=120) as resp:  # a load reads the adapter's weights
            resp.read()

    def load(self, specs: list[tuple[str, str]]) -> None:
        for host in self.hosts:
            for name, path in specs:
                began = time.perf_counter()
                try:
                    self._post(host, LOAD, {"lora_name": name, "lora_path": path})
                except urllib.error.HTTPError as exc:
                    said = _message(exc)
                    if exc.code == 400 and ALREADY in said:
                        self.say(f"vllm-load: {public_url(host)} serves LoRA adapter {name} already: used as it is")
                        continue
                    self.unload()
                    if exc.code in (404, 405):
                        raise UsageError(f"--load-lora: {public_url(host)} has no {LOAD} (HTTP {exc.code}): vLLM "
                                         "serves it with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora") \
                            from None
                    raise UsageError(f"--load-lora {name}={path}: {public_url(host)} refused it (HTTP {exc.code}: "
                                     f"{said})") from None
                except OSError as exc:
                    self.unload()
                    raise UsageError(f"--load-lora {name}: {public_url(host)} did not answer ({exc})") from None
                self.loaded.append((host, name))
                self.say(f"vllm-load: loaded LoRA adapter {name} on {public_url(host)} in "
                         f"{time.perf_counter() - began:.2f} s")

    def unload(self) -> None:
        """Every adapter this process loaded, unloaded (once); a failure is said, not raised: the run is over."""
        loaded, self.loaded = self.loaded, []
        for host, name in loaded:
            try:
                self._post(host, UNLOAD, {"lora_name": name})
                self.say(f"vllm-load: unloaded LoRA adapter {name} from {public_url(host)}")
            except (urllib.error.HTTPError, OSError) as exc:
                self.say(f"vllm-load: unloading LoRA adapter {name} from {public_url(host)} failed: {exc}")


def _message(exc: urllib.error.HTTPError) -> str:
    """The server's own message, its first line (vLLM's error body: {"error": {"message": ...}})."""
    try:
        body = json.loads(exc.read() or b"{}")
        text = (body.get("error") or {}).get("message") or body.get("message") or ""
    except (ValueError, AttributeError, OSError):
        text = ""
    return (str(text).strip().splitlines() or [exc.reason or ""])[0][:200]
