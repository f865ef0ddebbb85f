"""Turnover: what finishing a request and starting the next costs the event loop, and how long a wave of
simultaneous completions stalls it.

    python benchmarks/turnover.py [--streams 256] [--output-tokens 4] [--seconds 15] [--readers native,python]

The emulator (core 1) runs every stream on one lockstep grid (``--lockstep``, TTFT = ITL = 20 ms) with
few tokens per request, so all streams finish together and restart together: a wave of N completions
every few steps. The client is one vllm-load Locust process on core 0 (``locustfiles/completions.py``)
with a probe greenlet (``turnover_probe.py``) that asks to wake every 1 ms and records how late it
woke: that lateness is how long the loop was held (a stall). The loop thread's CPU (from
/proc/PID/task, the event-loop thread alone: the native reader's and the prompt thread's are shown
apart) divided by the requests finished is the loop time per turnover, chunks included. Each stall over
2 ms is attributed where it can be: to a garbage collection it overlapped, or to the aftermath of a wave
(no request finished during it, some in the 10 ms before: the hand-over's end, the fold, the refills).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import ENV, ROOT, pinned, start_emulator


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread (by thread id) of a process."""
    hz = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[tid] = (int(fields[11]) + int(fields[12])) / hz
    return out


def run(reader: str, args: argparse.Namespace) -> dict:
    emu, url = start_emulator("--ttft", "0.02", "--itl", "0.02", "--lockstep", core=1)
    work = Path(tempfile.mkdtemp(prefix="vllm-load-turnover-"))
    probe_out = work / "probe.json"
    env = dict(ENV, VLLM_LOAD_NATIVE="1" if reader == "native" else "0", TURNOVER_PROBE=str(probe_out))
    try:
        cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "benchmarks/turnover_probe.py"), "--headless",
               "-u", str(args.streams), "-r", str(args.streams), "-t", f"{args.seconds}s", "--host", url,
               "--input-tokens", "24", "--output-tokens", str(args.output_tokens), "--only-summary",
               "--run-dir", str(work / "run"), *args.locust_args.split()]
        loc = subprocess.Popen(pinned(0, cmd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
        time.sleep(args.seconds / 3)  # past the spawn
        a, t0 = thread_cpu(loc.pid), time.time()
        time.sleep(args.seconds / 3)
        b, t1 = thread_cpu(loc.pid), time.time()
        loc.wait(timeout=args.seconds + 60)
    finally:
        emu.terminate()
        emu.wait(timeout=10)
    main_tid = str(loc.pid)
    probe = json.loads(probe_out.read_text())
    finished = [t for t in probe["finished"] if t0 <= t < t1]
    loop_cpu = b.get(main_tid, 0.0) - a.get(main_tid, 0.0)
    other = sum(b[t] - a.get(t, 0.0) for t in b if t != main_tid)
    stalls = [(t, s) for t, s in probe["stalls"] if t0 <= t < t1]
    window = [s for _t, s in stalls]
    cause = _attribute([(t, s) for t, s in stalls if s > 0.002], probe["collections"], sorted(probe["finished"]))
    window.sort()
    pct = lambda q: window[min(len(window) - 1, int(q / 100 * len(window)))] if window else float("nan")  # noqa: E731
    return {"reader": reader, "requests_per_s": len(finished) / (t1 - t0),
            "loop_cpu_per_request_us": 1e6 * loop_cpu / max(1, len(finished)),
            "loop_cpu": loop_cpu / (t1 - t0), "other_threads_cpu": other / (t1 - t0),
            "stall_p99_ms": pct(99) * 1e3, "stall_p999_ms": pct(99.9) * 1e3, "stall_max_ms": window[-1] * 1e3 if window else float("nan"),
            "stalls_over_2ms": sum(1 for s in window if s > 0.002), "wakes": len(window), **cause,
            "collections": _collections(probe["collections"], t0, t1)}


def _attribute(stalls: list[tuple[float, float]], collections: list, finished: list[float]) -> dict:
    """What each stall over 2 ms overlapped: a garbage collection, or the 10 ms after a wave's finishes (the
    wave's hand-over, the fold and the refills it sets off) with no request finishing during the stall."""
    gc_hit = after_wave = 0
    for woke, late in stalls:
        began = woke - late - 0.001  # the probe asked to wake 1 ms after it last ran
        if any(began - dt <= at <= woke for at, _gen, dt in collections):
            gc_hit += 1
        elif (bisect.bisect(finished, woke) == bisect.bisect(finished, began)
              and bisect.bisect(finished, began) > bisect.bisect(finished, began - 0.01)):
            after_wave += 1
    return {"stalls_with_gc": gc_hit, "stalls_after_wave": after_wave}


def _collections(collections: list, t0: float, t1: float) -> str:
    """The window's garbage collections: how many, and the longest (ms)."""
    took = [dt for at, _gen, dt in collections if t0 <= at < t1]
    return f"{len(took)} / {1e3 * max(took):.1f}" if took else "0"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=4)
    ap.add_argument("--seconds", type=int, default=15)
    ap.add_argument("--readers", default="native,python")
    ap.add_argument("--locust-args", default="", help="more options for the Locust run, e.g. '--prompt-pool 256'")
    args = ap.parse_args()
    print(f"{args.streams} streams, {args.output_tokens} tokens per request, lockstep 20 ms steps: a wave of "
          f"{args.streams} completions every {args.output_tokens + 1} steps; client on core 0, emulator on core 1; "
          f"measured over the middle {args.seconds / 3:g} s of each run")
    print(f"{'reader':<8}{'req/s':>8}{'loop CPU':>9}{'other threads':>14}{'loop us/request':>16}"
          f"{'stall p99':>10}{'p99.9':>7}{'max':>7}{'>2 ms':>7}{'of them: GC':>13}{'after a wave':>14}"
          f"{'GCs / longest ms':>18}")
    for reader in args.readers.split(","):
        r = run(reader, args)
        print(f"{r['reader']:<8}{r['requests_per_s']:>8.0f}{100 * r['loop_cpu']:>8.0f}%{100 * r['other_threads_cpu']:>13.0f}%"
              f"{r['loop_cpu_per_request_us']:>16.0f}{r['stall_p99_ms']:>10.2f}{r['stall_p999_ms']:>7.2f}"
              f"{r['stall_max_ms']:>7.2f}{r['stalls_over_2ms']:>7d}{r['stalls_with_gc']:>13d}{r['stalls_after_wave']:>14d}"
              f"{r['collections']:>18}")


if __name__ == "__main__":
    main()
