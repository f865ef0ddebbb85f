"""Prompt preparation throughput: exact, unique prompts per second by length and API.

    python benchmarks/prompts_bench.py [--tokenizer builtin:mistral-7b-v0.1] [--seconds 3]

Prints one table; every prompt is counted by the tokenizer (exactness is verified, not assumed).
"""

from __future__ import annotations

import argparse
import statistics
import time

from vllm_load.prompts import PromptFactory
from vllm_load.tokenizer import BUILTIN_MISTRAL, load_tokenizer


def bench(factory: PromptFactory, n: int, seconds: float) -> tuple[float, float, int]:
    times = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < 3:
        t = time.perf_counter()
        p = factory.make(n)
        times.append(time.perf_counter() - t)
        assert p.tokens == n
    return 1.0 / statistics.median(times), max(times) * 1e3, len(times)


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


if __name__ == "__main__":
    main()
