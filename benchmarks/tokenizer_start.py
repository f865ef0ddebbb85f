"""The built-in tokenizer's cost, read without transformers (workload/builtin_backend.py) against the same folder
through transformers' ``AutoTokenizer`` (how every load went before): a fresh process's load, then the prompt
thread's per-call work (a chat rendered, a chat counted), and a whole Locust run against the embedded emulator.

    python benchmarks/tokenizer_start.py [--runs 5] [--locust-runs 3] [--before DIR]

``--before DIR``: a checkout of the code before the change (e.g. ``git worktree add DIR 0bfb486``), whose Locust run
is timed beside this one's.

Prints a table of medians (and the worst) per backend; every count is checked equal between the two.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

from _harness import ENV, ROOT

LOAD = """
import json, os, resource, sys, time
t0 = time.process_time()
from vllm_load.workload.tokenizer import BUILTIN_MISTRAL, _builtin_mistral_dir, load_tokenizer
if sys.argv[1] == "transformers":
    import transformers
    hf = transformers.AutoTokenizer.from_pretrained(str(_builtin_mistral_dir()))
    from vllm_load.workload.tokenizer import Tokenizer
    tok = Tokenizer(name="builtin", hf=hf)
else:
    tok = load_tokenizer(BUILTIN_MISTRAL)
loaded = time.process_time() - t0
chats = [[{"role": "user", "content": f"question {i} about the weather in town number {i}"}] for i in range(2000)]
t = time.perf_counter(); texts = [tok.render_chat(c) for c in chats]; render = (time.perf_counter() - t) / len(chats)
t = time.perf_counter(); counts = [tok.count_chat(c) for c in chats]; count = (time.perf_counter() - t) / len(chats)
print(json.dumps({"load_cpu": loaded, "render_us": render * 1e6, "count_us": count * 1e6, "sum": sum(counts),
                  "transformers": "transformers" in sys.modules}))
"""


def load(backend: str) -> dict:
    out = subprocess.run([sys.executable, "-c", LOAD, backend], cwd=ROOT, env=ENV, capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def locust_run(cwd: str, checkout: str) -> tuple[float, float]:
    """(wall s, CPU s of the process tree) of a 3 s run of 2 users against the embedded emulator, ``checkout``'s
    code."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "locust", "-f", f"{checkout}/locustfiles/chat.py", "--headless", "-u", "2",
                    "-r", "2", "-t", "3s", "--allow-untrustworthy", "--run-dir", f"{cwd}/run-{time.time_ns()}"], cwd=cwd,
                   env=dict(ENV, PYTHONPATH=checkout), capture_output=True, timeout=120, check=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--locust-runs", type=int, default=3)
    ap.add_argument("--before", default="", help="a checkout of the code before the change, timed beside this one")
    a = ap.parse_args()
    rows = {b: [load(b) for _ in range(a.runs)] for b in ("builtin", "transformers")}
    sums = {r["sum"] for b in rows for r in rows[b]}
    assert len(sums) == 1, f"the two backends counted differently: {sums}"
    print(f"tokenizer load in a fresh process, {a.runs} runs each (median, worst); the same counts from both: "
          f"{sums.pop():,} tokens over 2,000 chats")
    print("| backend | load CPU s | render a chat us | count a chat us | transformers imported |")
    print("|---|---|---|---|---|")
    for b, rs in rows.items():
        def cell(k: str, fmt: str) -> str:
            vals = [r[k] for r in rs]
            return f"{statistics.median(vals):{fmt}} ({max(vals):{fmt}})"
        print(f"| {b} | {cell('load_cpu', '.2f')} | {cell('render_us', '.1f')} | {cell('count_us', '.1f')} | "
              f"{rs[0]['transformers']} |")
    if a.locust_runs:
        print(f"\na Locust run against the embedded emulator (-u 2 -t 3s), {a.locust_runs} runs each, alternating "
              "(median wall s, CPU s of the process tree)")
        print("| code | wall s | CPU s |")
        print("|---|---|---|")
        checkouts = {"this checkout": str(ROOT), **({"before": a.before} if a.before else {})}
        with tempfile.TemporaryDirectory() as d:
            runs: dict[str, list] = {k: [] for k in checkouts}
            for _ in range(a.locust_runs):
                for k, path in checkouts.items():
                    runs[k].append(locust_run(d, path))
        for k, rs in runs.items():
            print(f"| {k} | {statistics.median(w for w, _ in rs):.2f} | {statistics.median(c for _, c in rs):.2f} |")


if __name__ == "__main__":
    main()
