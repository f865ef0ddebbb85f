"""What the live server side holds while a run goes on: the sidecar's samples (one a second) as the web UI and the
saturation watch read them, kept whole (before) and as numbers with the first and latest whole (now).

    .venv/bin/python benchmarks/live_server_memory.py [--minutes 10,60]

A real emulator and sidecar give one sample (vLLM 0.32's series, its histograms included); it is copied as a run
of that many minutes would bring it, into ``LiveServer.take`` and into a plain list, and the heap they hold is
measured (tracemalloc).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import tracemalloc

from _harness import ENV, start_emulator

from vllm_load.plugin.sources.server_side import LiveServer, fetch_samples


def one_sample() -> dict:
    emu, url = start_emulator()
    out = tempfile.mkdtemp(prefix="vllm-load-live-mem-")
    side = subprocess.Popen([sys.executable, "-m", "server.sidecar", "--vllm-url", url, "--listen", "127.0.0.1:0",
                             "--interval", "1s", "--out", f"{out}/series.jsonl"], stdout=subprocess.PIPE, env=ENV,
                            text=True)
    try:
        sidecar = side.stdout.readline().split("listening on ", 1)[1].split()[0]
        deadline = time.time() + 30
        while time.time() < deadline:
            samples, _ = fetch_samples(sidecar, 0, time.time() + 1)
            if len(samples) >= 2:
                return samples[-1]
            time.sleep(0.5)
        raise SystemExit("the sidecar gave no sample in 30 s")
    finally:
        side.kill()
        emu.kill()


def held(make) -> float:
    """MB of heap ``make()`` leaves held."""
    tracemalloc.start()
    kept = make()
    size = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del kept
    return size / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", default="10,60")
    args = ap.parse_args()
    text = json.dumps(one_sample())

    def copies(n: int) -> list[dict]:
        return [{**json.loads(text), "t": float(i)} for i in range(n)]

    def live(n: int) -> LiveServer:
        server = LiveServer(lambda since, until: ([], None), start=-1.0, interval=3600)
        server.stop()
        for i in range(0, n, 60):  # a minute's samples at a time, as polls bring them
            server.take(copies(min(60, n - i)))
        return server

    print(f"one sample: {len(text)} bytes of JSON, {len(json.loads(text))} fields")
    print("| run | samples | whole (MB, before) | numbers, edges whole (MB, now) |")
    print("|---:|---:|---:|---:|")
    for minutes in (int(m) for m in args.minutes.split(",")):
        n = minutes * 60
        print(f"| {minutes} min | {n:,} | {held(lambda: copies(n)):.1f} | {held(lambda: live(n)):.2f} |")


if __name__ == "__main__":
    main()
