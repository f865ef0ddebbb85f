"""Start-up helpers of the process that runs the show (local runner, master): the web UI's gate, the swarm form's
reachability check, --metrics-port, and the line a non-vLLM server gets."""

from __future__ import annotations

import socket
import time
from typing import Any, Callable
from urllib.parse import urlsplit

from vllm_load.errors import UsageError
from vllm_load.plugin.prepare import validate
from vllm_load.host_names import allowed_names
from vllm_load.plugin.webui import web_gate
from vllm_load.runtime.embedded import private_temp_file
from vllm_load.plugin.prepare.target import Target


def install_gate(environment: Any, opts: Any, check: Callable[[Any], None]) -> None:
    """The web UI's gate (Host, Origin, --web-login), before any other hook of the UI; ``check`` judges the start
    form's values as the command line's are judged."""
    password = ""
    if opts.web_login:
        password, source = web_gate.login_password(opts, private_temp_file)
        print(f"vllm-load: --web-login: the password is in {source}", flush=True)
    names = allowed_names(opts.web_host, tuple(opts.web_allowed_host or ()))
    web_gate.install(environment, names, check, password)


def guard_web_ui(environment: Any, opts: Any) -> None:
    """A web UI's guards, before anything at start-up can fail (the UI stays up to show the error): no secret in
    its pages, the start form as the command line groups it, a word when it listens beyond this host."""
    if environment.web_ui is None:
        return
    from vllm_load.plugin.webui import ui_guard, web_form

    ui_guard.SecretGuard(environment).install(environment.web_ui)
    web_form.install(environment)
    warning = ui_guard.bind_warning(opts.web_host, bool(opts.web_login))
    if warning:
        print(warning, flush=True)


def announce_web_ui(web_ui: Any, opts: Any, wait_s: float = 300.0) -> None:
    """The web UI's address, said once its port accepts connections (Locust said it before its init, seconds before
    anything listened). A greenlet: Locust starts the server after init returns."""
    import gevent

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        server = getattr(web_ui, "server", None)
        address = getattr(server, "address", None) if server is not None else None
        if address:
            host, port = address[0], address[1]
            try:
                with socket.create_connection(("127.0.0.1" if host in ("", "0.0.0.0", "::") else host, port),
                                              timeout=1.0):
                    pass
            except OSError:
                pass
            else:
                scheme = "https" if getattr(opts, "tls_cert", "") else "http"
                shown = f"[{host}]" if ":" in host else host
                print(f"vllm-load: the web UI is ready at {scheme}://{shown}:{port}"
                      f"{getattr(opts, 'web_base_path', '') or ''}", flush=True)
                return
        gevent.sleep(0.1)


def reachable(host: str) -> str | None:
    """The web UI's start, before Locust starts anything: the form's host must be a URL whose server accepts a
    connection (None: go on; the full check, with the options the form sets, runs at the run's start as before).
    Only a TCP connect: nothing is sent, so no credential goes to a host the form just named."""
    try:
        hosts = validate.split_hosts(host)
    except UsageError as exc:
        return str(exc)
    for one in hosts:
        parts = urlsplit(one)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            with socket.create_connection((parts.hostname or "", port), timeout=3.0):
                pass
        except OSError as exc:
            return (f"the target {one} is not reachable ({exc.strerror or exc}): start the server there, or give "
                    "another host")
    return None


def serve_metrics(registry: Any, host: str, port: int, allowed: tuple[str, ...] = ()) -> None:
    """--metrics-port: Prometheus' scrape endpoint beside a headless run (127.0.0.1 unless --metrics-host), which
    answers only to this machine's names and no browser page (host_names.guard)."""
    from gevent.pywsgi import WSGIServer
    from prometheus_client import make_wsgi_app

    from vllm_load.host_names import guard

    app = guard(make_wsgi_app(registry), allowed_names(host, allowed), "this run's metrics endpoint")
    try:
        server = WSGIServer((host, port), app, log=None, error_log=None)
        server.start()
    except OSError as exc:
        raise UsageError(f"--metrics-port {port} on {host} cannot be served ({exc.strerror or exc}): pick a free "
                         "port") from None
    print(f"vllm-load: client metrics for Prometheus on http://{host}:{server.server_port}/metrics", flush=True)


def openai_mode_line(target: Target, opts: Any) -> str:
    """What a run that sends standard OpenAI fields only cannot control, said once at start-up."""
    why = ("--server-kind openai (the server says it is vLLM: --server-kind auto sends vLLM's fields)"
           if target.owned_by == "vllm" else
           f"the server is not vLLM (/v1/models owned_by {target.owned_by or 'nothing'!r}; --server-kind vllm "
           "overrides)")
    return (f"vllm-load: {why}: standard OpenAI fields only. Not controlled: output lengths (no ignore_eos/"
            "min_tokens: each answer ends where the model stops, at most max_tokens), tokens per chunk (no continuous "
            "usage: ITL per chunk only), and prefix-cache hits (known only where its usage reports cached tokens); "
            "without usage, output tokens are counted from the stream's deltas (at most max_tokens)")
