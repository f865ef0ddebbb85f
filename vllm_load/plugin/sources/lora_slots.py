"""What the target says of its LoRA adapters at a run's end, for the adapter-churn feature (``features/
adapter_churn.py``): which served ids are adapters (``parent`` in /v1/models) and its base model, and its slots
(``max_lora`` of vLLM's ``vllm:lora_requests_info``, which vLLM exposes whenever LoRA is on). Read once, on the
process that judges the run (a swarm's master), from the first --host; bounded reads, a short timeout, nothing raised:
a server that says nothing leaves the slots to --max-loras."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from typing import Any

from vllm_load.client.apis.openai_api import auth_header
from vllm_load.feature_spec import RunEnd
from vllm_load.plugin.prepare.validate import split_hosts
from vllm_load.workload.model_mix import parse_models

#: how much of an answer is read (a /metrics of a big server is a few hundred kB)
READ_LIMIT = 4 << 20
TIMEOUT_S = 3.0
_MAX_LORA = re.compile(r'^vllm:lora_requests_info\{[^}]*max_lora="(\d+)"', re.M)


def _get(url: str, api_key: str) -> bytes | None:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=auth_header(api_key)),
                                    timeout=TIMEOUT_S) as resp:
            return resp.read(READ_LIMIT)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def read(host: str, api_key: str = "") -> dict[str, Any]:
    """{"adapters": [ids], "base": id or "", "slots": N or None}: what the server at ``host`` says."""
    out: dict[str, Any] = {"adapters": [], "base": "", "slots": None}
    models = _get(host.rstrip("/") + "/v1/models", api_key)
    try:
        entries = [m for m in json.loads(models or b"{}").get("data", []) if isinstance(m, dict) and m.get("id")]
    except (ValueError, AttributeError):
        entries = []
    ids = {str(m["id"]) for m in entries}
    out["adapters"] = sorted(str(m["id"]) for m in entries if m.get("parent") in ids and m.get("parent") != m["id"])
    out["base"] = next((str(m["id"]) for m in entries if str(m["id"]) not in out["adapters"]), "")
    found = _MAX_LORA.search((_get(host.rstrip("/") + "/metrics", api_key) or b"").decode("utf-8", "replace"))
    out["slots"] = int(found.group(1)) if found else None
    return out


def at_end(end: RunEnd) -> dict[str, Any] | None:
    """The adapter-churn feature's measured part: the mix's models and the target's word on its adapters (a run of
    several models)."""
    opts = end.options
    models = parse_models(str(getattr(opts, "model", "") or ""))[0]
    if len(models) < 2:
        return None
    hosts = split_hosts(getattr(opts, "host", None))
    server = read(hosts[0], str(getattr(opts, "api_key", "") or "")) if hosts else {}
    return {"models": list(models), "server": server}
