"""What parsing one OTLP span export costs the event loop that times the streams (``--otlp-receiver``,
``plugin/sources/span_receiver.py``): the export parsed on the loop, as it was, against in gevent's thread pool,
as it is. Each size is parsed --repeat times each way while a greenlet wakes every 5 ms; the table gives the
median parse time and the loop's median and worst wait past its 5 ms.

    .venv/bin/python benchmarks/span_parse.py [--spans 5000,40000] [--repeat 5]

vLLM's batch exporter sends at most 512 spans (~0.2 MB) at a time; a receiver takes up to 16 MB (MAX_BODY).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import gevent

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vllm_load.metrics.fleet.spans import ATTRIBUTES, export_request, parse_export  # noqa: E402

TICK = 0.005


def _watch(lags: list[float]) -> None:
    last = time.perf_counter()
    while True:
        gevent.sleep(TICK)
        now = time.perf_counter()
        lags.append(now - last - TICK)
        last = now


def _once(body: bytes, threaded: bool) -> tuple[float, float]:
    """(parse seconds, the loop's worst wait past its tick) for one parse."""
    lags: list[float] = []
    watcher = gevent.spawn(_watch, lags)
    gevent.sleep(0.05)
    t = time.perf_counter()
    if threaded:
        gevent.get_hub().threadpool.apply(parse_export, (body,))
    else:
        parse_export(body)
    took = time.perf_counter() - t
    gevent.sleep(0.02)
    watcher.kill()
    return took, max(lags)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spans", default="512,5000,40000")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    keys = list(ATTRIBUTES.values())[:8]
    print(f"{'spans':>7} {'MB':>6} {'where':>7} {'parse ms (median)':>18} {'loop wait ms (median)':>22} "
          f"{'loop wait ms (worst)':>21}")
    for n in (int(x) for x in args.spans.split(",")):
        body = export_request({"trace_id": os.urandom(16).hex(), "start": 1.0, **{k: 1.5 for k in keys}}
                              for _ in range(n))
        for where, threaded in (("loop", False), ("thread", True)):
            runs = [_once(body, threaded) for _ in range(args.repeat)]
            took, waits = [r[0] for r in runs], [r[1] for r in runs]
            print(f"{n:>7} {len(body) / 1e6:>6.1f} {where:>7} {statistics.median(took) * 1000:>18.1f} "
                  f"{statistics.median(waits) * 1000:>22.1f} {max(waits) * 1000:>21.1f}")


if __name__ == "__main__":
    main()
