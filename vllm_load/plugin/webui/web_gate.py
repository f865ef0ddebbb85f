"""The web UI's gate: who may reach it, from which page, and what a start may set.

Locust's UI answers every origin (flask-cors reflects it), every ``Host`` and any parsed option in ``POST /swarm``:
a page the operator merely visited could start a run that sent a local file's lines, with the API key, to a server
of its choosing (``dataset=…&host=…``), write anywhere (``run_dir``, ``html_file``) or pass the key guard with a
second ``host`` field. Here, before Locust or any plugin hook sees a request:

- ``Host`` must name this UI: 127.0.0.1, localhost, ::1, ``--web-host``, ``--web-allowed-host`` (a rebinding DNS
  name is refused). Not Flask's ``TRUSTED_HOSTS``: Werkzeug (3.1) cuts each trusted name at its first ``:``, so
  no IPv6 name (``::1``, ``[::1]``) ever matches and a UI on ``--web-host ::1`` would refuse its own page;
- a request that changes state (any method but GET/HEAD) must come from the UI's own origin (``Origin``, else
  ``Referer``; a browser sends one of them on every cross-site POST, and ``Sec-Fetch-Site`` where it can);
- no CORS header leaves (a foreign page cannot read an answer);
- ``/swarm`` takes only the fields the form shows, each once, validated as on the command line; options that name
  a file, a folder or a destination that receives credentials from the environment are not in the form;
- with ``--web-login`` every route (the plugin's too) needs the login, checked first.
"""

from __future__ import annotations

import argparse
import copy
import hmac
import json
import logging
import math
import os
import secrets
import time
from collections import deque
from typing import Any, Callable
from urllib.parse import urlsplit

from vllm_load.client.apis.openai_api import public_url
from vllm_load.errors import UsageError
from vllm_load.host_names import host_name
from vllm_load.plugin.swarm.worker_secrets import read_secret_file

log = logging.getLogger("vllm_load")

#: the methods that only read
_SAFE_METHODS = frozenset({"GET", "HEAD"})
#: Locust's own form fields (the rest are the custom options the form shows)
LOCUST_FORM_FIELDS = frozenset({"user_count", "spawn_rate", "host", "run_time", "user_classes", "shape_class",
                                "profile"})
#: form fields that may repeat (a multiple select)
_MULTIPLE = frozenset({"user_classes"})
#: what an anonymous request may reach with --web-login: the login page, its form's target and its assets
_OPEN_PATHS = ("/login", "/login_submit", "/assets/", "/favicon")
PASSWORD_ENV = "VLLM_LOAD_WEB_PASSWORD"


def refusal(method: str, host_header: str, origin: str | None, referer: str | None, fetch_site: str | None,
            names: frozenset[str]) -> str | None:
    """Why a request is refused (None: served)."""
    if host_name(host_header) not in names:
        return (f"Host {host_header!r} is not this UI's name: open it as http://127.0.0.1 or localhost, or add "
                "--web-allowed-host NAME")
    if method in _SAFE_METHODS:
        return None
    if fetch_site and fetch_site.lower() not in ("same-origin", "none"):
        return f"a {fetch_site} request may not change this UI's state"
    source = origin if origin is not None else referer
    if source is None:
        return None  # not a browser: a cross-site request always carries one of them
    parts = urlsplit(source)
    if source == "null" or (parts.netloc or "").lower() != (host_header or "").strip().lower():
        return f"a request from {source!r} may not change this UI's state (only the UI's own page may)"
    return None


#: every answer may be framed by the UI's own pages only: a page elsewhere that framed it (Locust sets no such header)
#: could have the operator click its buttons through a transparent frame
FRAMING = [("X-Frame-Options", "SAMEORIGIN"), ("Content-Security-Policy", "frame-ancestors 'self'")]


class GateMiddleware:
    """WSGI: the Host and origin checks before Flask routes anything, no CORS header in any answer, and no answer
    framed by another site's page."""

    def __init__(self, app: Callable, names: frozenset[str]) -> None:
        self.app, self.names = app, names

    def __call__(self, environ: dict, start_response: Callable) -> Any:
        why = refusal(environ.get("REQUEST_METHOD", "GET").upper(), environ.get("HTTP_HOST", ""),
                      environ.get("HTTP_ORIGIN"), environ.get("HTTP_REFERER"), environ.get("HTTP_SEC_FETCH_SITE"),
                      self.names)
        if why is not None:  # said on the console too: the operator learns that a page tried
            log.warning("vllm-load: the web UI refused %s %s: %s", environ.get("REQUEST_METHOD"),
                        environ.get("PATH_INFO"), why)
            body = f"vllm-load: refused: {why}\n".encode()
            start_response("403 Forbidden", [("Content-Type", "text/plain; charset=utf-8"),
                                              ("Content-Length", str(len(body))), *FRAMING])
            return [body]

        def no_cors(status: str, headers: list, exc_info: Any = None) -> Any:
            kept = [(k, v) for k, v in headers if not k.lower().startswith("access-control-")
                    and k.lower() not in ("x-frame-options", "content-security-policy")] + FRAMING
            return start_response(status, kept, exc_info) if exc_info else start_response(status, kept)

        return self.app(environ, no_cors)


def _convert(current: Any, value: str) -> Any:
    """A form value as Locust applies it (the parsed option's type), or ValueError."""
    if isinstance(current, bool):
        if value not in ("true", "false"):
            raise ValueError(value)
        return value == "true"
    if current is None or isinstance(current, str):
        return value
    if isinstance(current, (int, float)):
        return type(current)(value)
    raise ValueError(value)


def screen_swarm(form: dict[str, list[str]], shown: set[str], opts: Any, environment: Any,
                 check: Callable[[Any], None]) -> str | None:
    """Why a ``/swarm`` form is refused (None: Locust may apply it): a field the form does not show, a field
    given twice, or values the command line would refuse (``check`` runs on a copy with them applied)."""
    for key, values in form.items():
        if key not in shown and key not in LOCUST_FORM_FIELDS:
            return f"the form has no field {key!r}: set it on the command line"
        if len(values) > 1 and key not in _MULTIPLE:
            return f"the field {key!r} was given {len(values)} times: give it once"
    if "host" in form and not form["host"][0].strip():  # Locust took it, and the target check failed on it
        return ("Host is empty: give the server's URL, e.g. http://127.0.0.1:8000"
                + (f" (it was {public_url(environment.host)})" if environment.host else ""))
    trial = copy.copy(opts) if opts is not None else argparse.Namespace()
    for key, values in form.items():
        if key in LOCUST_FORM_FIELDS or not hasattr(trial, key):
            continue
        current = getattr(trial, key)
        if isinstance(current, list):
            continue
        try:
            setattr(trial, key, _convert(current, values[0]))
        except ValueError:
            return f"{key} {values[0]!r} is not a {type(current).__name__}"
    for key, kind in (("user_count", int), ("spawn_rate", float)):
        if key in form:
            try:
                number = kind(form[key][0])
            except ValueError:
                return f"{key} {form[key][0]!r} is not a number"
            if not math.isfinite(number) or number < 0 or (key == "spawn_rate" and number == 0):
                return f"{key} {form[key][0]!r} is out of range"
            if key == "user_count":
                trial.num_users = number
    shim = argparse.Namespace(parsed_options=trial, host=(form.get("host") or [environment.host or ""])[0],
                              shape_class=environment.shape_class, user_classes=environment.user_classes)
    try:
        check(shim)
    except UsageError as exc:
        return str(exc)
    return None


#: what Locust's user-class editor sends to ``/user`` (its UI's EditUserForm), each kept to the type it means; every
#: other key Locust's ``update_user_class`` would set on the class as given (``wait_time="boom"``: three tracebacks
#: and a run of 0 requests)
_USER_FIELDS = {"user_class_name": str, "host": str, "weight": int, "fixed_count": int, "tasks": list}
#: the most users a class's fixed count or weight may say, and the most bytes a ``/user`` body may carry
MAX_USER_COUNT, MAX_USER_BODY = 1_000_000, 64 * 1024


def _too_big(size: int) -> str | None:
    return f"a user class edit of {size // 1024} KB: at most {MAX_USER_BODY // 1024} KB" if size > MAX_USER_BODY else None


def screen_user(body: bytes, classes: dict[str, Any] | None) -> str | None:
    """Why a ``/user`` edit is refused (None: Locust may apply it): not Locust's editor's JSON object, a key it does
    not send, a class the run does not offer, a count that is no whole number in range, a host that is no URL."""
    if (big := _too_big(len(body))) is not None:
        return big
    try:
        settings = json.loads(body)
    except ValueError:
        return "a user class edit is a JSON object (Locust's user class editor sends one)"
    if not isinstance(settings, dict):
        return "a user class edit is a JSON object (Locust's user class editor sends one)"
    for key, value in settings.items():
        kind = _USER_FIELDS.get(key)
        if kind is None:
            return f"a user class edit sets {', '.join(_USER_FIELDS)} only, not {str(key)[:40]!r}"
        if not isinstance(value, kind) or isinstance(value, bool):
            return f"a user class edit's {key} is a {kind.__name__}, not {type(value).__name__}"
    if settings.get("user_class_name") not in (classes or {}):
        return f"no user class {str(settings.get('user_class_name'))[:60]!r} in this run (--class-picker offers its own)"
    for key in ("weight", "fixed_count"):
        if key in settings and not 0 <= settings[key] <= MAX_USER_COUNT:
            return f"a user class's {key} {settings[key]} is out of range: 0 to {MAX_USER_COUNT:,}"
    if not all(isinstance(t, str) for t in settings.get("tasks", [])):
        return "a user class's tasks are their names"
    if settings.get("host"):
        from vllm_load.plugin.prepare.validate import check_host

        try:
            check_host(settings["host"])
        except UsageError as exc:
            return str(exc)
    return None


def _user_refused(request: Any, environment: Any) -> Any:
    """Flask's answer refusing a ``/user`` edit (said on the console too), or None: Locust may apply it."""
    from flask import jsonify

    # its declared size first: a body past the bound is not read
    why = _too_big(request.content_length or 0) or screen_user(request.get_data(cache=True),
                                                              environment.available_user_classes)
    if why is None:
        return None
    log.warning("vllm-load: the web UI refused a user class edit: %s", why)
    return jsonify({"success": False, "message": f"vllm-load: {why}"}), 400


def login_password(opts: Any, private_file: Callable[[str, str], Any]) -> tuple[str, str]:
    """The --web-login password and where it came from: $VLLM_LOAD_WEB_PASSWORD, --web-password-file, or one made
    for this run and written to a file only this user can read (said by path, never printed)."""
    given = os.environ.get(PASSWORD_ENV, "")
    if given:
        return given, f"${PASSWORD_ENV}"
    path = getattr(opts, "web_password_file", "")
    if path:
        return read_secret_file(path, "--web-password-file", "password"), f"--web-password-file {path}"
    word = secrets.token_urlsafe(18)
    made = private_file("web-password", ".txt")
    made.write_text(word + "\n", encoding="utf-8")
    return word, f"{made} (made for this run; set ${PASSWORD_ENV} or --web-password-file to choose it)"


def install(environment: Any, names: frozenset[str], check: Callable[[Any], None], password: str = "") -> None:
    """The gate in front of this process's web UI (call before any other plugin hook is registered)."""
    web_ui = environment.web_ui
    app = web_ui.app
    app.wsgi_app = GateMiddleware(app.wsgi_app, names)
    from flask import jsonify, redirect, request

    login = bool(password)
    if login:
        _install_login(web_ui, password)

    def gate() -> Any:
        if login and not request.path.startswith(_OPEN_PATHS):
            from flask_login import current_user

            if not current_user.is_authenticated:
                if request.method in _SAFE_METHODS:
                    return redirect("/login")
                return jsonify({"success": False, "message": "vllm-load: log in first"}), 401
        if request.method == "POST" and request.path.rstrip("/").endswith("/swarm"):
            shown = set((web_ui.template_args.get("extra_options") or {}).keys())
            why = screen_swarm(request.form.to_dict(flat=False), shown, environment.parsed_options, environment,
                               check)
            if why:
                return jsonify({"success": False, "message": f"vllm-load: {why}", "host": environment.host})
        if request.method == "POST" and request.path.rstrip("/").endswith("/user"):
            return _user_refused(request, environment)
        return None

    # first of all the app's hooks: the plugin's own (the secret guard, the target check) come after it
    app.before_request_funcs.setdefault(None, []).insert(0, gate)


class _Operator:
    """The one account of a --web-login UI (flask-login's user protocol)."""

    is_authenticated = is_active = True
    is_anonymous = False

    def get_id(self) -> str:
        return "operator"


#: failed logins (from anywhere) within LOGIN_WINDOW_S that close the form until the oldest ages out: a made
#: password has 144 bits, a chosen one may not, and nothing slowed a guesser down nor said one was there
LOGIN_FAILURES, LOGIN_WINDOW_S = 5, 60.0


def _install_login(web_ui: Any, password: str) -> None:
    """--web-login out of the box: a session key made for this run, a password form, the password checked in
    constant time."""
    from flask import redirect, request, session
    from flask_login import login_user

    app = web_ui.app
    app.secret_key = secrets.token_bytes(32)
    app.config.update(SESSION_COOKIE_HTTPONLY=True, SESSION_COOKIE_SAMESITE="Strict")
    web_ui.login_manager.user_loader(lambda uid: _Operator() if uid == "operator" else None)
    web_ui.auth_args = {"username_password_callback": "/login_submit",
                        "info": "vllm-load: any user name; the password vllm-load printed the source of"}
    expected = password.encode()
    failed: deque[float] = deque()

    @app.route("/login_submit", methods=["POST"])
    def _login_submit() -> Any:
        now = time.monotonic()
        while failed and now - failed[0] > LOGIN_WINDOW_S:
            failed.popleft()
        if len(failed) >= LOGIN_FAILURES:  # closed, the right password too: a guesser learns nothing meanwhile
            wait = LOGIN_WINDOW_S - (now - failed[0])
            return f"too many failed logins: try again in {wait:.0f} s", 429, {"Retry-After": f"{wait:.0f}"}
        given = (request.form.get("password") or "").encode()
        if hmac.compare_digest(given, expected):
            login_user(_Operator())
            return redirect("/")
        failed.append(now)
        log.warning("vllm-load: web UI: a failed login from %s (%d in the last %.0f s; %d close the form for a while)",
                    request.remote_addr, len(failed), LOGIN_WINDOW_S, LOGIN_FAILURES)
        session["auth_error"] = "wrong password"
        return redirect("/login")
