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


def test_each_c_extension_has_a_stub_that_matches_it():
    """``_rxnative.pyi`` names every method the C Reader has (and no other), and ``sse.Parsed`` names every field
    of the tuple the C parser returns."""
    from vllm_load.client import _rxnative
    from vllm_load.client.sse import Parsed

    stub = ast.parse((PKG / "client" / "_rxnative.pyi").read_text())
    reader = next(n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == "Reader")
    stubbed = {f.name for f in reader.body if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")}
    assert stubbed == {n for n in dir(_rxnative.Reader) if not n.startswith("_")}
    parsed, _taken = _rxnative.parse_sse([(b"data: [DONE]\n", 1)], 0.0)
    assert len(parsed) == len(Parsed._fields)
    hdr = ast.parse((PKG / "metrics" / "_hdrnative.pyi").read_text())
    from vllm_load.metrics import _hdrnative
    assert {f.name for f in hdr.body if isinstance(f, ast.FunctionDef)} == {
        n for n in dir(_hdrnative) if not n.startswith("_")}
