"""Does a swarm start on a busy host? `--processes 2` against the embedded emulator beside N CPU hogs.

    python benchmarks/busy_spawn.py [--hogs 10] [--runs 3] [--seconds 12] [--checkout A_DIR --checkout B_DIR]

Each run prints: whether Locust marked a worker missing (no heartbeat for 3 s), the requests measured, the exit
code, the delay from the master's start to the first request and the wall time. With two --checkout folders
the runs alternate A B A B on the same hogs (the code each runs is the folder's vllm_load, through PYTHONPATH).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def hog() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def one_run(checkout: Path, seconds: int, run_dir: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(checkout), HF_HUB_OFFLINE="1")
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "locust", "-f", str(checkout / "locustfiles" / "chat.py"),
                          "--headless", "--processes", "2", "-u", "16", "-r", "16", "-t", f"{seconds}s",
                          "--run-dir", str(run_dir)], env=env, capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - t
    text = out.stdout + out.stderr
    row = {"exit": out.returncode, "wall_s": wall, "missing": text.count("failed to send heartbeat"),
           "requests": 0, "first_s": None, "load": os.getloadavg()[0]}
    try:
        summary = json.loads((run_dir / "summary.json").read_text())["summary"]
        start = json.loads((run_dir / "llm_stats.json").read_text())["start"]
        row["requests"] = summary["requests"]
        starts = [json.loads(line)["start"] for f in run_dir.glob("requests-*.jsonl") for line in f.open()]
        row["first_s"] = min(starts) - start if starts else None
    except (OSError, ValueError, KeyError):
        pass
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hogs", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=12)
    ap.add_argument("--checkout", action="append", type=Path, help="a checkout to run (twice: A and B)")
    args = ap.parse_args()
    checkouts = args.checkout or [ROOT]
    hogs = [hog() for _ in range(args.hogs)]
    print(f"cores {os.cpu_count()}, CPU hogs {args.hogs}, runs of {args.seconds} s with --processes 2 -u 16")
    print(f"{'code':<6} {'run':>3} {'missing':>8} {'requests':>9} {'exit':>5} {'first req s':>12} {'wall s':>7} "
          f"{'load':>5}")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for k in range(args.runs):
                for i, checkout in enumerate(checkouts):
                    row = one_run(checkout, args.seconds, Path(tmp) / f"r{k}-{i}")
                    first = f"{row['first_s']:.1f}" if row["first_s"] is not None else "-"
                    print(f"{'AB'[i] if len(checkouts) > 1 else '-':<6} {k + 1:>3} {row['missing']:>8} "
                          f"{row['requests']:>9} {row['exit']:>5} {first:>12} {row['wall_s']:>7.1f} "
                          f"{row['load']:>5.1f}", flush=True)
    finally:
        for h in hogs:
            h.kill()


if __name__ == "__main__":
    main()
