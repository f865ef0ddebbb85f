"""Exact long contexts at speed: what preparing an agent's turn costs one core, counted in full (as before) and
from its counted history (``workload/history.py``, ``PromptFactory.from_blocks``); and a session trace growing to
100k tokens of context replayed through the emulator, client CPU per turn, both ways.

    python benchmarks/long_context.py [--lengths 8000,32000,128000] [--repeats 5] [--no-replay]

Every prompt's count is checked here against a full count of the same text; the replay's against the server's usage.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _harness import ENV, ROOT, pinned, start_emulator

from vllm_load.workload.history import HistoryCounter
from vllm_load.workload.prompts import PromptFactory
from vllm_load.workload.tokenizer import BUILTIN_MISTRAL, load_tokenizer

BLOCK = 64


def cpu_ms(fn) -> tuple[float, object]:
    t = time.process_time()
    out = fn()
    return (time.process_time() - t) * 1e3, out


def session_turn(tok, n: int, repeats: int) -> tuple[float, float]:
    """(full, incremental) CPU ms of the next session turn of ``n`` tokens: the previous turn's blocks and one more."""
    full_f, fast_f = PromptFactory(tok, "chat", "bench"), PromptFactory(tok, "chat", "bench")
    full_f.words_add_up = False  # the path every turn took before: the whole text counted until exact
    ids = tuple(range(n // BLOCK + 2))
    fast_f.from_blocks(ids[:-2], BLOCK, n - BLOCK)  # the previous turn: its blocks drawn
    full, fast = [], []
    for r in range(repeats):
        ms, a = cpu_ms(lambda: full_f.from_blocks(ids, BLOCK, n - r))
        full.append(ms)
        ms, b = cpu_ms(lambda: fast_f.from_blocks(ids, BLOCK, n - r))
        fast.append(ms)
        assert a.tokens == b.tokens == n - r == fast_f.count(b), (a.tokens, b.tokens, n - r)
    return statistics.median(full), statistics.median(fast)


def chat_turn(tok, n: int, repeats: int) -> tuple[float, float]:
    """(full, from history) CPU ms of counting a conversation's next turn that adds ~600 tokens to ``n``."""
    f = PromptFactory(tok, "chat", "bench")
    history = [{"role": "user", "content": f.make(n).messages[-1]["content"]}]
    counter = HistoryCounter(tok)
    counter.count_chat(history)
    full, fast = [], []
    rng = random.Random(1)
    for _ in range(repeats):
        history += [{"role": "assistant", "content": f.make(300).messages[-1]["content"]},
                    {"role": "user", "content": f.make(rng.randint(200, 400)).messages[-1]["content"]}]
        ms, a = cpu_ms(lambda: tok.count_chat(history))
        full.append(ms)
        ms, b = cpu_ms(lambda: counter.count_chat(history))
        fast.append(ms)
        assert a == b, (a, b)
    assert counter.incremental == repeats
    return statistics.median(full), statistics.median(fast)


def sessions_file(path: Path, sessions: int, turns: int, top: int) -> int:
    """Sessions whose context grows by equal steps to ``top`` tokens (each turn: the last one's blocks and new ones)."""
    step = top // turns // BLOCK
    rows = []
    for s in range(sessions):
        base = 1_000_000 * (s + 1)
        rows.append({"session_id": f"s{s}", "block_size": BLOCK, "turns": [
            {"input_tokens": BLOCK * step * (k + 1), "output_tokens": 8, "delay": 0,
             "hash_ids": list(range(base, base + step * (k + 1)))} for k in range(turns)]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return sessions * turns


FULL_COUNT_PLUGIN = '''"""The replay with every turn counted in full (how it ran before): the benchmark's baseline only."""
import vllm_load.workload.prompts as prompts
prompts._words_add_up = lambda tok: False
from vllm_load.locustfiles.sessions import SessionReplay  # noqa: E402,F401
'''


def replay(url: str, trace: Path, locustfile: str, users: int, run_dir: Path) -> tuple[float, int, float]:
    """(client CPU s, turns answered, wall s) of one headless replay, the load generator pinned to core 0."""
    cmd = pinned(0, [sys.executable, "-m", "locust", "-f", locustfile, "--headless", "-u", str(users), "-r",
                     str(users), "-t", "900s", "--host", url, "--sessions", str(trace), "--run-dir", str(run_dir),
                     "--only-summary"])
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t
    summary = json.loads((run_dir / "summary.json").read_text())
    run = summary["summary"]
    assert run["input_drift_requests"] == 0, run["input_drift_requests"]  # every count the server's
    return usage.ru_utime + usage.ru_stime, int(run["succeeded"]), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="8000,32000,128000")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-replay", action="store_true")
    a = ap.parse_args()
    tok = load_tokenizer(BUILTIN_MISTRAL)
    print(f"one turn's preparation, CPU ms of one core (median of {a.repeats}; {BUILTIN_MISTRAL})\n")
    print("| context tokens | session turn, full count | session turn, from blocks | ratio "
          "| chat turn, full count | chat turn, from history | ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in (int(x) for x in a.lengths.split(",")):
        sf, ss = session_turn(tok, n, a.repeats)
        cf, cs = chat_turn(tok, n, a.repeats)
        print(f"| {n:,} | {sf:.1f} | {ss:.2f} | {sf / ss:.0f}x | {cf:.1f} | {cs:.2f} | {cf / cs:.0f}x |", flush=True)
    if a.no_replay:
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        trace = root / "sessions.jsonl"
        turns = sessions_file(trace, sessions=4, turns=25, top=100_000)
        sessions_file(root / "start.jsonl", sessions=4, turns=1, top=4 * BLOCK)  # the run's start and end alone
        (root / "full_count.py").write_text(FULL_COUNT_PLUGIN)
        emu, url = start_emulator("--max-model-len", "131072", "--ttft", "0.005", "--itl", "0.002", core=1)
        try:
            print(f"\n{turns} turns of 4 sessions growing to 100k tokens of context, replayed through the emulator "
                  "(load generator on core 0, emulator on core 1)\n")
            print("| counting | turns answered | client CPU s | of which start and end | CPU ms per turn "
                  "| turns per client CPU-second | wall s |")
            print("|---|---:|---:|---:|---:|---:|---:|")
            for label, lf in (("full (before)", str(root / "full_count.py")),
                              ("from blocks (now)", str(ROOT / "locustfiles" / "sessions.py"))):
                base, _, _ = replay(url, root / "start.jsonl", lf, 4, root / (label.split()[0] + "-start"))
                cpu, done, wall = replay(url, trace, lf, 4, root / label.split()[0])
                per = (cpu - base) / (done - 4)
                print(f"| {label} | {done} | {cpu:.2f} | {base:.2f} | {per * 1e3:.1f} | {1 / per:.0f} | {wall:.1f} |",
                      flush=True)
        finally:
            emu.kill()
            emu.wait()


if __name__ == "__main__":
    main()
