"""Agent sessions replayed by vllm-load and by AIPerf (0.13.0, the public AgentX yardstick's tool) from the same
Weka trace folder, against the same emulator, at the same concurrency and duration: what each sent (the server's
own counters: requests, prompt and output tokens, prefix-cache hits) and what each cost its machine (the whole
process tree's CPU, start to end, per answered request).

    python benchmarks/aiperf_side_by_side.py [--aiperf PATH] [--traces 40] [--concurrency 4] [--seconds 30]
        [--scenario]

--scenario: each under the AgentX rules, AIPerf's ``--scenario inferencex-agentx-mvp`` (with ``--unsafe-override``:
its 900 s minimum is longer than a benchmark here, so its run is marked not valid for submission) against vllm-load's
``--scenario agentx`` (t* in 25-75 % at one instant, idle gaps capped at 10 s, seed 42).

AIPerf is installed apart (it pins its own dependencies): python3 -m venv V && V/bin/pip install aiperf==0.13.0;
--aiperf V/bin/aiperf (default: ~/.cache/vllm-load/aiperf/venv/bin/aiperf).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _harness import ENV, ROOT, pinned, start_emulator

from server.sidecar.vllm_schema import parse_metrics  # noqa: F401  (the harness put the repo on the path)
from vllm_load.workload.tokenizer import _builtin_mistral_dir

MODEL = "emulator/mistral-7b-v0.1"
BLOCK = 64
COUNTERS = ("vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
            "vllm:prefix_cache_hits_total")


def weka_folder(folder: Path, traces: int, seed: int = 3) -> None:
    """Weka traces (AIPerf's format): calls whose blocks grow turn by turn (each repeats the last call's and adds
    its own), 1k-12k tokens of context, think times of 0.05-0.3 s, a subagent in every third trace."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(traces):
        t, requests, ids = 0.0, [], [1_000_000 * (s + 1) + i for i in range(rng.randint(12, 24))]
        for k in range(rng.randint(4, 8)):
            ids = ids + [ids[-1] + 1 + i for i in range(rng.randint(4, 24))]
            out = rng.randint(8, 48)
            if k == 1 and s % 3 == 0:
                sub = [ids[0] + 500_000 + i for i in range(16)]
                requests.append({"t": t, "type": "subagent", "agent_id": "agent_001", "subagent_type": "Explore",
                                 "status": "completed", "models": ["m"], "requests": [
                                     {"t": t, "type": "s", "model": "m", "in": BLOCK * len(sub) + 12, "out": 16,
                                      "hash_ids": sub, "api_time": 0.1}]})
            requests.append({"t": round(t, 3), "type": "s", "model": "m", "in": BLOCK * len(ids) + 12, "out": out,
                             "hash_ids": list(ids), "api_time": 0.2,
                             "think_time": round(rng.uniform(0.05, 0.3), 3) if k else None})
            t += 0.2 + 0.3
        (folder / f"trace_{s:03d}.json").write_text(json.dumps(
            {"id": f"trace_{s:03d}", "models": ["m"], "block_size": BLOCK, "hash_id_scope": "local",
             "requests": requests}))


def counters(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


def measured(cmd: list[str], url: str, cwd: Path) -> tuple[dict[str, float], float, float, int]:
    """(the server's counters' increase, the command's process tree CPU seconds, wall seconds, exit code)."""
    before, usage = counters(url), resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=ENV, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after, used = counters(url), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (used.ru_utime - usage.ru_utime) + (used.ru_stime - usage.ru_stime)  # every process it waited for
    return {k: after[k] - before[k] for k in COUNTERS}, cpu, wall, proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aiperf", default=str(Path.home() / ".cache/vllm-load/aiperf/venv/bin/aiperf"))
    ap.add_argument("--traces", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--scenario", action="store_true", help="both under the AgentX rules (see the docstring)")
    a = ap.parse_args()
    ours = ["--scenario", "agentx"] if a.scenario else []
    theirs = ["--scenario", "inferencex-agentx-mvp", "--unsafe-override"] if a.scenario else ["--random-seed", "1"]
    if not os.access(a.aiperf, os.X_OK):
        sys.exit(f"no AIPerf at {a.aiperf}: python3 -m venv V && V/bin/pip install aiperf==0.13.0, then --aiperf "
                 "V/bin/aiperf")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        weka_folder(root / "weka", a.traces)
        emu, url = start_emulator("--enable-prompt-tokens-details", "--max-model-len", "32768", core=1)
        try:
            tools = {
                "vllm-load": pinned(0, [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles" / "sessions.py"),
                                        "--headless", "-u", str(a.concurrency), "-r", str(a.concurrency), "-t",
                                        f"{a.seconds}s", "--host", url, "--sessions", str(root / "weka"),
                                        "--run-dir", str(root / "vllm-load"), "--only-summary", *ours]),
                "AIPerf 0.13.0": pinned(0, [a.aiperf, "profile", "--url", url, "--model", MODEL, "--tokenizer",
                                            str(_builtin_mistral_dir()), "--endpoint-type", "chat", "--streaming",
                                            "--custom-dataset-type", "weka_trace", "--input-file", str(root / "weka"),
                                            "--concurrency", str(a.concurrency), "--benchmark-duration",
                                            str(a.seconds), "--extra-inputs",
                                            "ignore_eos:true", "--use-server-token-count", "--ui", "none",
                                            "--no-server-metrics", "--no-gpu-telemetry", *theirs,
                                            "--output-artifact-dir", str(root / "aiperf")]),
            }
            print(f"{a.traces} Weka traces (subagents, 64-token blocks, 1k-12k tokens of context), concurrency "
                  f"{a.concurrency}, {a.seconds} s, the emulator on core 1, each tool on core 0; the server's counters\n")
            print("| tool | exit | requests | prompt tokens | output tokens | prefix-cache hits | hit share "
                  "| client CPU s | CPU ms per request | wall s |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            for name, cmd in tools.items():
                got, cpu, wall, code = measured(cmd, url, root)
                n = got["vllm:request_success_total"]
                prompt = got["vllm:prompt_tokens_total"]
                print(f"| {name} | {code} | {n:.0f} | {prompt:,.0f} | {got['vllm:generation_tokens_total']:,.0f} "
                      f"| {got['vllm:prefix_cache_hits_total']:,.0f} "
                      f"| {got['vllm:prefix_cache_hits_total'] / prompt if prompt else 0:.1%} | {cpu:.1f} "
                      f"| {cpu / n * 1000 if n else float('nan'):.1f} | {wall:.1f} |", flush=True)
            summary = json.loads((root / "vllm-load" / "summary.json").read_text())["summary"]
            print(f"\nvllm-load: {summary['requests']} requests, input drift {summary['input_drift_requests']} "
                  "(every prompt the length its trace row asked, by the server's count)")
            if a.scenario:  # each tool's own word on the rules
                stamp = summary.get("scenario") or {}
                print(f"vllm-load --scenario agentx: valid {stamp.get('valid')}; "
                      f"{'; '.join(stamp.get('invalid_reasons') or []) or 'every rule kept'}")
                for f in sorted((root / "aiperf").rglob("*.json")):
                    meta = (json.loads(f.read_text()) or {}).get("metadata") if f.stat().st_size < 50_000_000 else None
                    if isinstance(meta, dict) and "submission_valid" in meta:
                        print(f"AIPerf {meta.get('scenario')}: submission_valid {meta['submission_valid']}; "
                              f"{meta.get('submission_invalid_reasons') or ''} ({f.name})")
                        break
        finally:
            emu.kill()
            emu.wait()


if __name__ == "__main__":
    main()
