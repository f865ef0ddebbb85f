"""Does the fast selection catch real bugs? Each mutation below is a deliberate bug of a kind this project has had or
could have; the script applies it to a copy of the checkout, runs ``pytest -m 'not slow' -x`` there (the tests named
as likely to catch it first, then the whole fast selection), and prints a table: which test caught it, in how long.
A mutation the fast selection does not catch is a hole in the proof (the script exits 1).

    .venv/bin/python benchmarks/mutations.py              # all of them (~1-10 min each on 2 cores)
    .venv/bin/python benchmarks/mutations.py --only 3,9   # some of them

The table of the last run is in benchmarks/README.md ("Mutations").
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    what: str
    path: str  # the file, from the checkout's root
    original: str  # exactly once in it
    mutated: str
    first: tuple[str, ...]  # tests to run first (any of the fast selection may catch it)


MUTATIONS = (
    Mutation("one worker's histograms dropped in the master's merge", "vllm_load/plugin/swarm/wire.py",
             "    col.totals.merge(delta)\n",
             "    if len(col.workers_seen) > 1 and client_id == sorted(col.workers_seen)[-1]:\n"
             "        delta.hists.clear()\n"
             "    col.totals.merge(delta)\n",
             ("tests/test_e2e.py::test_master_and_two_workers_merge_exactly",)),
    Mutation("the steady window closes one request early", "vllm_load/plugin/load/generator.py",
             "            if self.tickets_taken == self.quota:",
             "            if self.tickets_taken == self.quota - 1:",
             ("tests/test_steady.py::test_a_count_ended_window_closes_as_its_last_request_starts", "tests/test_steady.py")),
    Mutation("TTFT and ITL swapped", "vllm_load/metrics/fold.py",
             "    h[ITL].record_many(chunk_gaps)\n",
             "    h[ITL].record_many([r.ttft for r in ok if r.ttft is not None])\n"
             "    h[TTFT].__init__()\n"
             "    h[TTFT].record_many(chunk_gaps)\n",
             ("tests/test_metrics.py", "tests/test_e2e.py")),
    Mutation("--num-requests ignored by one worker", "vllm_load/plugin/load/generator.py",
             "        if self.plan.num_requests:\n            if self.quota == 0:",
             "        if self.plan.num_requests and self.worker_index != 1:\n            if self.quota == 0:",
             ("tests/test_num_requests.py",)),
    Mutation("a cancelled request counted as an outage", "vllm_load/metrics/stats.py",
             "            if rec.cancelled:  # the run's end stopped it",
             "            if False:  # the run's end stopped it",
             ("tests/test_outages.py",)),
    Mutation("the routing verdict's achieved hits from the wrong request (the turn before, maybe another replica)",
             "vllm_load/metrics/fleet/routing.py",
             "            achieved += cur.get(\"cached_tokens\") or 0",
             "            achieved += prev.get(\"cached_tokens\") or 0",
             ("tests/test_routing.py",)),
    Mutation("a span joined to the wrong request (the one before it)", "vllm_load/metrics/fleet/spans.py",
             "        found = by_trace.get(r.get(\"trace_id\") or \"\")",
             "        found = by_trace.get(records[records.index(r) - 1].get(\"trace_id\") or \"\")",
             ("tests/test_spans.py", "tests/test_pd.py")),
    Mutation("gamma arrivals drawn per user, not from the run's one sequence", "vllm_load/plugin/load/users.py",
             "                due = Due(gen.take_arrival(), gen.schedule_start())",
             "                from vllm_load.plugin.load.open_loop import arrival_sequence\n"
             "                own = self.__dict__.setdefault('_own_arrivals', arrival_sequence(\n"
             "                    gen.plan, gen.opts, None, 0.0, 0.0, gen.worker_index))\n"
             "                due = Due(gen.schedule_start() + own.next(), gen.schedule_start())",
             ("tests/test_arrivals.py",)),
    Mutation("an SLO comparison inverted (<= judged as >=)", "vllm_load/metrics/judge/slo.py",
             "    \"<=\": operator.le,", "    \"<=\": operator.ge,",
             ("tests/test_slo.py",)),
    Mutation("a secret sent to the workers (the spawn message not scrubbed)", "vllm_load/plugin/swarm/worker_secrets.py",
             "            msg.data = {**msg.data, \"parsed_options\": scrub(msg.data[\"parsed_options\"])}",
             "            msg.data = {**msg.data}",
             ("tests/test_worker_secrets.py",)),
    Mutation("a rate schedule's segments read on a process's own clock, not the run's epoch",
             "vllm_load/plugin/load/generator.py",
             "            rec.segment = self.plan.schedule.segment_of(rec.start - epoch)",
             "            rec.segment = self.plan.schedule.segment_of(rec.start - self.start_wall)",
             ("tests/test_rate_schedule.py",)),
)


def _copy(dest: Path) -> None:
    ignore = shutil.ignore_patterns(".venv", ".git", "reports", "__pycache__", "*.pyc", ".pytest_cache")
    shutil.copytree(ROOT, dest, ignore=ignore, symlinks=True)


def _pytest(where: Path, args: list[str], timeout: float) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST") and k != "VLLM_LOAD_TEST_LOCKS"}
    env["PYTHONPATH"] = str(where)  # the mutated copy's package, before the installed (editable) one
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *args], cwd=where,
                          env=env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def _first_failure(output: str) -> str:
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" ", 1)[1].split(" - ")[0]
    return "?"


def run(m: Mutation, workers: int) -> tuple[bool, str, float]:
    """(caught, by which test, seconds) for one mutation on a fresh copy."""
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vllm-load-mutant-") as tmp:
        copy = Path(tmp) / "checkout"
        _copy(copy)
        target = copy / m.path
        text = target.read_text()
        if text.count(m.original) != 1:
            raise SystemExit(f"mutation {m.what!r}: its original text is in {m.path} {text.count(m.original)} times "
                             "(the code moved: update the mutation)")
        target.write_text(text.replace(m.original, m.mutated))
        for args in ([*m.first, "-m", "not slow"], ["-n", str(workers), "-m", "not slow", "tests"]):
            code, out = _pytest(copy, args, timeout=1800)
            if code == 1:  # a test failed: caught
                return True, _first_failure(out), time.monotonic() - began
            if code not in (0, 5):  # 5: no test selected
                raise SystemExit(f"mutation {m.what!r}: pytest exited {code}:\n{out[-3000:]}")
    return False, "-", time.monotonic() - began


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated mutation numbers (1-based)")
    ap.add_argument("-n", type=int, default=6, help="pytest -n for the whole fast selection")
    args = ap.parse_args(argv)
    chosen = [int(x) for x in args.only.split(",") if x.strip()] or list(range(1, len(MUTATIONS) + 1))
    rows = []
    for i in chosen:
        m = MUTATIONS[i - 1]
        caught, by, seconds = run(m, args.n)
        rows.append((i, m.what, "yes" if caught else "NO", by, seconds))
        print(f"{i:>2}. {m.what}: {'caught by ' + by if caught else 'NOT CAUGHT'} ({seconds:.0f} s)", flush=True)
    print("\n| # | mutation | caught | first failing test | s |\n|---|---|---|---|---|")
    for i, what, caught, by, seconds in rows:
        print(f"| {i} | {what} | {caught} | `{by}` | {seconds:.0f} |")
    return 0 if all(r[2] == "yes" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
