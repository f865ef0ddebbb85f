"""A wall clock set while a run goes, scored against the emulator's own clock (needs root: it sets the clock).

    sudo python benchmarks/wall_clock_step.py [--step 3] [--seconds 6] [--users 4]

A VM's wall clock is set while it runs (a CI machine restored from a snapshot was stepped 21 s forward mid-run,
then moved 0.5 ms every 80 ms), and the kernel stamps received packets with that clock only. One vllm-load
process runs ``--seconds`` against the emulator (``--timing-log``: when it wrote each chunk, on its monotonic
clock); a third of the way in the wall clock is stepped ``--step`` seconds forward, two thirds in back again, so
requests stream across both steps (``--one-way``: back only once the run is over). Joined to the truth by response id, it prints |error| p50/p99/max of TTFT,
every chunk gap and E2E, and the run's duration against the time it took, and sets the clock back on any exit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _harness import ENV, ROOT, start_emulator

from vllm_load.rundir.reqlog import read_log


def set_clock(delta: float) -> None:
    """Step the wall clock by ``delta`` seconds (clock_settime: no slew)."""
    time.clock_settime(time.CLOCK_REALTIME, time.clock_gettime(time.CLOCK_REALTIME) + delta)


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step", type=float, default=3.0, help="seconds the wall clock is stepped forward, then back")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--one-way", action="store_true", help="step forward only (back once the run is over): the "
                    "run's duration must leave the step out")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        truth_file, run_dir = Path(tmp) / "truth.jsonl", Path(tmp) / "run"
        emu, url = start_emulator("--ttft", "0.03", "--itl", "0.006", "--timing-log", str(truth_file))
        stepped = [0.0]

        def steps() -> None:
            time.sleep(args.seconds / 3 + 1.0)  # the run's start-up (the tokenizer, the pool) is about a second
            set_clock(args.step)
            stepped[0] = args.step
            if args.one_way:
                return
            time.sleep(args.seconds / 3)
            set_clock(-args.step)
            stepped[0] = 0.0

        stepper = threading.Thread(target=steps, daemon=True)
        began = time.perf_counter()
        try:
            stepper.start()
            run = subprocess.run([sys.executable, "-m", "locust", "-f", "locustfiles/completions.py", "--headless", "-u",
                            str(args.users), "-r", str(args.users), "-t", f"{args.seconds:g}s", "--host", url,
                            "--input-tokens", "32", "--output-tokens", "64", "--run-dir", str(run_dir),
                            "--allow-untrustworthy"], cwd=ROOT, env=ENV, check=False, capture_output=True,
                           timeout=120)
            stepper.join()
        finally:
            if stepped[0]:
                set_clock(-stepped[0])
            emu.kill()
        took = time.perf_counter() - began
        if run.returncode not in (0, 1, 5):
            print(f"the run failed (exit {run.returncode}): {run.stderr.decode()[-2000:]}")
            return 1
        truth = {t["id"]: t for t in map(json.loads, truth_file.read_text().splitlines())}
        logs = [r for f in run_dir.glob("requests*.jsonl") for r in read_log(f) if r["ok"]]
        ttft, gaps, e2e = [], [], []
        for r in logs:
            t = truth[r["response_id"]]
            ttft.append(abs(r["ttft"] - t["sent"][0]))
            e2e.append(abs(r["e2e"] - t["done"]))
            offs = r["chunk_offsets"]
            gaps.extend(abs((offs[i] - offs[i - 1]) - (t["sent"][i] - t["sent"][i - 1])) for i in range(1, len(offs)))
        summary = json.loads((run_dir / "llm_stats.json").read_text())["summary"]
    back = "back once the run was over" if args.one_way else f"back {args.seconds / 3:.1f} s later"
    print(f"wall clock stepped +{args.step:g} s at {args.seconds / 3 + 1:.1f} s and {back}; {len(logs)} requests, "
          f"{len(gaps)} gaps")
    print(f"{'|error| ms':<12}{'p50':>9}{'p99':>9}{'max':>10}")
    for name, vals in (("TTFT", ttft), ("chunk gap", gaps), ("E2E", e2e)):
        print(f"{name:<12}{statistics.median(vals) * 1e3:>9.3f}{pct(vals, 99) * 1e3:>9.3f}{max(vals) * 1e3:>10.3f}")
    print(f"run duration in the summary: {summary.get('duration_s')} s (this whole command took {took:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
