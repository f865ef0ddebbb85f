"""What a master costs as a swarm grows: N workers × S slow streams each against emulator replicas.

    python benchmarks/swarm_master.py [--workers 32] [--streams 64] [--seconds 180] [--replicas 2]

The master (`--master`) and the workers (`--worker --processes N`) are separate process trees, so the master's CPU
and RSS are its own (psutil, sampled every 10 s). After the run it checks that the master's totals equal the sum
of the workers' logs, that its percentiles equal those computed from the logs within the histograms' precision,
and it prices one worker report: a 3 s delta of one worker rebuilt from its log, msgpack-encoded as Locust ships
it, and the master's time to merge it (the median over every worker's).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import msgpack  # noqa: E402  (Locust's own wire encoding; Locust depends on it)
import numpy as np  # noqa: E402
import psutil  # noqa: E402

from vllm_load.client.record import RequestRecord  # noqa: E402
from vllm_load.metrics.stats import LLMStats  # noqa: E402
from vllm_load.rundir.reqlog import read_log  # noqa: E402

FIELDS = {f.name for f in fields(RequestRecord)}


def start(args: list[str], **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    return subprocess.Popen([sys.executable, *args], env=env, cwd=ROOT, **kw)


def record(row: dict) -> RequestRecord:
    return RequestRecord(**{k: v for k, v in row.items() if k in FIELDS})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=32)
    ap.add_argument("--streams", type=int, default=64, help="streams (users) per worker")
    ap.add_argument("--seconds", type=int, default=180)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--itl", type=float, default=0.5, help="the emulators' seconds between tokens (slow streams)")
    ap.add_argument("--output-tokens", type=int, default=16)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="swarm-master-"))
    procs: list[subprocess.Popen] = []
    try:
        urls = []
        for _ in range(args.replicas):
            emu = start(["-m", "server.emulator", "--port", "0", "--ttft", "0.2", "--itl", str(args.itl),
                         "--max-num-seqs", "100000"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            procs.append(emu)
            urls.append(emu.stdout.readline().split("listening on ", 1)[1].split()[0])
        run_dir = tmp / "run"
        users = args.workers * args.streams
        port = 5557 + os.getpid() % 1000
        master = start(["-m", "locust", "-f", "locustfiles/chat.py", "--master", "--master-bind-host", "127.0.0.1",
                        "--master-bind-port", str(port), "--headless", "--expect-workers", str(args.workers),
                        "-u", str(users), "-r", str(max(1, users // 10)), "-t", f"{args.seconds}s",
                        "--host", ",".join(urls), "--output-tokens", str(args.output_tokens), "--only-summary",
                        "--drain-timeout", "60", "--run-dir", str(run_dir)],
                       stdout=open(tmp / "master.out", "w"), stderr=subprocess.STDOUT)
        procs.append(master)
        workers = start(["-m", "locust", "-f", "locustfiles/chat.py", "--worker", "--processes", str(args.workers),
                         "--master-host", "127.0.0.1", "--master-port", str(port)],
                        stdout=open(tmp / "workers.out", "w"), stderr=subprocess.STDOUT)
        procs.append(workers)
        print(f"{args.workers} workers × {args.streams} streams ({users} users) over {args.replicas} replicas, "
              f"{args.seconds} s, emulator ITL {args.itl} s, {os.cpu_count()} cores; out {tmp}")
        mp = psutil.Process(master.pid)
        samples = []
        t0, last_cpu = time.monotonic(), 0.0
        print(f"{'t s':>6} {'master CPU % of a core':>23} {'master RSS MB':>14}")
        while master.poll() is None:
            time.sleep(10)
            try:
                cpu = sum(mp.cpu_times()[:2])
                rss = mp.memory_info().rss / 2**20
            except psutil.NoSuchProcess:
                break
            if master.poll() is not None:
                break
            share = (cpu - last_cpu) / 10 * 100
            last_cpu = cpu
            samples.append((time.monotonic() - t0, share, rss))
            print(f"{samples[-1][0]:6.0f} {share:23.1f} {rss:14.1f}", flush=True)
        master.wait()
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
    summary = json.loads((run_dir / "summary.json").read_text())["summary"]
    logs = {f.name: [r for r in read_log(f) if not r.get("warmup")] for f in sorted(run_dir.glob("requests-*.jsonl"))}
    rows = [r for rs in logs.values() for r in rs]
    print(f"\nmaster exit code {master.returncode}; worker logs {len(logs)}; requests: master {summary['requests']}, "
          f"logs {len(rows)} ({'equal' if summary['requests'] == len(rows) else 'DIFFER'})")
    missing = (tmp / "master.out").read_text().count("failed to send heartbeat")
    print(f"heartbeats missed (Locust's 'failed to send heartbeat' lines): {missing}")
    ttft = np.array([r["ttft"] for r in rows if r["ok"] and r["ttft"] is not None])
    if not len(ttft):
        sys.exit("no request measured: see " + str(tmp / "master.out"))
    for p in (50, 99):
        mine = summary["metrics"]["ttft"][f"p{p}"]
        exact = float(np.percentile(ttft, p, method="inverted_cdf"))
        print(f"TTFT p{p}: master {mine * 1000:.3f} ms, from the logs {exact * 1000:.3f} ms "
              f"({(mine - exact) / exact * 100:+.3f} %)")
    first = min(r["start"] for r in rows)
    print(f"first request {first - json.loads((run_dir / 'config.json').read_text())['started']:.1f} s after the "
          "master's start")
    busy = [s for s in samples if s[0] > 30] or samples
    if busy:
        print(f"master CPU during the load: median {statistics.median(s[1] for s in busy):.1f} %, max "
              f"{max(s[1] for s in busy):.1f} % of one core; RSS {busy[0][2]:.0f} -> {busy[-1][2]:.0f} MB")
    # one worker report: 3 s of one worker's requests, as a delta on the wire, and its merge into the totals
    mid = statistics.median(r["start"] for r in rows)
    sizes, merges = [], []
    totals = LLMStats()
    for rs in logs.values():
        part = LLMStats()
        for r in rs:
            if mid <= r["start"] + r["e2e"] < mid + 3:
                part.add(record(r))
        wire = part.take_delta()
        sizes.append(len(msgpack.packb(wire)))
        t = time.perf_counter()
        totals.merge(LLMStats.from_wire(msgpack.unpackb(msgpack.packb(wire), strict_map_key=False)))
        merges.append(time.perf_counter() - t)
    print(f"one worker report (3 s): {statistics.median(sizes) / 1024:.1f} KB median, {max(sizes) / 1024:.1f} KB max; "
          f"decode + merge {statistics.median(merges) * 1000:.2f} ms median, {max(merges) * 1000:.2f} ms max; "
          f"{len(logs)} reports every 3 s at the median: {statistics.median(merges) * len(logs) / 3 * 100:.1f} % "
          "of a core")


if __name__ == "__main__":
    main()
