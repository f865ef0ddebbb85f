"""Memory: a worker's RSS per 1,000 open streams, and the master's over a one-hour run.

    python benchmarks/memory.py [--streams 10,1000,2000] [--hours 1] [--tokens-per-s 10000]

Worker: one Locust process (headless, the same user code as a worker) holds N streams open against
the emulator (slow streams: 0.5 s per token, so every stream stays open); its RSS is read once the
emulator reports N running. The slope between levels is the cost of 1,000 streams.

Master: an hour at --tokens-per-s is replayed through the real code path at full speed: a worker's
LLMStats records each 3 s of requests (256-token streams), ``take_delta()`` is shipped through
msgpack like a Locust report, and the master ``merge``s it. RSS is printed every 10 simulated
minutes, with the window packing on (the product) and off (what it was before), each in a fresh
process.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time

import psutil
from _harness import ENV, ROOT, running, start_emulator


def worker_rss(streams: int) -> tuple[float, float]:
    """(RSS MB with ``streams`` open, seconds it took to open them)."""
    emu, url = start_emulator("--ttft", "0.1", "--itl", "0.5")
    try:
        run_dir = tempfile.mkdtemp(prefix="vllm-load-mem-")
        rate = max(1, streams // 4)
        loc = subprocess.Popen([sys.executable, "-m", "locust", "-f", "locustfiles/completions.py", "--headless",
                                "-u", str(streams), "-r", str(rate), "-t", "300s", "--host", url,
                                "--input-tokens", "64", "--output-tokens", "200", "--only-summary",
                                "--run-dir", run_dir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=ENV, cwd=ROOT)
        try:
            t0 = time.monotonic()
            while running(url) < streams:
                if loc.poll() is not None or time.monotonic() - t0 > 120:
                    raise RuntimeError(f"locust did not open {streams} streams")
                time.sleep(0.2)
            opened = time.monotonic() - t0
            time.sleep(3.0)  # every stream has read a few chunks
            return psutil.Process(loc.pid).memory_info().rss / 2**20, opened
        finally:
            loc.terminate()
            loc.wait(timeout=60)
    finally:
        emu.terminate()
        emu.wait(timeout=10)


def master_hour(hours: float, tokens_per_s: float, pack: bool) -> None:
    """Runs in a child process: prints 'minute RSS-MB live-histograms' lines."""
    import msgpack

    from vllm_load.metrics import stats as stats_mod
    from vllm_load.client.record import RequestRecord
    from vllm_load.metrics.stats import LLMStats

    if not pack:
        stats_mod.PACK_AFTER_S = 10**12
    rng = random.Random(1)
    out_tokens = 256
    report_s = 3.0
    per_report = tokens_per_s * report_s / out_tokens
    worker, master = LLMStats(), LLMStats()
    proc = psutil.Process()
    t = 1_800_000_000.0
    carry = 0.0
    reports = int(hours * 3600 / report_s)
    for i in range(reports + 1):
        if i % int(600 / report_s) == 0:
            live = sum(1 for ms in master.windows.values() for h in ms.values() if h.hdr is not None)
            print(f"{i * report_s / 60:.0f} {proc.memory_info().rss / 2**20:.1f} {live} {len(master.windows)}", flush=True)
        carry += per_report
        n, carry = int(carry), carry - int(carry)
        for _ in range(n):
            start = t + rng.random() * report_s
            itl = 0.02 + rng.random() * 0.01
            offs = [0.1 + k * itl + rng.random() * 1e-3 for k in range(out_tokens)]
            worker.add(RequestRecord(api="chat", start=start, e2e=offs[-1] + 0.001, ok=True, ttft=offs[0],
                                     chunk_offsets=offs, chunk_tokens=[1] * out_tokens, input_tokens=200,
                                     input_tokens_asked=200, output_tokens=out_tokens, tokens_from_usage=True))
        wire = msgpack.unpackb(msgpack.packb(worker.take_delta()))
        master.merge(LLMStats.from_wire(wire))
        t += report_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", default="10,1000,2000")
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--tokens-per-s", type=float, default=10000.0)
    ap.add_argument("--master-child", choices=["pack", "nopack"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.master_child:
        master_hour(args.hours, args.tokens_per_s, args.master_child == "pack")
        return
    levels = [int(s) for s in args.streams.split(",") if s]
    if levels:
        print("worker (one Locust process) RSS with N streams open")
        print(f"{'streams':>8}{'RSS MB':>9}{'open after s':>14}")
        rss = []
        for n in levels:
            mb, opened = worker_rss(n)
            rss.append((n, mb))
            print(f"{n:>8}{mb:>9.1f}{opened:>14.1f}", flush=True)
        (n0, m0), (n1, m1) = rss[0], rss[-1]
        if n1 > n0:
            print(f"=> {1000 * (m1 - m0) / (n1 - n0):.1f} MB per 1,000 streams (slope {n0} -> {n1})")
    print(f"\nmaster over {args.hours:g} h at {args.tokens_per_s:,.0f} output tokens/s (deltas every 3 s through msgpack)")
    print(f"{'minute':>7}{'RSS MB packed':>15}{'RSS MB unpacked':>17}{'live window hists':>19}{'windows':>9}")
    runs = {}
    for mode in ("pack", "nopack"):
        res = subprocess.run([sys.executable, __file__, "--master-child", mode, "--hours", str(args.hours),
                              "--tokens-per-s", str(args.tokens_per_s)], capture_output=True, text=True, check=True)
        runs[mode] = [line.split() for line in res.stdout.splitlines()]
    for a, b in zip(runs["pack"], runs["nopack"]):
        print(f"{a[0]:>7}{a[1]:>15}{b[1]:>17}{a[2]:>19}{a[3]:>9}")


if __name__ == "__main__":
    main()
