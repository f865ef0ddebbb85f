"""The names a listening process answers to: a request whose ``Host`` names anything else was sent by a page that
rebound a DNS name of its own to this machine (DNS rebinding), and is refused. The web UI's gate, the sidecar and
the Prometheus endpoint read the same rules."""

from __future__ import annotations

import json
import socket
from typing import Any, Callable

#: what a listener answers as its own name, whatever it binds
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


def host_name(host_header: str) -> str:
    """The name part of a ``Host`` header (``[::1]:8089`` -> ``::1``), lower-cased."""
    value = (host_header or "").strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value[1:]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def allowed_names(bind: str, extra: list[str] | tuple[str, ...] = ()) -> frozenset[str]:
    """Host names a listener on ``bind`` answers to: loopback, the bind address, this machine's names when it binds
    every interface, and each name the operator added (``--web-allowed-host``, the sidecar's ``--allowed-host``)."""
    names = set(LOOPBACK_NAMES) | {h.strip().lower() for h in extra if h and h.strip()}
    if bind and bind not in ("*", "0.0.0.0", "::", ""):
        names.add(host_name(bind))
    elif bind in ("*", "0.0.0.0", "::", ""):  # reached by this machine's own names and addresses
        names.update({socket.gethostname().lower(), socket.getfqdn().lower()})
        try:
            import psutil

            names.update(a.address.split("%")[0].lower() for addrs in psutil.net_if_addrs().values()
                         for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6))
        except Exception:  # noqa: BLE001 - without psutil's view, the names above and the added ones
            pass
    return frozenset(names)


def refusal(host_header: str, origin: str | None, fetch_site: str | None, names: frozenset[str],
            what: str) -> str | None:
    """Why a request to a listener that serves no page (``what``: "this sidecar") comes from outside its callers
    (None: it does not): a ``Host`` that is not one of ``names``, or any browser page (``Origin``, a cross-site
    ``Sec-Fetch-Site``)."""
    if host_name(host_header) not in names:
        return f"Host {host_header[:100]!r} is not {what}'s name"
    if origin is not None or (fetch_site or "none").lower() not in ("none", "same-origin"):
        return f"a browser page may not read {what}"
    return None


def guard(app: Callable, names: frozenset[str], what: str) -> Callable:
    """A WSGI app behind ``refusal``: 403 with the reason as one line of JSON."""
    def guarded(environ: dict, start_response: Callable) -> Any:
        why = refusal(environ.get("HTTP_HOST", ""), environ.get("HTTP_ORIGIN"), environ.get("HTTP_SEC_FETCH_SITE"),
                      names, what)
        if why is None:
            return app(environ, start_response)
        body = json.dumps({"error": why}).encode()
        start_response("403 Forbidden", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    return guarded
