"""The emulator's HTTP layer: vLLM's error shape, the WSGI replies and request bodies, and the gevent server it runs
on (no Nagle delay; optionally each request's kernel arrival stamp for the timing log)."""

from __future__ import annotations

import socket
from typing import Any, Callable

import orjson
from gevent.pywsgi import WSGIHandler, WSGIServer

from vllm_load.client import rxstamp
from vllm_load.client.apis.openai_api import is_credential_header

Start = Callable[[str, list], Any]

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}


class HttpError(Exception):
    def __init__(self, status: int, message: str, err_type: str, param: str | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.err_type, self.param = status, message, err_type, param
        self.retry_after = retry_after  # seconds, sent as Retry-After (429/503 overload faults)

    def body(self) -> bytes:
        # vLLM >= 0.10.1 error shape
        return orjson.dumps({"error": {"message": self.message, "type": self.err_type, "param": self.param,
                                       "code": self.status}})


class DropConnection(Exception):
    """Raised inside a streaming body: the server closes the connection without ending the stream."""


def reply(start_response: Start, status: int, body: bytes, ctype: str = "application/json",
          extra: list[tuple[str, str]] | None = None) -> list[bytes]:
    start_response(f"{status} {_REASONS.get(status, 'Error')}",
                   [("Content-Type", ctype), ("Content-Length", str(len(body))), *(extra or [])])
    return [body]


def error_reply(start_response: Start, exc: HttpError) -> list[bytes]:
    extra = [("Retry-After", f"{exc.retry_after:g}")] if exc.retry_after is not None else []
    return reply(start_response, exc.status, exc.body(), extra=extra)


def json_body(environ: dict) -> dict:
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        data = orjson.loads(environ["wsgi.input"].read(length))
    except (ValueError, orjson.JSONDecodeError):
        raise HttpError(400, "request body is not valid JSON", "BadRequestError") from None
    if not isinstance(data, dict):
        raise HttpError(400, "request body must be a JSON object", "BadRequestError")
    return data


def post_body(environ: dict) -> dict:
    """A route that takes POST only: its JSON body (405 for another method, as vLLM answers)."""
    if environ.get("REQUEST_METHOD", "GET") != "POST":
        raise HttpError(405, "Method Not Allowed", "BadRequestError")
    return json_body(environ)


def loggable_headers(environ: dict) -> dict[str, str]:
    """The request's headers for the request log: credential-like values are never written (the name is)."""
    out = {}
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            name = key[5:].replace("_", "-").title()
            out[name] = "***" if is_credential_header(name) else str(value)
    return out


class ArrivalStampingHandler(WSGIHandler):
    """Peeks at each request's first packet for the kernel's receive stamp (``emulator.rx_wall`` in
    the environ): the timing log's truth starts when a request reached the server, not when the
    server's loop got round to it. One extra syscall per request, so only with ``--timing-log``.
    Assumes no pipelining (a client sends its next request after the response), as HTTP clients do."""

    rx_wall: float | None = None

    def read_requestline(self) -> str:
        try:
            _byte, ancdata, _flags, _addr = self.socket.recvmsg(1, rxstamp.ANCBUF, socket.MSG_PEEK)
            self.rx_wall = rxstamp.stamp_of(ancdata)
        except OSError:
            self.rx_wall = None
        return super().read_requestline()

    def get_environ(self) -> dict:
        environ = super().get_environ()
        environ["emulator.rx_wall"] = self.rx_wall
        return environ


class NoDelayWSGIServer(WSGIServer):
    """Streams small SSE chunks without Nagle's delay (uvicorn, vLLM's server, sets TCP_NODELAY too). Its open
    connections are kept, so that a stop ends them as a dying server's would (gevent's own stop leaves every
    keep-alive connection served: an emulator stopped inside a test's process went on answering its clients)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.connections: set[socket.socket] = set()

    def handle(self, sock: socket.socket, address: Any) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.connections.add(sock)
        try:
            super().handle(sock, address)
        finally:
            self.connections.discard(sock)

    def stop(self, timeout: float | None = None) -> None:
        """Stop listening and cut every open connection (a stream mid-way ends as a killed server's does)."""
        self.close()
        for sock in list(self.connections):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        super().stop(timeout=timeout)
