"""Prompt preparation: exact, unique prompts per second by length and API, and what building them
costs the event loop inline versus in the prompt pool's native thread.

    python benchmarks/prompts_bench.py [--tokenizer builtin:mistral-7b-v0.1] [--seconds 3]

Prints two tables; every prompt is counted by the tokenizer (exactness is verified, not assumed).
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import gevent  # noqa: E402

import argparse
import statistics
import sys
import time

from vllm_load.workload.prompts import PromptFactory
from vllm_load.plugin.load.generator import SWITCH_INTERVAL
from vllm_load.workload.tokenizer import BUILTIN_MISTRAL, load_tokenizer


def bench(factory: PromptFactory, n: int, seconds: float) -> tuple[float, float, int]:
    times = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < 3:
        t = time.perf_counter()
        p = factory.make(n)
        times.append(time.perf_counter() - t)
        assert p.tokens == n
    return 1.0 / statistics.median(times), max(times) * 1e3, len(times)


def loop_stall(factory: PromptFactory, n: int, threaded: bool, count: int = 5,
               switch: float | None = None) -> tuple[float, float]:
    """(prompts/s, worst lateness of a 1 ms gevent timer) while building ``count`` prompts, with the GIL
    handed over every ``switch`` seconds (Python's default 5 ms if None)."""

    default = sys.getswitchinterval()
    if switch is not None:
        sys.setswitchinterval(switch)
    try:
        return _loop_stall(factory, n, threaded, count)
    finally:
        sys.setswitchinterval(default)


def _loop_stall(factory: PromptFactory, n: int, threaded: bool, count: int) -> tuple[float, float]:
    from gevent.threadpool import ThreadPool

    lags: list[float] = []
    stop = [False]

    def ticker() -> None:
        while not stop[0]:
            t = time.perf_counter()
            gevent.sleep(0.001)
            lags.append(time.perf_counter() - t - 0.001)

    g = gevent.spawn(ticker)
    gevent.sleep(0.02)
    pool = ThreadPool(1)
    t = time.perf_counter()
    for _ in range(count):
        if threaded:
            pool.spawn(factory.make, n).get()
        else:
            factory.make(n)
            gevent.sleep(0)
    elapsed = time.perf_counter() - t
    stop[0] = True
    g.join()
    pool.kill()
    return count / elapsed, max(lags) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default=BUILTIN_MISTRAL)
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    tok = load_tokenizer(args.tokenizer)
    print(f"tokenizer {args.tokenizer}; one core; median of repeated single prompts")
    print(f"{'api':<12}{'tokens':>8}{'prompts/s':>12}{'tokens/s':>14}{'max ms':>10}{'n':>6}")
    for api in ("completions", "chat"):
        factory = PromptFactory(tok, api, salt="bench")  # type: ignore[arg-type]
        for n in (128, 1024, 8192, 32768):
            rate, worst, count = bench(factory, n, args.seconds)
            print(f"{api:<12}{n:>8}{rate:>12.1f}{rate * n:>14.0f}{worst:>10.1f}{count:>6}")
    print()
    print("event-loop stall while building 5 completions prompts (what other streams' timings would suffer)")
    print(f"GIL turns: Python's default {sys.getswitchinterval() * 1e3:g} ms, and a worker's {SWITCH_INTERVAL * 1e3:g} ms")
    print(f"{'tokens':>8}{'inline p/s':>12}{'inline stall ms':>17}{'pool p/s':>10}{'pool stall ms':>15}"
          f"{'ratio':>8}{'worker pool p/s':>17}{'worker pool stall ms':>22}{'ratio':>8}")
    factory = PromptFactory(tok, "completions", salt="stall")
    for n in (1024, 8192, 32768):
        r1, s1 = loop_stall(factory, n, threaded=False)
        r2, s2 = loop_stall(factory, n, threaded=True)
        r3, s3 = loop_stall(factory, n, threaded=True, switch=SWITCH_INTERVAL)
        print(f"{n:>8}{r1:>12.1f}{s1:>17.1f}{r2:>10.1f}{s2:>15.1f}{s1 / max(s2, 1e-3):>8.0f}x"
              f"{r3:>17.1f}{s3:>22.1f}{s1 / max(s3, 1e-3):>8.0f}x")


if __name__ == "__main__":
    main()
