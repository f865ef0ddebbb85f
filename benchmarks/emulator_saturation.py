"""The emulator's batching model against the published A100 sweep (max_num_seqs 64 -> 512 with matching
concurrency: 9.9 -> 11.5 req/s, mean latency 6 -> 37 s), in wall-clock time scaled by --time-scale.

    python benchmarks/emulator_saturation.py [--time-scale 0.25]

Prints one table in unscaled units; 200 prompt + 200 output tokens per request, closed loop.
"""

from __future__ import annotations

import argparse
import statistics
import time

import gevent

from server.emulator.scheduler import PROFILES, BatchingEngine, SchedulerConfig


def level(batch: int, scale: float, rounds: int = 2) -> tuple[float, float, int]:
    eng = BatchingEngine(SchedulerConfig(cost=PROFILES["a100-llama8b"], max_num_seqs=batch, num_gpu_blocks=30000,
                                         time_scale=scale))
    latencies: list[float] = []

    def user() -> None:
        for _ in range(rounds):
            t = time.perf_counter()
            for _em in eng.generate(200, 200):
                pass
            latencies.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    gevent.joinall([gevent.spawn(user) for _ in range(batch)])
    elapsed = time.perf_counter() - t0
    return len(latencies) / elapsed * scale, statistics.mean(latencies) / scale, eng.preemptions


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-scale", type=float, default=0.25)
    args = ap.parse_args()
    print(f"a100-llama8b profile, time scale {args.time_scale}; published A100: 9.9 -> 11.5 req/s, 6 -> 37 s")
    print(f"{'max_num_seqs':>12}{'req/s':>9}{'mean latency s':>16}{'preemptions':>13}")
    for batch in (64, 128, 256, 512):
        rate, lat, pre = level(batch, args.time_scale)
        print(f"{batch:>12}{rate:>9.2f}{lat:>16.2f}{pre:>13}")


if __name__ == "__main__":
    main()
