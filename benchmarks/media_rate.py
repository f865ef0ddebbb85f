"""How fast vllm-load makes unique images and audio clips (vllm_load/workload/media.py), on one core.

    python benchmarks/media_rate.py [--seconds 3]

Prints, per size: parts made per second (JPEG encode + base64 data URL, what a request carries), the bytes of
one, and the 99th percentile of one part's time. Run pinned to one core (taskset -c 0) for the per-core rate.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from vllm_load.workload.media import MediaMaker


def measure(make, seconds: float) -> tuple[float, float, float, int]:
    make()  # the size's base picture, made once
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        part = make()
        times.append(time.perf_counter() - t)
    size = len(str(part))
    a = np.asarray(times)
    return len(a) / a.sum(), float(np.median(a)) * 1e3, float(np.percentile(a, 99)) * 1e3, size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    maker = MediaMaker("bench", "w0")
    print(f"cores allowed: {len(os.sched_getaffinity(0))}")
    print(f"{'part':<16} {'per second':>11} {'median ms':>10} {'p99 ms':>8} {'bytes':>9}")
    cases = [(f"image {w}x{h}", lambda w=w, h=h: maker.image_part(w, h))
             for w, h in ((256, 256), (512, 512), (1024, 768), (2048, 2048))]
    cases += [(f"audio {s:g} s", lambda s=s: maker.audio_part(s)) for s in (1.0, 10.0, 30.0)]
    for name, make in cases:
        rate, median, p99, size = measure(make, args.seconds)
        print(f"{name:<16} {rate:>11,.0f} {median:>10.2f} {p99:>8.2f} {size:>9,}")


if __name__ == "__main__":
    main()
