"""Turnover: what finishing a request and starting the next costs the event loop, and how long a wave of
simultaneous completions stalls it.

    python benchmarks/turnover.py [--streams 256] [--output-tokens 4] [--seconds 15] [--readers native,python]
                                  [--attribute]

The emulator (core 1) runs every stream on one lockstep grid (``--lockstep``, TTFT = ITL = 20 ms) with
few tokens per request, so all streams finish together and restart together: a wave of N completions
every few steps. The client is one vllm-load Locust process on core 0 (``locustfiles/completions.py``)
with a probe greenlet (``turnover_probe.py``) that asks to wake every 1 ms and records how late it
woke: that lateness is how long the loop was held (a stall). The loop thread's CPU (from
/proc/PID/task, the event-loop thread alone: the native reader's and the prompt thread's are shown
apart) divided by the requests finished is the loop time per turnover, chunks included. Each stall over
2 ms is attributed where it can be: to a garbage collection it overlapped, or to the aftermath of a wave
(no request finished during it, some in the 10 ms before: the hand-over's end, the fold, the refills).

``--attribute`` also records core 0's context switches over the window (``perf sched record``, run on
core 1; it needs perf and root or perf_event_paranoid <= 1) and gives each stall over 2 ms to what held the
core longest while the loop waited: the loop's own work (its thread CPU), the loop shown running but charged
no CPU for it (stolen: the host ran something else on the virtual CPU), the native reader, the token
threads, or another task (kernel threads are named). The tracing costs the client ~10 % more loop time, so
its runs count more stalls.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import ENV, ROOT, pinned, start_emulator


def thread_stats(pid: int) -> dict[str, list[str]]:
    """Each thread's /proc stat fields after its name (by thread id) of a process."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[tid] = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
    return out


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread (by thread id) of a process."""
    hz = os.sysconf("SC_CLK_TCK")
    return {tid: (int(fields[11]) + int(fields[12])) / hz for tid, fields in thread_stats(pid).items()}


def run(reader: str, args: argparse.Namespace) -> dict:
    emu, url = start_emulator("--ttft", "0.02", "--itl", "0.02", "--lockstep", core=1)
    work = Path(tempfile.mkdtemp(prefix="vllm-load-turnover-"))
    probe_out = work / "probe.json"
    env = dict(ENV, VLLM_LOAD_NATIVE="1" if reader == "native" else "0", TURNOVER_PROBE=str(probe_out))
    if args.attribute:
        env["TURNOVER_ATTRIBUTE"] = "1"
    roles: dict[str, str] = {}
    try:
        cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "benchmarks/turnover_probe.py"), "--headless",
               "-u", str(args.streams), "-r", str(args.streams), "-t", f"{args.seconds}s", "--host", url,
               "--input-tokens", "24", "--output-tokens", str(args.output_tokens), "--only-summary",
               "--run-dir", str(work / "run"), *args.locust_args.split()]
        loc = subprocess.Popen(pinned(0, cmd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
        time.sleep(args.seconds / 3)  # past the spawn
        a, t0 = thread_cpu(loc.pid), time.time()
        if args.attribute:  # the scheduler's record of core 0 over the window (perf itself runs on core 1)
            record = subprocess.run(pinned(1, ["perf", "sched", "record", "-k", "CLOCK_MONOTONIC", "-o",
                                               str(work / "sched.data"), "--", "sleep", str(args.seconds / 3)]),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if record.returncode != 0:
                loc.kill()
                sys.exit("turnover.py: perf sched record failed: --attribute needs root or "
                         "/proc/sys/kernel/perf_event_paranoid <= 1")
            roles = thread_roles(loc.pid)
        else:
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
    causes = attribute_by_scheduler(work / "sched.data", probe["big"], roles) if args.attribute else {}
    return {"reader": reader, "requests_per_s": len(finished) / (t1 - t0), "causes": causes,
            "loop_cpu_per_request_us": 1e6 * loop_cpu / max(1, len(finished)),
            "loop_cpu": loop_cpu / (t1 - t0), "other_threads_cpu": other / (t1 - t0),
            "stall_p99_ms": pct(99) * 1e3, "stall_p999_ms": pct(99.9) * 1e3, "stall_max_ms": window[-1] * 1e3 if window else float("nan"),
            "stalls_over_2ms": sum(1 for s in window if s > 0.002), "wakes": len(window), **cause,
            "collections": _collections(probe["collections"], t0, t1)}


def thread_roles(pid: int) -> dict[str, str]:
    """The client's threads by what they are, from their scheduling class: the event loop (the main thread),
    the native reader (real-time, or the nice -10 it falls back to) and the token threads (nice 10)."""
    roles = {}
    for tid, fields in thread_stats(pid).items():
        nice, policy = int(fields[16]), int(fields[38])
        roles[tid] = ("loop" if tid == str(pid) else "reader" if policy in (1, 2) or nice < 0
                      else "token threads" if nice > 0 else "other client threads")
    return roles


#: what a stall's time went to, in the order the table lists them
UNCHARGED = "loop shown running, charged no CPU"
CAUSES = ("loop: its own work", UNCHARGED, "reader", "token threads", "other client threads",
          "other tasks on the core")
LEFT_OUT = "left out: perf's own start and stop"


def _timehist(data: Path) -> list[tuple[float, float, str]]:
    """Core 0's runs from ``perf sched timehist``: (start, end, task)."""
    out = subprocess.run(["perf", "sched", "timehist", "-i", str(data), "-C", "0"], capture_output=True, text=True,
                         check=True).stdout
    runs = []
    for line in out.splitlines():
        parts = line.split()  # time [cpu] task wait-time sch-delay run-time (ms)
        try:
            end, ran = float(parts[0]), float(parts[-1]) / 1e3
        except (ValueError, IndexError):
            continue
        runs.append((end - ran, end, parts[2]))
    return runs


def attribute_by_scheduler(data: Path, big: list, roles: dict[str, str]) -> dict:
    """Each stall over 2 ms, given to what held core 0 longest while the loop waited (``perf sched timehist``):
    the loop's own work (its thread's CPU time over the stall); the loop shown running by the scheduler while
    its thread was charged no CPU for it (time the kernel subtracts as stolen: the host ran something else on
    the virtual CPU); the native reader; the token threads; or another task (kernel threads such as kdamond or
    rcu_preempt are named). The first 0.15 s and last 0.05 s are left out: perf's own start and stop."""
    runs = _timehist(data)
    if not runs:
        return {}
    first, last = runs[0][1], runs[-1][1]
    table: dict = {c: [0, 0.0, {}] for c in CAUSES + (LEFT_OUT,)}
    for woke, late, loop_cpu in big:
        began = _began(woke, late)
        if late <= 0.002 or woke < first - 0.5 or began > last + 0.5:
            continue
        if began < first + 0.15 or woke > last - 0.05:
            table[LEFT_OUT][0] += 1
            table[LEFT_OUT][1] += late
            continue
        share = dict.fromkeys(CAUSES, 0.0)
        others: dict[str, float] = {}
        loop_ran = 0.0
        for start, end, task in runs:
            overlap = min(end, woke) - max(start, began)
            if overlap <= 0 or task == "<idle>":
                continue
            tid = task.rsplit("[", 1)[-1].split("/")[0].rstrip("]")
            role = roles.get(tid)  # thread ids are unique on the machine; a thread's name may be anything
            if role == "loop":
                loop_ran += overlap
            elif role is not None:
                share[role] += overlap
            else:
                share["other tasks on the core"] += overlap
                name = task.rsplit("[", 1)[0]
                others[name] = others.get(name, 0.0) + overlap
        share["loop: its own work"] = min(loop_cpu, loop_ran)
        share[UNCHARGED] = max(0.0, loop_ran - loop_cpu)
        cause = max(share, key=share.get)
        row = table[cause]
        row[0] += 1
        row[1] += late
        if cause == "other tasks on the core":
            top = max(others, key=others.get)
            row[2][top] = row[2].get(top, 0) + 1
    return table


def _began(woke: float, late: float) -> float:
    """When a stall began: the probe asked to wake 1 ms after it last ran."""
    return woke - late - 0.001


def _attribute(stalls: list[tuple[float, float]], collections: list, finished: list[float]) -> dict:
    """What each stall over 2 ms overlapped: a garbage collection, or the 10 ms after a wave's finishes (the
    wave's hand-over, the fold and the refills it sets off) with no request finishing during the stall."""
    gc_hit = after_wave = 0
    for woke, late in stalls:
        began = _began(woke, late)
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
    ap.add_argument("--attribute", action="store_true",
                    help="record core 0's scheduling (perf sched, root or perf_event_paranoid <= 1) and say what "
                         "held the core during each stall over 2 ms")
    args = ap.parse_args()
    if args.attribute and not shutil.which("perf"):
        sys.exit("turnover.py: --attribute needs perf (linux-tools) on the PATH")
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
        if r["causes"]:
            print(f"  what held core 0 during the stalls over 2 ms ({r['reader']} reader):")
            print(f"  {'held by':<36}{'stalls':>7}{'ms in all':>10}  which")
            for cause, (count, total, names) in r["causes"].items():
                which = ", ".join(f"{n} {c}" for n, c in sorted(names.items(), key=lambda kv: -kv[1]))
                print(f"  {cause:<36}{count:>7d}{1e3 * total:>10.1f}  {which}")


if __name__ == "__main__":
    main()
