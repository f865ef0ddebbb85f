"""The README's sample output, from a real run of the README's own first command (issue 76 item 2: the sample had
drifted from what the command prints: lines differed and several were missing).

    .venv/bin/python -m tests.readme_sample          # runs command 1 (30 s) and writes its block into README.md
    .venv/bin/python -m tests.readme_sample --check  # says whether the README's sample has the run's lines

The command is read from the README itself (its first set-up command, the part after the install), run in a
temporary folder against the embedded emulator, and vllm-load's block (from its metrics table to its last line) is
written between the README's ``readme-sample`` markers. ``tests/test_readme.py`` runs the command again and holds
the sample to it: the same lines, in the same order, each the same kind of line.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BEGIN, END = "<!-- readme-sample: begin (tests/readme_sample.py writes it) -->", "<!-- readme-sample: end -->"
#: where vllm-load's block starts in a run's output
FIRST = "vllm-load LLM metrics, run "


def command_one(readme: str) -> list[str]:
    """The locust part of the README's first set-up command (``# 1. …`` then ``… && .venv/bin/locust …``)."""
    lines = readme.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("# 1. "))
    return shlex.split(lines[at + 1].split("&&")[-1])


def run_command(args: list[str], cwd: Path, timeout: float = 240.0) -> subprocess.CompletedProcess:
    """``args`` as a user runs them from a checkout: ``.venv/bin/locust`` is this interpreter's Locust, the locustfile
    the checkout's; in ``cwd`` (its reports/ folder is the run's), with no ``VLLM_LOAD_*`` setting of this shell's."""
    assert Path(args[0]).name == "locust", args
    rest = [str(ROOT / a) if a.startswith("locustfiles/") else a for a in args[1:]]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_LOAD_")}
    return subprocess.run([sys.executable, "-m", "locust", *rest], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def block(output: str) -> list[str]:
    """vllm-load's block of a run's output: from its metrics table's title to the end."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(FIRST))
    return [line.rstrip() for line in lines[start:] if line.strip()]


def sample(readme: str) -> list[str]:
    """The README's sample block (between its markers, inside its code fence)."""
    inner = readme.split(BEGIN, 1)[1].split(END, 1)[0]
    return [line for line in inner.strip().removeprefix("```").removesuffix("```").strip("\n").splitlines()]


def kind(line: str) -> str:
    """What a line says, without its numbers: its first three words, each with a digit in it written ``#`` (a run id,
    a count, a time), so that two runs of one command print the same kinds of line."""
    return " ".join("#" if re.search(r"\d", w) else w for w in line.split()[:3])


def kinds(lines: list[str]) -> list[str]:
    """The kinds of ``lines``, but for the notes a busy machine adds (``note: local: the native reader read a chunk
    7.7 ms after it landed ...``): they say the machine's state during that run, not what the command prints."""
    return [kind(x) for x in lines if not x.startswith("note: ")]


def with_sample(readme: str, lines: list[str]) -> str:
    head, rest = readme.split(BEGIN, 1)
    return head + BEGIN + "\n```\n" + "\n".join(lines) + "\n```\n" + END + rest.split(END, 1)[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare the README's sample with a run; write nothing")
    a = ap.parse_args(argv)
    readme = README.read_text()
    with tempfile.TemporaryDirectory() as cwd:
        res = run_command(command_one(readme), Path(cwd))
    if res.returncode != 0:
        print(f"readme_sample: the command exited {res.returncode} (a busy machine? see its output):\n"
              + res.stdout[-3000:] + res.stderr[-3000:], file=sys.stderr)
        return 1
    got = block(res.stdout)
    if a.check:
        same = kinds(sample(readme)) == kinds(got)
        print("readme_sample: the README's sample has the run's lines" if same else
              "readme_sample: the README's sample differs from the run's lines:\n" + "\n".join(got))
        return 0 if same else 1
    README.write_text(with_sample(readme, got))
    print(f"readme_sample: {len(got)} lines written into README.md from a run of: {shlex.join(command_one(readme))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
