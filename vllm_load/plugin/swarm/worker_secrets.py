"""Secrets stay in the process that was given them.

Locust copies the master's parsed options into every spawn message, in clear, to whatever joined its port: any
process that connected as a worker received ``--api-key``, ``--sidecar-token`` and credential ``--header`` values.
Here the master's spawn messages carry no secret option and no credential header; each process reads its own
(``--api-key``, ``--api-key-file``, ``VLLM_LOAD_API_KEY``/``OPENAI_API_KEY``, ``--header``), and a worker puts its own
credential headers back beside the master's others. A ``--processes`` worker is a fork of the master: it has them.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from vllm_load.client.apis.openai_api import is_credential_header
from vllm_load.errors import UsageError
from vllm_load.redact import add_secret

#: options never sent to a worker, written, logged or shown
SECRET_OPTIONS = ("api_key", "sidecar_token", "prometheus_token", "otlp_token")
#: where a master says how a remote worker gets the key
WORKER_KEY_HINT = "give each worker --api-key-file, VLLM_LOAD_API_KEY or OPENAI_API_KEY (the master sends no secret)"


#: options only the master acts on, never sent to a worker: a fault command may hold a credential (--token=…)
MASTER_ONLY = ("fault", "fault_plan")


def credential_headers(headers: list[str] | None) -> list[str]:
    return [h for h in headers or [] if is_credential_header(str(h).partition(":")[0])]


def scrub(options: dict) -> dict:
    """A spawn message's options without secrets: the secret options left out, credential headers removed."""
    out = {k: v for k, v in options.items() if k not in SECRET_OPTIONS and k not in MASTER_ONLY}
    if out.get("header"):
        out["header"] = [h for h in out["header"] if h not in credential_headers(out["header"])]
    return out


def guard_spawn_messages() -> None:
    """A master's spawn messages leave without secrets (Locust builds them from ``vars(parsed_options)``; its rpc
    server is the one place every message to a worker passes, and it is remade on a reset, so its class is
    wrapped; locust<2.50, setup.cfg)."""
    from locust.rpc.zmqrpc import Server

    if getattr(Server.send_to_client, "_vllm_load_scrubbed", False):
        return
    send = Server.send_to_client

    def send_to_client(self: Any, msg: Any) -> Any:
        if msg.type == "spawn" and isinstance(msg.data, dict) and isinstance(msg.data.get("parsed_options"), dict):
            msg.data = {**msg.data, "parsed_options": scrub(msg.data["parsed_options"])}
        return send(self, msg)

    send_to_client._vllm_load_scrubbed = True  # type: ignore[attr-defined]
    Server.send_to_client = send_to_client  # type: ignore[method-assign]


def read_key_file(opts: Any) -> None:
    """--api-key-file: the key, read by this process from its own file (it wins over --api-key and the
    environment); one line and exit 2 when it cannot be read. The key read is masked in all the process writes and
    prints, as the secrets it was given are since its options were parsed (``register``)."""
    path = getattr(opts, "api_key_file", "")
    if path:
        opts.api_key = read_secret_file(path, "--api-key-file", "key")
        add_secret(opts.api_key)


def register(opts: Any) -> None:
    """The process's secrets (the key, the tokens, credential headers' values, with and without their scheme word)
    masked wherever they would be written or printed, whoever echoed them (``redact.add_secret``)."""
    for name in SECRET_OPTIONS:
        add_secret(str(getattr(opts, name, "") or ""))
    for header in credential_headers(getattr(opts, "header", None)):
        value = str(header).partition(":")[2].strip()
        add_secret(value)
        add_secret(value.partition(" ")[2].strip())  # "Bearer sk-…": the token alone too
    for var in SECRET_ENV:
        add_secret(os.environ.get(var, ""))


#: variables that hold a secret of this process (a fault command does not inherit them: ``fault_env``)
SECRET_ENV = ("VLLM_LOAD_API_KEY", "OPENAI_API_KEY", "VLLM_LOAD_SIDECAR_TOKEN", "VLLM_LOAD_PROMETHEUS_TOKEN",
              "VLLM_LOAD_OTLP_TOKEN", "VLLM_LOAD_SWARM_TOKEN")


def fault_env() -> dict[str, str]:
    """A fault command's environment: this process's, less its secrets (a command given the key must be given it
    by the plan itself)."""
    return {k: v for k, v in os.environ.items() if k not in SECRET_ENV}


class MaskedNamespace(argparse.Namespace):
    """Locust's parsed options, whose ``repr`` shows no secret: gevent prints a greenlet that raised with its
    arguments (``Generator(opts=Namespace(… api_key='sk-…'))``), in clear, on the console and the CI log."""

    def __repr__(self) -> str:
        shown = {k: ("***" if k in SECRET_OPTIONS and v else
                     [h if h not in credential_headers(v) else h.partition(":")[0] + ": ***" for h in v]
                     if k == "header" and isinstance(v, list) else v) for k, v in vars(self).items()}
        return f"Namespace({', '.join(f'{k}={v!r}' for k, v in shown.items())})"


def mask_repr(options: Any) -> None:
    """``options`` (argparse's or configargparse's Namespace) with ``MaskedNamespace``'s repr, its values as they
    were (its class swapped for a subclass of its own and ``MaskedNamespace``)."""
    if isinstance(options, MaskedNamespace) or not isinstance(options, argparse.Namespace):
        return
    options.__class__ = MaskedNamespace if type(options) is argparse.Namespace else type(
        "Namespace", (MaskedNamespace, type(options)), {})


#: the most a secret file may hold: a key, token or password is at most a few KB (``--api-key-file /dev/zero`` was
#: read until the kernel killed the process at 23.9 GB)
SECRET_MAX = 64 * 1024


def read_secret_file(path: str, option: str, what: str) -> str:
    """A secret kept in a file (its surrounding white space dropped); one line when it cannot be read, is empty, or
    is larger than a secret is (``SECRET_MAX``)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(SECRET_MAX + 1)
        secret = raw.decode("utf-8").strip()
    except OSError as exc:
        raise UsageError(f"{option} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{option} {path} is not text: write the {what} in it") from None
    if len(raw) > SECRET_MAX:
        raise UsageError(f"{option} {path} holds more than {SECRET_MAX // 1024} KB: a {what} is shorter (is it the "
                         f"right file?)")
    if not secret:
        raise UsageError(f"{option} {path} is empty: write the {what} in it")
    return secret


class OwnHeaders:
    """A worker's own credential headers, kept from start-up: a spawn message (which carries none) replaces the
    parsed ``--header`` list, and these are put back beside the master's other headers."""

    def __init__(self, opts: Any) -> None:
        self.kept = credential_headers(getattr(opts, "header", None))

    def restore(self, opts: Any) -> None:
        now = list(getattr(opts, "header", None) or [])
        opts.header = now + [h for h in self.kept if h not in now]
