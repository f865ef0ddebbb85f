"""The layering docs/architecture.md promises, checked over the source: only ``plugin/`` (and the packaged
locustfiles) import Locust, and no request-path module decides how to read a connection by probing a socket."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "vllm_load"


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
    return out


def test_only_the_plugin_imports_locust():
    offenders = [str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                 if "locust" in _imports(p) and p.relative_to(PKG).parts[0] not in ("plugin", "locustfiles")]
    assert offenders == []


def test_no_socket_is_probed_in_the_request_path():
    probe = re.compile(r"(hasattr|getattr)\(\s*(sock|raw|resp|transport|sink|conn)\b")
    path = [*(PKG / "client").glob("*.py"), PKG / "plugin" / "transport_session.py", PKG / "plugin" / "llm.py"]
    offenders = [f"{p.name}:{i}" for p in path for i, line in enumerate(p.read_text().splitlines(), 1)
                 if probe.search(line)]
    assert offenders == []
