"""Timing accuracy and efficiency of one client process, scored against the emulator's own clock.

    python benchmarks/timing_accuracy.py [--streams 1,64,256,512] [--schedules fixed,jitter,lockstep,gpu]
                                         [--clients vllm-load,aiohttp] [--window 10] [--keep]

For each schedule, stream count and client, the emulator (core 1) serves a known schedule
(TTFT, then one token every ITL; ``jitter``: each drawn from value*(1 +- 0.5), seeded; ``lockstep``:
every stream emits on one global ITL grid, like a batched decode step) and writes, per stream, the
moment each token-bearing chunk had been written to its socket (``--timing-log``). The client
(core 0) is either one vllm-load Locust process (``locust -f locustfiles/completions.py``,
headless, which runs the same user code as one worker) or the asyncio/aiohttp client written like
vLLM's serving benchmark (``aiohttp_client.py``). Requests are joined to the truth by the server's
response id, and per request:

    TTFT error = client TTFT - (first chunk written - request reached the server's kernel)
    ITL error  = client gap between two chunks - the gap between their two writes
    E2E error  = client E2E - (the stream's last event written - request reached the server's kernel)

``--body-metrics`` has the emulator end each stream as vLLM does with ``--enable-per-request-metrics``: its
usage event carries the request's own times, a line vllm-load's C parser leaves to Python with the [DONE].

reported as |error| at p50 and p99 over every request and gap of the steady state: requests sent
after every stream was open and finished before the window closed (the spawn burst and Locust's own
stop, which inspects the stack for a log line while streams still run, are not the steady state).
The client's CPU time is sampled over that window and divided into the chunks received in it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
from _harness import ENV, ROOT, cpu_s, pinned, running, start_emulator

from vllm_load.rundir.reqlog import read_log

SCHEDULES = {"fixed": [], "jitter": ["--jitter", "0.5"], "lockstep": ["--lockstep"],
             # a GPU: every stream's tokens at the same decode-step ends, steps of 10/30/20/5/40 ms (a 5 ms gap
             # right after a 20 ms one); with one TTFT for all, requests finish and restart in waves
             "gpu": ["--lockstep", "--itl-cycle", "0.01,0.03,0.02,0.005,0.04"]}


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))]


@dataclass
class Result:
    schedule: str
    client: str
    streams: int
    requests: int = 0
    failed: int = 0
    chunks_per_s: float = 0.0
    client_cpu: float = 0.0  # share of one core over the window
    emulator_cpu: float = 0.0
    chunks_per_cpu_s: float = 0.0
    ttft_p50: float = 0.0
    ttft_p99: float = 0.0
    itl_p50: float = 0.0
    itl_p99: float = 0.0
    itl_p999: float = 0.0
    itl_max: float = 0.0
    ttft_max: float = 0.0
    e2e_p99: float = 0.0
    e2e_max: float = 0.0
    late_p99: float = 0.0  # emulator: written minus due
    ttft_n: int = 0
    gap_n: int = 0
    verdict: str = "-"  # vllm-load's own judgement of itself (summary.json's client verdict)


def client_cmd(client: str, url: str, streams: int, seconds: int, args: argparse.Namespace, out: Path) -> list[str]:
    if client == "aiohttp":
        return [sys.executable, str(ROOT / "benchmarks/aiohttp_client.py"), url, "--concurrency", str(streams),
                "--seconds", str(seconds), "--output-tokens", str(args.output_tokens), "--out", str(out / "requests.jsonl")]
    return [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles/completions.py"), "--headless",
            "-u", str(streams), "-r", str(streams), "-t", f"{seconds}s", "--host", url,
            "--input-tokens", "24", "--output-tokens", str(args.output_tokens), "--only-summary", "--run-dir", str(out)]


def run_one(schedule: str, client: str, streams: int, args: argparse.Namespace) -> Result:
    work = Path(tempfile.mkdtemp(prefix="vllm-load-timing-"))
    truth_file = work / "truth.jsonl"
    emu, url = start_emulator("--ttft", str(args.ttft), "--itl", str(args.itl), *SCHEDULES[schedule],
                              *(["--enable-per-request-metrics"] if args.body_metrics else []),
                              "--timing-log", str(truth_file), core=1)
    res = Result(schedule, client, streams)
    try:
        emu_proc = psutil.Process(emu.pid)
        out = work / "client"
        out.mkdir()
        seconds = int(args.window + 8)
        env = dict(ENV, VLLM_LOAD_NATIVE="0") if client == "vllm-load-py" else ENV
        cli = subprocess.Popen(pinned(0, client_cmd(client, url, streams, seconds, args, out)),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
        cli_proc = psutil.Process(cli.pid)
        deadline = time.monotonic() + 60
        while running(url) < 0.95 * streams:  # wait for every stream to be open (startup, spawn)
            if cli.poll() is not None:  # e.g. aiohttp missing: pip install -e '.[bench]'
                raise RuntimeError(f"{client} exited with code {cli.returncode} before opening {streams} streams "
                                   f"(run its command by hand to see why: {' '.join(client_cmd(client, url, streams, seconds, args, out))})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{client} did not open {streams} streams in 60 s")
            time.sleep(0.05)
        t_open = time.time()
        time.sleep(1.0)  # let the streams' phases settle before the measured window
        w0, c0, e0 = time.time(), cpu_s(cli_proc), cpu_s(emu_proc)
        time.sleep(args.window)
        w1, c1, e1 = time.time(), cpu_s(cli_proc), cpu_s(emu_proc)
        cli.wait(timeout=seconds + 60)
    finally:
        emu.terminate()
        emu.wait(timeout=10)
    records = []
    for f in sorted(out.glob("requests*.jsonl")):
        records.extend(read_log(f))
    truth = {}
    for line in truth_file.read_text().splitlines():
        t = json.loads(line)
        truth[t["id"]] = t
    ttft_err: list[float] = []
    gap_err: list[float] = []
    e2e_err: list[float] = []
    late: list[float] = []
    window_chunks = 0
    for r in records:
        res.requests += 1
        if not r["ok"]:
            res.failed += 1
            continue
        offs = r["chunk_offsets"]
        window_chunks += sum(1 for o in offs if w0 <= r["start"] + o < w1)
        if not offs or r["start"] < t_open or r["start"] + offs[-1] > w1:
            continue  # timing is scored in the steady state: not the spawn burst, not Locust's stop
        t = truth.get(r["response_id"])
        if t is None or len(t["sent"]) != len(offs):
            res.failed += 1
            continue
        sent = t["sent"]
        ttft_err.append(abs(offs[0] - sent[0]))
        gap_err.extend(abs((offs[i] - offs[i - 1]) - (sent[i] - sent[i - 1])) for i in range(1, len(offs)))
        if r.get("e2e") is not None:
            e2e_err.append(abs(r["e2e"] - t["done"]))
        late.extend(s - d for s, d in zip(sent, t["due"]))
    wall = w1 - w0
    res.chunks_per_s = window_chunks / wall
    res.client_cpu = (c1 - c0) / wall
    res.emulator_cpu = (e1 - e0) / wall
    res.chunks_per_cpu_s = window_chunks / max(c1 - c0, 1e-9)
    res.ttft_p50, res.ttft_p99 = pct(ttft_err, 50), pct(ttft_err, 99)
    res.itl_p50, res.itl_p99 = pct(gap_err, 50), pct(gap_err, 99)
    res.itl_p999, res.itl_max = pct(gap_err, 99.9), max(gap_err, default=float("nan"))
    res.ttft_max = max(ttft_err, default=float("nan"))
    res.e2e_p99, res.e2e_max = pct(e2e_err, 99), max(e2e_err, default=float("nan"))
    res.late_p99 = pct(late, 99)
    res.ttft_n, res.gap_n = len(ttft_err), len(gap_err)
    summary_file = out / "summary.json"
    if summary_file.exists():
        client = json.loads(summary_file.read_text())["summary"].get("client", {})
        res.verdict = ("untrustworthy: " + "; ".join(client["reasons"])) if client.get("saturated") else "trusted"
        res.verdict += f" [{','.join(client.get('readers', []))}]"
    if args.keep:
        print(f"kept {work}: client/ (run dir, request log) and truth.jsonl", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return res


def print_header(args: argparse.Namespace) -> None:
    print(f"emulator on core 1: TTFT {args.ttft * 1e3:g} ms, ITL {args.itl * 1e3:g} ms, {args.output_tokens} tokens "
          f"per request; client on core 0; |measured - true| in ms; CPU over a {args.window:g} s steady window")
    print(f"{'schedule':<9}{'client':<13}{'streams':>7}{'chunks/s':>9}{'cli CPU':>8}{'emu CPU':>8}{'chunks/CPU-s':>13}"
          f"{'TTFT p50':>9}{'TTFT p99':>9}{'TTFT max':>9}{'ITL p50':>8}{'ITL p99':>8}{'p99.9':>7}{'max':>7}"
          f"{'E2E p99':>8}{'max':>7}{'emu late p99':>13}{'TTFTs':>7}{'gaps':>8}"
          f"{'failed':>7}  verdict [reader]")


def print_row(r: Result) -> None:
    print(f"{r.schedule:<9}{r.client:<13}{r.streams:>7}{r.chunks_per_s:>9.0f}{100 * r.client_cpu:>7.0f}%"
          f"{100 * r.emulator_cpu:>7.0f}%{r.chunks_per_cpu_s:>13.0f}{r.ttft_p50 * 1e3:>9.3f}{r.ttft_p99 * 1e3:>9.3f}"
          f"{r.ttft_max * 1e3:>9.2f}{r.itl_p50 * 1e3:>8.3f}{r.itl_p99 * 1e3:>8.3f}{r.itl_p999 * 1e3:>7.2f}"
          f"{r.itl_max * 1e3:>7.2f}{r.e2e_p99 * 1e3:>8.3f}{r.e2e_max * 1e3:>7.2f}{r.late_p99 * 1e3:>13.3f}"
          f"{r.ttft_n:>7}{r.gap_n:>8}"
          f"{r.failed:>7}  {r.verdict}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", default="1,64,256,512")
    ap.add_argument("--schedules", default="fixed,jitter,lockstep")
    ap.add_argument("--clients", default="vllm-load,aiohttp",
                    help="vllm-load (its native reader where built), vllm-load-py (its Python reader: "
                         "VLLM_LOAD_NATIVE=0), aiohttp")
    ap.add_argument("--ttft", type=float, default=0.1)
    ap.add_argument("--itl", type=float, default=0.05, help="50 ms: a loaded server; 256 streams = 5k chunks/s")
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--window", type=float, default=8.0, help="seconds of the steady window whose CPU is measured")
    ap.add_argument("--body-metrics", action="store_true",
                    help="the emulator's usage event carries vLLM's per-request metrics (--enable-per-request-metrics)")
    ap.add_argument("--keep", action="store_true", help="keep each run's request log and truth for a closer look")
    args = ap.parse_args()
    bad = [s for s in args.schedules.split(",") if s not in SCHEDULES]
    if bad:
        sys.exit(f"timing_accuracy: unknown schedule {bad[0]!r}: use {', '.join(SCHEDULES)}")
    results = []
    print_header(args)
    for schedule in args.schedules.split(","):
        for streams in (int(s) for s in args.streams.split(",")):
            for client in args.clients.split(","):
                r = run_one(schedule, client, streams, args)
                results.append(r)
                print_row(r)
    pairs = {(r.schedule, r.streams): {} for r in results}
    for r in results:
        pairs[(r.schedule, r.streams)][r.client] = r
    both = [(k, v) for k, v in pairs.items() if "vllm-load" in v and "aiohttp" in v]
    if both:
        print("\nvllm-load / aiohttp, same server and schedule (chunks per CPU-second: higher is better for vllm-load "
              "above 1; timing error: lower is better for vllm-load below 1)")
        print(f"{'schedule':<9}{'streams':>7}{'chunks/CPU-s':>13}{'TTFT err p99':>13}{'ITL err p99':>12}")
        ratios = []
        for (schedule, streams), v in both:
            a, b = v["vllm-load"], v["aiohttp"]
            ratio = a.chunks_per_cpu_s / b.chunks_per_cpu_s
            ratios.append(ratio)
            print(f"{schedule:<9}{streams:>7}{ratio:>13.2f}{a.ttft_p99 / b.ttft_p99:>13.2f}{a.itl_p99 / b.itl_p99:>12.2f}")
        print(f"median chunks/CPU-s ratio: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
