"""The web UI never gives a secret away.

Locust renders every custom option's value into the page as the form's default (``is_secret`` only masks the
input box), and ``POST /swarm`` takes any host: a UI reachable by others handed out ``--api-key`` and sent it,
with every request, to a server of their choosing. Here:

- the page's form carries no secret value, only whether one is set (its help says "set: leave empty to keep it");
- an empty secret field in ``/swarm`` keeps the configured secret (Locust would store the empty string);
- each secret is bound to the origin of the URL it authenticates to (``--api-key`` to ``--host``,
  ``--sidecar-token`` to ``--sidecar-url``, ``--prometheus-token`` to ``--prometheus-url``): when the form
  moves that URL to another origin and the secret is not entered again, it is dropped, and so are
  credential-like ``--header`` values for a new ``--host`` origin;
- the UI binds 127.0.0.1 unless ``--web-host`` says otherwise (Locust's default is every interface), and a
  wider bind without ``--web-login`` is named in one warning line.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

from vllm_load.client.apis.openai_api import is_credential_header

log = logging.getLogger("vllm_load")

#: secret option -> the option holding the URL it is sent to ("host": Locust's own --host)
SECRETS: dict[str, str] = {"api_key": "host", "sidecar_token": "sidecar_url", "prometheus_token": "prometheus_url",
                           "otlp_token": "otlp_endpoint"}
#: what the UI binds when --web-host is not given
DEFAULT_WEB_HOST = "127.0.0.1"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin(url: str) -> str:
    """scheme://host:port of ``url``, lower-cased, the default port filled in ('' for no URL)."""
    if not url:
        return ""
    parts = urlsplit(str(url).strip())
    try:
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme.lower(), 0)
    except ValueError:
        port = 0
    return f"{parts.scheme.lower()}://{(parts.hostname or '').lower()}:{port}"


def bind_warning(web_host: str, web_login: bool) -> str | None:
    """The one line said when the UI listens beyond this host without a login, else None."""
    if web_login or web_host in _LOOPBACK:
        return None
    where = "every interface" if web_host in ("", "*", "0.0.0.0", "::") else web_host
    return (f"vllm-load: warning: the web UI listens on {where} with no login: whoever reaches it can start runs "
            "against any host. Keep the default --web-host 127.0.0.1 (reach it over an SSH tunnel), or add "
            "Locust's --web-login")


def master_warning(bind_host: str, port: int) -> str | None:
    """The one line a master says when its worker port is reachable beyond this host (None on loopback)."""
    if bind_host in _LOOPBACK:
        return None
    where = "every interface" if bind_host in ("", "*", "0.0.0.0", "::") else bind_host
    return (f"vllm-load: warning: the master's port {port} listens on {where}, unauthenticated: any process that "
            "reaches it can join as a worker and receive the run's options (never its secrets: each worker reads its "
            "own --api-key-file or VLLM_LOAD_API_KEY). Keep it on a private network, or bind 127.0.0.1 and reach it "
            f"over an SSH tunnel (ssh -N -L {port}:127.0.0.1:{port} MASTER on each worker's machine)")


class SecretGuard:
    """Keeps the secrets of one process's parsed options out of its web UI (see the module's docstring)."""

    def __init__(self, environment: Any) -> None:
        self.environment = environment
        opts = environment.parsed_options
        #: secret -> the origin it may be sent to
        self.bound = {secret: origin(self._url(opts, url_opt)) for secret, url_opt in SECRETS.items()}
        self.host_origin = origin(environment.host or "")

    def _url(self, opts: Any, url_opt: str) -> str:
        return str(self.environment.host or "") if url_opt == "host" else str(getattr(opts, url_opt, "") or "")

    def install(self, web_ui: Any) -> None:
        update = web_ui.update_template_args

        def update_template_args() -> None:
            update()
            self.mask(web_ui.template_args.get("extra_options") or {})

        web_ui.update_template_args = update_template_args

        from flask import request

        @web_ui.app.before_request
        def _guard_swarm() -> None:
            if request.method == "POST" and request.path.rstrip("/").endswith("/swarm"):
                request.form = self.screen(request.form)

    def mask(self, extra_options: dict) -> None:
        """The form's entries for the secrets: no value, only whether one is set."""
        opts = self.environment.parsed_options
        for secret in SECRETS:
            entry = extra_options.get(secret)
            if entry is None:
                continue
            entry["default_value"] = ""
            if getattr(opts, secret, "") and "leave empty to keep it" not in (entry.get("help_text") or ""):
                entry["help_text"] = f"{entry.get('help_text') or ''} (set: leave empty to keep it)".strip()

    def screen(self, form: Any) -> Any:
        """A /swarm form as Locust may apply it: empty secret fields removed (the configured value stays), and
        secrets (and credential headers) dropped where their URL moves to another origin unless entered again."""
        from werkzeug.datastructures import ImmutableMultiDict

        opts = self.environment.parsed_options
        fields = form.to_dict(flat=False)
        for secret, url_opt in SECRETS.items():
            entered = (fields.pop(secret, None) or [""])[-1]
            url = (fields.get(url_opt) or [self._url(opts, url_opt)])[-1]
            now = origin(url)
            if entered:
                fields[secret] = [entered]
            elif now != self.bound[secret] and getattr(opts, secret, ""):
                setattr(opts, secret, "")
                log.warning("vllm-load: --%s is not sent to %s (it was given for %s): enter it again in the form "
                            "to use it there", secret.replace("_", "-"), now, self.bound[secret] or "no URL")
            self.bound[secret] = now
        new_host = origin((fields.get("host") or [self.environment.host or ""])[-1])
        if new_host != self.host_origin:
            headers = list(getattr(opts, "header", None) or [])
            kept = [h for h in headers if not is_credential_header(str(h).partition(":")[0])]
            if len(kept) != len(headers):
                opts.header = kept
                log.warning("vllm-load: %d credential --header value(s) are not sent to %s (given for %s)",
                            len(headers) - len(kept), new_host, self.host_origin)
            self.host_origin = new_host
        return ImmutableMultiDict([(k, v) for k, values in fields.items() for v in values])
