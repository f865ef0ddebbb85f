"""What the load test needs from an OpenAI-compatible server besides the streaming calls."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass

from vllm_load.errors import UsageError
from vllm_load.redact import redact_urls


@dataclass
class ServedModel:
    id: str
    max_model_len: int | None
    all_ids: list[str]
    root: str = ""  # what vLLM loaded (the model's path or hub id), under --served-model-name's alias
    owned_by: str = ""  # "vllm" from vLLM (and its emulator); llama.cpp, TGI, SGLang, a gateway say otherwise


def tls_context(insecure: bool, ca_bundle: str) -> ssl.SSLContext | None:
    """The TLS check of https:// targets: verified against the system's CAs (None), against --ca-bundle's,
    or not at all with --insecure (a self-signed test server)."""
    if insecure:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    if ca_bundle:
        try:
            return ssl.create_default_context(cafile=ca_bundle)
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(f"--ca-bundle {ca_bundle} cannot be used ({exc}): give a PEM file of CA certificates") from None
    return None


def use_tls_context(ctx: ssl.SSLContext | None) -> None:
    """This process's own calls to the server (/v1/models, /tokenize, /health) check TLS as the requests do."""
    if ctx is not None:
        urllib.request.install_opener(urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx)))


#: header names whose values are credentials: written as *** wherever headers are written (options, logs)
CREDENTIAL_WORDS = ("auth", "token", "key", "secret", "cookie", "password", "session", "credential")


def is_credential_header(name: str) -> bool:
    low = name.lower()
    return any(w in low for w in CREDENTIAL_WORDS)


def public_url(url: str) -> str:
    """A URL as it may be written or shown: without the credentials of ``http://user:password@host`` (which are
    sent to that host only)."""
    return redact_urls(url)


def auth_header(api_key: str) -> dict[str, str]:
    """The bearer header for a server or sidecar (empty without a token): built here only."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def discover_model(host: str, model: str, api_key: str = "", timeout: float = 10.0,
                   headers: dict[str, str] | None = None) -> ServedModel:
    """Read /v1/models; pick ``model`` (or the first id) and its max_model_len. Bad input -> UsageError.
    ``headers``: the run's request headers (a gateway may need them on every path)."""
    url = host.rstrip("/") + "/v1/models"
    try:
        sent = {k: v for k, v in (headers or {}).items() if k.lower() not in ("content-type", "accept", "accept-encoding")}
        req = urllib.request.Request(url, headers={**sent, **auth_header(api_key)})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        hint = "check --api-key" if exc.code in (401, 403) else "check --host"
        raise UsageError(f"{url} answered HTTP {exc.code}: {hint}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        if "CERTIFICATE_VERIFY_FAILED" in str(reason):
            raise UsageError(f"cannot reach {url} (its TLS certificate does not verify: {reason}): pass --ca-bundle "
                             "FILE with its CA, or --insecure for a test server") from None
        raise UsageError(f"cannot reach {url} ({reason}): check --host and that the server is up") from None
    entries = [m for m in data.get("data", []) if isinstance(m, dict) and m.get("id")]
    ids = [m["id"] for m in entries]
    if not ids:
        raise UsageError(f"{url} lists no models: check --host")
    chosen = model or ids[0]
    if chosen not in ids:
        raise UsageError(f"model {chosen!r} is not served by {host} (it serves: {', '.join(ids)}): fix --model")
    entry = entries[ids.index(chosen)]
    max_len = entry.get("max_model_len")
    root = str(entry.get("root") or "")
    parent = entry.get("parent")
    if parent in ids and parent != chosen:  # a LoRA adapter (its root is its own folder): the base model's tokenizer
        base = entries[ids.index(parent)]
        root, max_len = str(base.get("root") or parent), max_len or base.get("max_model_len")
    return ServedModel(id=chosen, max_model_len=int(max_len) if max_len else None, all_ids=ids, root=root,
                       owned_by=str(entry.get("owned_by") or ""))


def server_version(host: str, api_key: str = "", timeout: float = 3.0, headers: dict[str, str] | None = None) -> str:
    """vLLM's version from its /version ({"version": "0.32.0"}), or "" from a server without one (not vLLM, a
    gateway): shown beside the target and compared between runs, never required."""
    return server_identity(host, api_key, timeout, headers)[0]


def server_identity(host: str, api_key: str = "", timeout: float = 3.0, headers: dict[str, str] | None = None
                    ) -> tuple[str, bool]:
    """(``server_version``, whether /version says it is vllm-load's emulator: ``"emulator": "vllm-load"``)."""
    sent = {k: v for k, v in (headers or {}).items() if k.lower() not in ("content-type", "accept", "accept-encoding")}
    try:
        req = urllib.request.Request(host.rstrip("/") + "/version", headers={**sent, **auth_header(api_key)})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data = json.loads(resp.read())
        version, emulator = data.get("version"), data.get("emulator") == "vllm-load"
    except (urllib.error.URLError, OSError, ValueError, AttributeError):
        return "", False
    return (str(version)[:40] if isinstance(version, (str, int, float)) else ""), emulator


def error_message(body: bytes) -> str:
    """The message of a vLLM/OpenAI error body, old ({"message":…}) or new ({"error":{…}}) shape."""
    try:
        data = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace").strip()
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:200]
        if isinstance(err, str):
            return err[:200]
    return str(data)[:200]
