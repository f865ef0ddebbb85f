"""What one web UI poll costs the load's event loop, by the run's size: every Locust tab polls /stats/requests every
2 s, on the loop that times the streams. A run of N requests of C chunks each is folded into the run's stats as a
local runner holds them (per name and per target too), then timed: making the summary (once per second at most,
``plugin/webui/live_view.LiveView``), and what every poll does with it (the LLM tabs' rows and their JSON).

    .venv/bin/python benchmarks/webui_poll.py [--sizes 1000,10000,100000] [--chunks 100]

Before (stop 57): 2.4-3.1 s per poll at ~2,000 requests (hdrh's Python walks over 33,792 counters per histogram).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vllm_load.client.record import RequestRecord  # noqa: E402
from vllm_load.metrics.judge.client_health import ClientHealth  # noqa: E402
from vllm_load.metrics.stats import LLMStats  # noqa: E402
from vllm_load.metrics.summary import RunSummary  # noqa: E402
from vllm_load.plugin.webui import webui  # noqa: E402


def _stats(n: int, chunks: int, seed: int = 1) -> tuple[LLMStats, float]:
    rng = random.Random(seed)
    stats, t0 = LLMStats(), time.time() - n / 50.0
    for i in range(n):
        ttft = rng.lognormvariate(-3.5, 0.4)
        offs, t = [ttft], ttft
        for _ in range(chunks - 1):
            t += rng.lognormvariate(-4.6, 0.3)
            offs.append(t)
        stats.add(RequestRecord(api="chat", start=t0 + i / 50.0, e2e=t + 0.001, ok=True, ttft=ttft,
                                chunk_offsets=offs, chunk_tokens=[1] * chunks, output_tokens=chunks,
                                input_tokens=128, input_tokens_asked=128, tokens_from_usage=True,
                                name=f"turn {i % 4}", target=f"http://replica-{i % 2}:8000"))
    stats.fold()
    return stats, t0


def _time(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        out.append((time.perf_counter() - began) * 1000)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--chunks", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    health = ClientHealth()
    health.add("local", {"cpu": 30.0, "lag": 0.001, "streams": 16})
    print("| requests | chunks | summary made (ms, median / max) | a poll's rows and JSON (ms, median / max) |")
    print("|---:|---:|---:|---:|")
    for n in (int(x) for x in args.sizes.split(",")):
        stats, t0 = _stats(n, args.chunks)
        made = _time(lambda: webui.live_summary(stats, t0, health), args.repeat)
        summary = webui.live_summary(stats, t0, health)
        summary["server"] = None

        def poll() -> None:
            s = RunSummary.of(summary)
            rows = webui._summary_rows(s, [], False)
            named = webui._group_rows(s)
            json.dumps({"extended_stats": [{"key": "llm", "data": rows}, {"key": "llm_names", "data": named}]})

        polled = _time(poll, args.repeat)
        print(f"| {n:,} | {n * args.chunks:,} | {statistics.median(made):.1f} / {max(made):.1f} "
              f"| {statistics.median(polled):.2f} / {max(polled):.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
