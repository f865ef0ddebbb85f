"""A scripted HTTP/1.1 server for the stream readers' tests: it answers each request with a fixed
sequence of byte pieces, each written separately (``--gap`` apart, so each is its own TCP segment),
and says on stdout how many connections and requests it served.

    python tests/scripted_http.py SCENARIO [--gap 0.01]

It listens on 127.0.0.1 on a free port and prints ``port N`` first.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import threading
import time

TOKENS = 5


def events(body_metrics: bool = False, absurd: bool = False) -> list[bytes]:
    """The stream's events; with ``body_metrics`` its usage event also carries vLLM's per-request ``metrics``,
    which the native thread's parser leaves to Python (with the [DONE] after it); ``absurd``: usage counts no server
    could mean (10^30 prompt tokens, a negative answer, a string of cached tokens)."""
    out = []
    for i in range(TOKENS):
        chunk = {"id": "cmpl-scripted", "object": "text_completion", "model": "m",
                 "choices": [{"index": 0, "text": f" t{i}", "finish_reason": "length" if i == TOKENS - 1 else None}],
                 "usage": {"prompt_tokens": 8, "completion_tokens": i + 1, "total_tokens": 9 + i}}
        out.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    usage = {"id": "cmpl-scripted", "choices": [],
             "usage": {"prompt_tokens": 8, "completion_tokens": TOKENS, "total_tokens": 8 + TOKENS}}
    if absurd:
        usage["usage"] = {"prompt_tokens": 10 ** 30, "completion_tokens": -3, "total_tokens": 1e308,
                          "prompt_tokens_details": {"cached_tokens": "many"}}
    if body_metrics:
        usage["metrics"] = {"queue_time_ms": 0.1, "time_to_first_token_ms": 10.0, "generation_time_ms": 40.0}
    out.append(b"data: " + json.dumps(usage).encode() + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return out


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


HEAD_CHUNKED = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def scenario(name: str) -> tuple[list[bytes], str]:
    """The pieces of one answer, and how the connection ends after it: keep, close or reset."""
    ev = events(body_metrics=name == "metrics", absurd=name == "absurd")
    if name in ("chunked", "metrics", "absurd"):  # the usual shape: headers alone, one chunk per event, the last chunk alone
        return [HEAD_CHUNKED, *map(chunk, ev), b"0\r\n\r\n"], "keep"
    if name == "split":  # headers with the first event; chunk sizes, lines and CRLFs cut across pieces
        body = b"".join(chunk(e) for e in ev) + b"0\r\n\r\n"
        first = HEAD_CHUNKED + body[:20]
        rest = body[20:]
        cuts = [3, 50, 51, 52, 200, 201, 333, 500, len(rest) - 3, len(rest) - 1]
        pieces, at = [first], 0
        for c in sorted(set(c for c in cuts if 0 < c < len(rest))):
            pieces.append(rest[at:c])
            at = c
        pieces.append(rest[at:])
        return pieces, "keep"
    if name == "length":
        body = b"".join(ev)
        return [b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n" % len(body),
                *ev], "keep"
    if name == "close":  # no length, no chunking: the body ends when the server closes
        return [b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n", *ev], "close"
    if name == "cut":  # closed after two events, mid-body
        return [HEAD_CHUNKED, *map(chunk, ev[:2])], "close"
    if name == "reset":
        return [HEAD_CHUNKED, *map(chunk, ev[:2])], "reset"
    if name == "malformed":
        return [HEAD_CHUNKED, chunk(ev[0]), b"zz\r\n" + ev[1] + b"\r\n"], "keep"
    if name == "headcut":  # the header block's blank line cut across two segments, the body right after it
        return [HEAD_CHUNKED[:-2], HEAD_CHUNKED[-2:] + chunk(ev[0]), *map(chunk, ev[1:]), b"0\r\n\r\n"], "keep"
    if name == "error":  # a refusal: its JSON body has no final newline
        err = b'{"error": {"message": "slow down", "type": "rate_limit"}}'
        return [b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 2\r\n"
                b"transfer-encoding: chunked\r\n\r\n", chunk(err[:20]), chunk(err[20:]) + b"0\r\n\r\n"], "keep"
    if name == "idle":  # a keep-alive answer, then the server closes the idle connection (its keep-alive timeout)
        return [HEAD_CHUNKED, *map(chunk, ev), b"0\r\n\r\n"], "idle"
    if name == "stall":  # two events, then nothing
        return [HEAD_CHUNKED, *map(chunk, ev[:2])], "stall"
    raise SystemExit(f"unknown scenario {name!r}")


def read_request(conn: socket.socket, buf: bytes) -> tuple[bool, bytes]:
    while b"\r\n\r\n" not in buf:
        data = conn.recv(65536)
        if not data:
            return False, b""
        buf += data
    head, rest = buf.split(b"\r\n\r\n", 1)
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    while len(rest) < length:
        data = conn.recv(65536)
        if not data:
            return False, b""
        rest += data
    return True, rest[length:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario")
    ap.add_argument("--gap", type=float, default=0.01)
    args = ap.parse_args()
    pieces, end = scenario(args.scenario)
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    print(f"port {srv.getsockname()[1]}", flush=True)
    lock = threading.Lock()

    def serve(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        while True:
            ok, buf = read_request(conn, buf)
            if not ok:
                break
            with lock:
                print("request", flush=True)
            for piece in pieces:
                conn.sendall(piece)
                time.sleep(args.gap)
            if end == "reset":
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                break
            if end in ("close", "idle"):
                break
            if end == "stall":
                time.sleep(30)
                break
        conn.close()

    while True:
        conn, _ = srv.accept()
        with lock:
            print("connection", flush=True)
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    main()
