"""Client capacity: SSE chunks/s one Locust worker process (one core) sustains against the emulator
streaming as fast as it can (zero delays) on the other core, with the CPU split.

    python benchmarks/client_capacity.py [--users 32,128] [--seconds 15] [--output-tokens 256]

Pins the emulator to core 1 and Locust to core 0 with taskset when there are 2+ cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from _harness import ENV, ROOT, pinned, start_emulator


def run_level(users: int, seconds: float, output_tokens: int) -> dict:
    emu, url = start_emulator("--ttft", "0", "--itl", "0", core=1)
    try:
        emu_proc = psutil.Process(emu.pid)
        run_dir = Path(tempfile.mkdtemp(prefix="vllm-load-cap-"))
        cpu0 = emu_proc.cpu_times()
        t0 = time.perf_counter()
        loc = subprocess.Popen(pinned(0, [sys.executable, "-m", "locust", "-f", "locustfiles/completions.py", "--headless",
                                          "-u", str(users), "-r", str(users), "-t", f"{int(seconds)}s", "--host", url,
                                          "--input-tokens", "16", "--output-tokens", str(output_tokens),
                                          "--only-summary", "--run-dir", str(run_dir)]),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV, cwd=ROOT)
        loc_proc = psutil.Process(loc.pid)
        loc_cpu = 0.0
        while loc.poll() is None:
            try:
                c = loc_proc.cpu_times()
                loc_cpu = c.user + c.system
            except psutil.NoSuchProcess:
                break
            time.sleep(0.2)  # sampling the child's CPU time while it runs
        wall = time.perf_counter() - t0
        cpu1 = emu_proc.cpu_times()
        data = json.loads((run_dir / "llm_stats.json").read_text())
        s = data["summary"]
        duration = data["end"] - data["start"]
        chunks = s["metrics"]["itl"]["count"] + s["succeeded"]  # gaps + first chunks
        return {"users": users, "chunks_per_s": chunks / duration, "requests": s["requests"], "failed": s["failed"],
                "locust_cpu_s": loc_cpu, "emulator_cpu_s": (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system),
                "wall_s": wall, "duration_s": duration, "chunks": chunks}
    finally:
        emu.terminate()
        emu.wait(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", default="32,128")
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--output-tokens", type=int, default=256)
    args = ap.parse_args()
    print(f"one Locust process on core 0, emulator (zero delay) on core 1; {args.output_tokens} tokens per request")
    print(f"{'users':>6}{'chunks/s':>11}{'requests':>10}{'failed':>8}{'locust CPU%':>13}{'emulator CPU%':>15}{'chunks/CPU-s':>14}")
    for users in (int(u) for u in args.users.split(",")):
        r = run_level(users, args.seconds, args.output_tokens)
        print(f"{r['users']:>6}{r['chunks_per_s']:>11.0f}{r['requests']:>10}{r['failed']:>8}"
              f"{100 * r['locust_cpu_s'] / r['wall_s']:>13.0f}{100 * r['emulator_cpu_s'] / r['wall_s']:>15.0f}"
              f"{r['chunks'] / max(r['locust_cpu_s'], 1e-9):>14.0f}")


if __name__ == "__main__":
    main()
