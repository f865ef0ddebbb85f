"""A client's memory over a long run beside a sidecar: the README's first command (the embedded emulator and its
sidecar, every second's sample read live), its Locust process's RSS sampled every 10 s.

    .venv/bin/python benchmarks/client_rss.py [--minutes 10] [--users 4]

Before the live server side kept only each sample's numbers (issue 61), the client grew ~0.07 MB/s beside a sidecar
(~40 MB in 10 minutes) and stayed flat without one. The table prints RSS each minute and the growth from minute 2
(the pools filled, the first windows packed) to the run's end (-t); the bound is ±10 MB. The end's own work (the
request log read back for the report) is said apart: it is not growth.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time

import psutil
from _harness import ENV, ROOT


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--users", type=int, default=4)
    args = ap.parse_args()
    run_dir = tempfile.mkdtemp(prefix="vllm-load-rss-")
    seconds = int(args.minutes * 60)
    loc = subprocess.Popen([sys.executable, "-m", "locust", "-f", "locustfiles/chat.py", "--headless", "-u",
                            str(args.users), "-r", str(args.users), "-t", f"{seconds}s", "--emulator-ttft", "0.05",
                            "--emulator-itl", "0.01", "--input-tokens", "256", "--output-tokens", "64",
                            "--run-dir", run_dir], stdout=open(f"{run_dir}.log", "w"), stderr=subprocess.STDOUT,
                           env=ENV, cwd=ROOT)
    proc = psutil.Process(loc.pid)
    samples: list[tuple[float, float]] = []
    began = time.monotonic()
    try:
        while loc.poll() is None:
            try:
                samples.append((time.monotonic() - began, proc.memory_info().rss / 1e6))
            except psutil.NoSuchProcess:
                break
            time.sleep(10.0)
    finally:
        if loc.poll() is None:
            loc.terminate()
            loc.wait(timeout=60)
    print("| minute | client RSS (MB) |\n|---|---|")
    for minute in range(int(args.minutes) + 1):
        near = [rss for t, rss in samples if abs(t - 60 * minute) <= 5]
        if near:
            print(f"| {minute} | {near[0]:.1f} |")
    settled = [rss for t, rss in samples if 120 <= t <= seconds]  # the load's own minutes, not the end's report
    after = [rss for t, rss in samples if t > seconds]
    if settled:
        print(f"\nfrom minute 2 to the run's end: {settled[0]:.1f} -> {settled[-1]:.1f} MB "
              f"({settled[-1] - settled[0]:+.1f} MB; max {max(settled):.1f}); while the end reads the request log and "
              f"writes the report: max {max(after, default=0.0):.1f} MB; {args.users} users, exit {loc.returncode}, "
              f"run dir {run_dir} (its output: {run_dir}.log)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
