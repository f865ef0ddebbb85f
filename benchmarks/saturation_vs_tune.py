"""Capacity in one run: an exponential ramp with --stop-over-saturated against `vllm-load tune`'s bisection, on the
same emulator profile (cpu-tiny, --max-num-seqs 2: about 12 req/s at 128 in / 64 out tokens).

    python benchmarks/saturation_vs_tune.py [--runs 1] [--probe-duration 30s]

Prints per method: the capacity it found (the ramp: the completions per second while saturated, and the rate
offered at the onset; tune: the highest rate meeting TTFT p99 <= 2 s), and its wall time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import Proc, free_port  # noqa: E402


def ramp(tmp: Path) -> tuple[dict, float]:
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles/chat.py"), "--headless", "-u", "4",
                    "-r", "4", "-t", "45s", "--emulator-profile", "cpu-tiny", "--emulator-max-num-seqs", "2",
                    "--output-tokens", "64", "--ramp-up-strategy", "exponential", "--ramp-up-start-rps", "2",
                    "--ramp-up-end-rps", "40", "--stop-over-saturated", "--run-dir", str(tmp / "ramp")],
                   cwd=ROOT, capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - t0
    return json.loads((tmp / "ramp" / "summary.json").read_text())["summary"]["saturation"] or {}, wall


def tune(tmp: Path, probe: str) -> tuple[float | None, float, int]:
    emu = Proc(["-m", "server.emulator", "--port", str(free_port()), "--profile", "cpu-tiny", "--max-num-seqs", "2"])
    try:
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "vllm_load.cli", "tune", "--host", emu.url, "--search", "rate",
                        "--slo", "ttft.p99<=2s", "--start-level", "2", "--max-level", "64", "--probe-duration", probe,
                        "--probe-warmup", "5s" if probe == "30s" else "2s", "--rate-users", "4", "--out", str(tmp / "tune"), "--", "-f",
                        str(ROOT / "locustfiles/chat.py"), "--output-tokens", "64"],
                             cwd=ROOT, capture_output=True, text=True, timeout=1200)
        wall = time.monotonic() - t0
        if not (tmp / "tune" / "tune.json").exists():
            raise SystemExit(f"tune failed (exit {out.returncode}): {(out.stdout + out.stderr)[-2000:]}")
    finally:
        emu.stop()
    config = json.loads((tmp / "tune" / "tune.json").read_text())["configs"][0]
    return config["capacity"], wall, len(config.get("probes") or [])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--probe-duration", default="30s", help="the tune's probes (its default: 30s)")
    args = ap.parse_args()
    print(f"{'run':>3} {'method':<8} {'capacity req/s':>15} {'offered at onset':>17} {'wall s':>7} {'ratio to tune':>14}")
    for k in range(args.runs):
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            sat, ramp_s = ramp(tmp)
            cap, tune_s, probes = tune(tmp, args.probe_duration)
            found = sat.get("capacity_rps")
            ratio = f"{found / cap:.2f}" if found and cap else "-"
            print(f"{k + 1:>3} {'ramp':<8} {found or 0:>15.2f} {sat.get('offered') or 0:>17.2f} {ramp_s:>7.1f} "
                  f"{ratio:>14}")
            print(f"{k + 1:>3} {'tune':<8} {cap or 0:>15.2f} {'-':>17} {tune_s:>7.1f} {'1.00':>14}  ({probes} probes)")
            print(f"    ramp time / tune time: {ramp_s / tune_s:.2f}", flush=True)


if __name__ == "__main__":
    main()
