"""The results store at 10,000 runs: how long `vllm-load history` takes to answer (list, a metric's series with its
change points, the page, a run's baseline), in this process and as a fresh command; and how often the change-point
detection finds a shift, and finds one where there is none, on series of known noise.

    python benchmarks/history.py [--runs 10000] [--loads 20] [--from RUN_DIR] [--repeat 5] [--keep FILE]

The store is built from one real run directory (``--from``, else a 2 s emulator run made here), its record copied
with other ids, times, loads and TTFTs (one load's TTFT 15 % higher from its 60 % mark on): real rows, real sizes.
Prints a table of medians and the worst of ``--repeat`` answers each, then the detection table.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import ENV, ROOT

from vllm_load.history import changes
from vllm_load.history.baseline import select
from vllm_load.history.cli import main as history
from vllm_load.history.record import of_run_dir
from vllm_load.history.store import RunRecord, Store


def template(given: str, work: Path) -> RunRecord:
    if given:
        return of_run_dir(given)
    subprocess.run([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles" / "chat.py"), "--headless", "-u",
                    "2", "-r", "2", "-t", "2s", "--no-history"], cwd=work, env=ENV, check=True, capture_output=True,
                   timeout=120)
    return of_run_dir(next((work / "reports").iterdir()))


def build(url: str, base: RunRecord, runs: int, loads: int) -> float:
    rng = random.Random(7)
    t0 = time.perf_counter()
    with Store.open(url) as store:
        for i in range(runs):
            load = i % loads
            shifted = load == 0 and i >= runs * 0.6
            factor = rng.gauss(1.0, 0.02) * (1.15 if shifted else 1.0)
            row = {**base.row, "run_id": f"bench-{i:06d}", "started": 1.7e9 + i * 60.0, "ended": 1.7e9 + i * 60 + 30,
                   "fingerprint": f"load{load:03d}", "trusted": int(rng.random() > 0.02)}
            metrics = [(m, s, v * factor if m == "ttft" else v) for m, s, v in base.metrics]
            store.record(RunRecord(row, {"commit": f"c{i}", "branch": "main" if i % 3 else "dev"}, metrics,
                                   base.slos, base.windows))
    return time.perf_counter() - t0


def quiet(argv: list[str]) -> int:
    with contextlib.redirect_stdout(io.StringIO()):
        return history(argv)


def timed(fn, repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), max(times)


def detection(trials: int) -> list[tuple[str, float]]:
    rng = random.Random(11)

    def rate(before: int, after: int, shift: float, noise: float, at: bool) -> float:
        hits = 0
        for _ in range(trials):
            found = changes.find([rng.gauss(1.0, noise) for _ in range(before)] +
                                 [(1 + shift) * rng.gauss(1.0, noise) for _ in range(after)])
            hits += bool(found) if not at else any(c.index == before for c in found)
        return hits / trials
    return [("no change, 20 runs, 5 % noise: a change point found", rate(20, 0, 0.0, 0.05, False)),
            ("no change, 50 runs, 5 % noise: a change point found", rate(50, 0, 0.0, 0.05, False)),
            ("+15 % after 10 of 20 runs, 5 % noise: found", rate(10, 10, 0.15, 0.05, False)),
            ("+15 % after 10 of 20 runs, 5 % noise: found at its run", rate(10, 10, 0.15, 0.05, True)),
            ("+15 % after 6 of 11 runs, 2 % noise: found at its run", rate(6, 5, 0.15, 0.02, True)),
            ("+5 % after 10 of 20 runs, 2 % noise: found", rate(10, 10, 0.05, 0.02, False))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--loads", type=int, default=20)
    ap.add_argument("--from", dest="given", default="")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--keep", default="", help="build the store here (and keep it) instead of a temporary folder")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        url = args.keep or str(work / "history.sqlite")
        base = template(args.given, work)
        built = build(url, base, args.runs, args.loads) if not Path(url).exists() or not args.keep else 0.0
        size = sum(p.stat().st_size for p in Path(url).parent.glob(Path(url).name + "*")) / 2 ** 20
        print(f"store: {args.runs} runs of {args.loads} loads, {size:.0f} MiB, built in {built:.1f} s "
              f"({built / max(1, args.runs) * 1000:.2f} ms a run)\n")
        with Store.open(url) as store:
            newest = store.runs(limit=1, newest_first=True)[0]
        rows = [
            ("history list (the newest 20)", lambda: quiet(["--results-db", url, "list"])),
            ("history list --label branch=dev --limit 0", lambda: quiet(["--results-db", url, "list", "--label",
                                                                          "branch=dev", "--limit", "0"])),
            ("history show ttft.p99 (500 runs, change points)", lambda: quiet(["--results-db", url, "show",
                                                                             "ttft.p99", "--fingerprint", "load000"])),
            ("history page (4 charts)", lambda: quiet(["--results-db", url, "page", "--fingerprint", "load000",
                                                       "--out", str(work / "h.html")])),
        ]

        def baseline() -> None:
            with Store.open(url) as store:
                select(store, "last 5", newest["fingerprint"], newest["started"] + 1, "")
        rows.append(("a run's baseline (last 5, at the run's end)", baseline))
        print(f"| what (in this process, {args.repeat} times) | median | worst |\n|---|---|---|")
        for what, fn in rows:
            med, worst = timed(fn, args.repeat)
            print(f"| {what} | {med * 1000:.0f} ms | {worst * 1000:.0f} ms |")
        cmd = [sys.executable, "-m", "vllm_load.cli", "history", "--results-db", url, "show", "ttft.p99",
               "--fingerprint", "load000", "--json"]
        med, worst = timed(lambda: subprocess.run(cmd, env=ENV, check=True, capture_output=True), args.repeat)
        found = json.loads(subprocess.run(cmd, env=ENV, check=True, capture_output=True, text=True).stdout)
        print(f"| `vllm-load history show ttft.p99` as a command (its imports included) | {med * 1000:.0f} ms | "
              f"{worst * 1000:.0f} ms |")
        at = [c["run_id"] for c in found["changes"]]
        print(f"\nload000's change points: {at} (the shift was put at bench-{int(args.runs * 0.6):06d} or the "
              f"first load000 run after it)\n")
    print(f"| detection ({args.trials} series each) | share |\n|---|---|")
    for what, share in detection(args.trials):
        print(f"| {what} | {share * 100:.0f} % |")


if __name__ == "__main__":
    main()
