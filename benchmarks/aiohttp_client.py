"""The reference client of the side-by-side: asyncio + aiohttp, written the way vLLM's serving
benchmark writes its request function (``vllm/benchmarks/lib/endpoint_request_func.py``): one
``aiohttp.ClientSession``, ``response.content.iter_any()``, SSE messages split on blank lines,
``json.loads`` per message, ``time.perf_counter()`` per token-bearing message, a closed loop of
``--concurrency`` tasks (``vllm bench serve --max-concurrency``).

    python benchmarks/aiohttp_client.py http://127.0.0.1:8000 --concurrency 64 --seconds 20 \
        --output-tokens 64 --out requests.jsonl

It writes one JSON line per finished request (server id, wall-clock start, TTFT and the offset of
every token-bearing chunk), the same fields vllm-load's per-request log has, so that
``timing_accuracy.py`` scores both clients against the emulator's timing log the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import json
import time
from dataclasses import dataclass, field

import aiohttp


@dataclass
class Output:
    response_id: str | None = None
    start: float = 0.0  # wall clock
    ok: bool = False
    chunk_offsets: list[float] = field(default_factory=list)  # seconds after the request was sent
    error: str = ""
    e2e: float | None = None  # when the [DONE] came, seconds after the request was sent


class SseSplitter:
    """Accumulates bytes and returns complete ``data:`` messages (blank-line separated)."""

    def __init__(self) -> None:
        self.buffer = ""
        self.decoder = codecs.getincrementaldecoder("utf-8")()

    def add(self, data: bytes) -> list[str]:
        self.buffer += self.decoder.decode(data)
        out = []
        while "\n\n" in self.buffer:
            message, self.buffer = self.buffer.split("\n\n", 1)
            message = message.strip()
            if message:
                out.append(message)
        return out


async def one_request(session: aiohttp.ClientSession, url: str, model: str, prompt: str, output_tokens: int) -> Output:
    payload = {"model": model, "prompt": prompt, "max_tokens": output_tokens, "stream": True,
               "stream_options": {"include_usage": True}, "ignore_eos": True, "temperature": 0.0}
    out = Output(start=time.time())
    st = time.perf_counter()
    try:
        async with session.post(url, json=payload) as response:
            if response.status != 200:
                out.error = f"HTTP {response.status}"
                return out
            splitter = SseSplitter()
            async for chunk_bytes in response.content.iter_any():
                for message in splitter.add(chunk_bytes):
                    if message.startswith(":"):
                        continue
                    chunk = message.removeprefix("data: ")
                    if chunk == "[DONE]":
                        out.e2e = time.perf_counter() - st  # the stream's end, as vllm-load's E2E counts it
                        continue
                    data = json.loads(chunk)
                    if out.response_id is None:
                        out.response_id = data.get("id")
                    if data.get("choices"):
                        out.chunk_offsets.append(time.perf_counter() - st)
            out.ok = bool(out.chunk_offsets)
    except Exception as exc:  # the benchmark counts failures; it does not stop on them
        out.error = f"{type(exc).__name__}: {exc}"
    return out


async def run(url: str, model: str, concurrency: int, seconds: float, output_tokens: int) -> list[Output]:
    deadline = time.perf_counter() + seconds
    results: list[Output] = []
    connector = aiohttp.TCPConnector(limit=concurrency, keepalive_timeout=60, force_close=False)
    timeout = aiohttp.ClientTimeout(total=6 * 60 * 60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        async def loop(task: int) -> None:
            n = 0
            while time.perf_counter() < deadline:
                n += 1
                prompt = f"request {task} {n} " + "the quick brown fox jumps over the lazy dog " * 2
                results.append(await one_request(session, url + "/v1/completions", model, prompt, output_tokens))

        await asyncio.gather(*(loop(i) for i in range(concurrency)))
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("--model", default="emulator/mistral-7b-v0.1")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    results = asyncio.run(run(args.url.rstrip("/"), args.model, args.concurrency, args.seconds, args.output_tokens))
    with open(args.out, "w") as f:
        for r in results:
            f.write(json.dumps({"response_id": r.response_id, "start": r.start, "ok": r.ok, "error": r.error or None,
                                "ttft": r.chunk_offsets[0] if r.chunk_offsets else None,
                                "chunk_offsets": r.chunk_offsets, "e2e": r.e2e}) + "\n")


if __name__ == "__main__":
    main()
