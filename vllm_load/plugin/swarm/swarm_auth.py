"""An authenticated swarm: ZeroMQ's own CURVE security on Locust's master and worker sockets, keyed by a token.

Why: loopback has no authentication, and Locust's master takes any process that connects to its port as a worker.
One that did sent a forged report (another run's LLM stats: "requests 4225 … exit 0" for 27 sent) and a fatal
message whose code became the run's exit code. With a token every byte on the port is CURVE-encrypted and
authenticated: a peer without it never completes the handshake, so none of its messages (Locust's own among them:
``client_ready``, ``stats``, heartbeats) reaches the master, and the master names each connection it refused.

How the token makes the keys: the master's CURVE secret key is SHA-256 of the token (its public key follows from
it); a worker derives the same public key and connects with a fresh key pair of its own. CURVE needs the server's
public key to say even hello, so a peer without the token cannot talk to the master. The token comes from
``--swarm-token-file`` (or ``VLLM_LOAD_SWARM_TOKEN``); a ``--processes`` master makes one of its own before it forks
its workers, which inherit it, so Locust's local swarm is authenticated with nothing to set. Locust's sockets are
made in ``zmqrpc.BaseSocket`` (a master remakes its server on a reset), which is wrapped here (locust<2.50,
setup.cfg)."""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
from pathlib import Path
from typing import Any

import gevent
import zmq
import zmq.utils.z85

from vllm_load.errors import die
from vllm_load.redact import printable

#: the token's variable, beside the option's file
TOKEN_ENV = "VLLM_LOAD_SWARM_TOKEN"
#: a token file is a few bytes; a larger one is not a token
MAX_TOKEN_BYTES = 4096
_KEY_CONTEXT = b"vllm-load swarm CURVE server key v1\0"


class _Keys:
    """This process's swarm keys (none: Locust's plain sockets) and where its token came from."""

    server_secret: bytes | None = None
    server_public: bytes | None = None
    source = ""


KEYS = _Keys()


def read_token(options: Any) -> tuple[bytes | None, str]:
    """The swarm's token and where it came from (``--swarm-token-file``, then ``VLLM_LOAD_SWARM_TOKEN``); a
    file that cannot be read, is empty or too large is one line and exit 2."""
    path = str(getattr(options, "swarm_token_file", "") or "")
    if path:
        try:
            with open(path, "rb") as fh:
                data = fh.read(MAX_TOKEN_BYTES + 1)
        except OSError as exc:
            die(f"--swarm-token-file {path}: cannot read it ({exc.strerror or exc})")
        token = data.strip()
        if not token or len(data) > MAX_TOKEN_BYTES:
            die(f"--swarm-token-file {path}: " + ("it is empty" if not token else
                                                   f"over {MAX_TOKEN_BYTES} bytes: not a token"))
        return token, f"--swarm-token-file {Path(path).name}"
    env = os.environ.get(TOKEN_ENV, "").strip()
    if env:
        return env.encode(), TOKEN_ENV
    return None, ""


def settle(options: Any) -> None:
    """Right after Locust parses the options, before any runner binds or connects and before ``--processes``
    forks: this process's keys, from the token or (a ``--processes`` master) one of its own."""
    token, source = read_token(options)
    if token is None and getattr(options, "workers_of_this_master", False):
        token, source = secrets.token_bytes(32), "its own, shared with the workers it forked (--processes)"
    if token is None:
        KEYS.server_secret = KEYS.server_public = None
        KEYS.source = ""
        return
    secret = zmq.utils.z85.encode(hashlib.sha256(_KEY_CONTEXT + token).digest())
    KEYS.server_secret, KEYS.server_public, KEYS.source = secret, zmq.curve_public(secret), source
    _wrap_sockets()


def authenticated() -> bool:
    return KEYS.server_secret is not None


def _wrap_sockets() -> None:
    from locust.rpc import zmqrpc

    base = zmqrpc.BaseSocket
    if getattr(base.__init__, "_vllm_load_curve", False):
        return
    made = base.__init__

    def __init__(self: Any, sock_type: int, ipv4_only: bool) -> None:
        made(self, sock_type, ipv4_only)
        if KEYS.server_secret is None:
            return
        if sock_type == zmq.ROUTER:  # the master's: it proves the token by knowing the secret key
            self.socket.curve_server = True
            self.socket.curve_secretkey = KEYS.server_secret
        else:  # a worker's: it knows the master's public key only through the token
            public, own_secret = zmq.curve_keypair()
            self.socket.curve_serverkey = KEYS.server_public
            self.socket.curve_publickey, self.socket.curve_secretkey = public, own_secret

    __init__._vllm_load_curve = True  # type: ignore[attr-defined]
    base.__init__ = __init__  # type: ignore[method-assign]


def open_line(port: int) -> str:
    """What a master says of its port once, at start-up."""
    if authenticated():
        return (f"vllm-load: the master's port {port} takes only workers that hold the swarm token ({KEYS.source}; "
                "ZeroMQ CURVE: every message authenticated and encrypted)")
    return (f"vllm-load: note: the master's port {port} takes any process that connects as a worker, a local one "
            f"included: give master and workers --swarm-token-file FILE (or {TOKEN_ENV}) to require a token")


#: the ZeroMQ monitor events of a refused peer: its handshake failed
_FAILED = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL


def watch_refusals(runner: Any, say: Any = None) -> gevent.Greenlet | None:
    """A master with a token names every connection it refused (its peer's address, when it was seen accepted),
    on the console, for as long as the process runs; None without a token."""
    if not authenticated():
        return None
    say = say or (lambda line: print(line, flush=True))
    monitor = runner.server.socket.get_monitor_socket(zmq.EVENT_ACCEPTED | _FAILED)
    return gevent.spawn(_watch, monitor, say)


def _watch(monitor: Any, say: Any) -> None:
    from zmq.utils.monitor import recv_monitor_message

    peers: dict[int, str] = {}  # an accepted connection's descriptor -> its peer, until its handshake ends
    refused = 0
    while True:
        try:
            event = recv_monitor_message(monitor)
        except zmq.ZMQError:
            return
        if event["event"] == zmq.EVENT_ACCEPTED:
            peers[int(event["value"])] = _peer(int(event["value"]))
            continue
        refused += 1
        peer = peers.popitem()[1] if peers else "a peer"
        if refused <= 3 or _said_at(refused):  # a peer's ZeroMQ reconnects every few 100 ms: not a line each
            say(f"vllm-load: refused {printable(peer)} on the master's port: it did not prove the swarm token "
                f"(its handshake failed; {refused} refused so far); none of its messages reached the run")


def _said_at(n: int) -> bool:
    """10, 100, 1000, …: when a refusal past the first three is said."""
    return n >= 10 and str(n).rstrip("0") == "1"


def _peer(fd: int) -> str:
    """The peer of ZeroMQ's accepted connection ``fd`` (a duplicate is read and closed: ZeroMQ keeps its own)."""
    try:
        with socket.socket(fileno=os.dup(fd)) as s:
            host, port = s.getpeername()[:2]
            return f"{host}:{port}"
    except OSError:
        return "a peer"


def worker_line() -> str | None:
    """A worker with a token says so once (nothing without)."""
    if not authenticated():
        return None
    return f"vllm-load: this worker proves the swarm token ({KEYS.source}) to its master"
