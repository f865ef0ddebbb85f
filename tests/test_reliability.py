"""docs/reliability.md lists each hostile input with the test that proves it: every test it names exists (a renamed
or dropped test fails here, not silently in the list). ``python tests/test_reliability.py`` prints their node ids."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMED = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def named() -> list[tuple[str, str]]:
    return NAMED.findall((ROOT / "docs" / "reliability.md").read_text())


def test_every_test_the_reliability_list_names_exists():
    tests = named()
    assert len(tests) >= 20
    missing = []
    for path, name in tests:
        tree = ast.parse((ROOT / path).read_text())
        if name not in {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}:
            missing.append(f"{path}::{name}")
    assert not missing, missing


if __name__ == "__main__":
    sys.stdout.write(" ".join(f"{p}::{n}" for p, n in named()) + "\n")
