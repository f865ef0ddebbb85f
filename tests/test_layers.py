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
    """And ``testing``, which builds Locust's environments and runners as ``locust`` does (at the top layer)."""
    offenders = [str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                 if "locust" in _imports(p) and p.relative_to(PKG).parts[0] not in ("plugin", "locustfiles", "testing")]
    assert offenders == []


def test_no_socket_is_probed_in_the_request_path():
    probe = re.compile(r"(hasattr|getattr)\(\s*(sock|raw|resp|transport|sink|conn)\b")
    path = [*(PKG / "client").glob("*.py"), PKG / "plugin" / "requests" / "transport_session.py",
            PKG / "plugin" / "requests" / "llm.py"]
    offenders = [f"{p.name}:{i}" for p in path for i, line in enumerate(p.read_text().splitlines(), 1)
                 if probe.search(line)]
    assert offenders == []


def test_each_c_extension_has_a_stub_that_matches_it():
    """``_rxnative.pyi`` names every method the C Reader has (and no other), every field of each named result
    (the SSE parser's ``Parsed`` among them) in C's order, and every constant."""
    from vllm_load.client import _rxnative

    stub = ast.parse((PKG / "client" / "_rxnative.pyi").read_text())
    reader = next(n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == "Reader")
    stubbed = {f.name for f in reader.body if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")}
    assert stubbed == {n for n in dir(_rxnative.Reader) if not n.startswith("_")}
    parsed, _taken = _rxnative.parse_sse([(b"data: [DONE]\n", 1)], 0.0)
    assert type(parsed) is _rxnative.Parsed and parsed.done and parsed.done_at == 1e-9
    # each named result's fields, in C's order, are the stub class's annotations; the body states its constants
    for name in ("Accepted", "Taken", "Drained", "Lag", "Parsed"):
        cls = next(n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == name)
        fields = [f.target.id for f in cls.body if isinstance(f, ast.AnnAssign)]
        c_type = getattr(_rxnative, name)
        made = c_type(tuple(range(c_type.n_fields)))
        assert len(fields) == c_type.n_fields and [getattr(made, f) for f in fields] == list(range(len(fields))), name
    constants = {n.target.id for n in stub.body if isinstance(n, ast.AnnAssign)}
    assert {n for n in dir(_rxnative) if n.isupper()} == constants
    hdr = ast.parse((PKG / "metrics" / "_hdrnative.pyi").read_text())
    from vllm_load.metrics import _hdrnative
    assert {f.name for f in hdr.body if isinstance(f, ast.FunctionDef)} == {
        n for n in dir(_hdrnative) if not n.startswith("_")}


#: the packages from the bottom up: a module imports from its own package or one listed before it, never after
#: (``report`` once imported the plugin's options, which now sit at the bottom; ``runtime`` holds what a load
#: process runs on besides Locust, and the sidecar and ``tune`` import it rather than the plugin)
LAYERS = (("version", "errors", "check", "redact", "lifeline", "host_names", "option_spec", "feature_spec", "features", "emulator_options", "options",
           "option_docs", "metric_table"), ("workload",), ("client",), ("runtime",),
          ("metrics",), ("rundir",), ("report",), ("history",), ("plugin",), ("locustfiles", "tune"), ("cli", "__init__"),
          ("testing",))


def _layer(name: str) -> int:
    return next(i for i, names in enumerate(LAYERS) if name in names)


def test_no_import_runs_upward():
    """``from vllm_load import __version__`` is an import of the package's face (``__init__``, top layer: its lazy
    exports point at the plugin), not of a module: it counts as one (report/ once did it unseen). The shipped
    locustfiles import ``LLMUser`` from it as every user's locustfile does."""
    known = {m for layer in LAYERS for m in layer}
    offenders = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).parts
        here = rel[0] if len(rel) > 1 else rel[0][:-3]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "vllm_load":
                parts = node.module.split(".")
                names = [parts[1]] if len(parts) > 1 else [a.name if a.name in known else "__init__"
                                                            for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name.split(".")[1] for a in node.names if a.name.startswith("vllm_load.")]
            else:
                continue
            offenders += [f"{'/'.join(rel)} -> {n}" for n in names if n in known and _layer(n) > _layer(here)
                          and not (here == "locustfiles" and n == "__init__")]  # a locustfile is user code
    assert offenders == []


def test_the_servers_do_not_import_the_plugin():
    server = PKG.parent / "server"
    offenders = [str(p.relative_to(server)) for p in server.rglob("*.py") if "vllm_load.plugin" in p.read_text()]
    assert offenders == []


def test_the_plugin_runtime_is_one_object_per_role():
    """No process-wide state object, no branching on the role outside the one place that picks the role's class
    (``roles.make``), and the import-time hooks stay a few lines: each role's object registers the rest."""
    plugin = PKG / "plugin"
    sources = {p.name: p.read_text() for p in plugin.rglob("*.py")}
    assert not (plugin / "state.py").exists()
    assert [n for n, s in sources.items() if re.search(r"\bSTATE\b", s)] == []
    role_test = re.compile(r"\brole\s*(==|!=|in)\s|isinstance\([^)]*(Master|Worker|Local)Runner|__name__ == \"\w+Runner")
    found = [(n, i) for n, s in sources.items() for i, line in enumerate(s.splitlines(), 1) if role_test.search(line)]
    assert {n for n, _ in found} == {"roles.py"} and len(found) <= 2, found
    assert len(sources["listeners.py"].splitlines()) < 80
    hooks = re.findall(r"@events\.(\w+)\.add_listener", "".join(sources.values()))
    assert hooks == ["init_command_line_parser"]
    # init and test_start, put on an environment's events by ``attach`` (Locust's global ones at import)
    assert re.findall(r"hooks\.(\w+)\.add_listener", sources["listeners.py"]) == ["init", "test_start"]
    assert re.findall(r"^attach\((\w+)\)$", sources["listeners.py"], re.M) == ["events"]


def test_no_plugin_function_is_over_40_lines():
    """The plugin's lifecycle grew into functions of 100-150 lines (the init listener, the web UI's install): each
    now does one thing (nested functions count with the function that holds them)."""
    long = [f"{p.name}:{n.name} {n.end_lineno - n.lineno + 1}" for p in (PKG / "plugin").rglob("*.py")
            for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > 40]
    assert long == []


#: names of other programs' formats that equal a metric key, each read where that format is parsed: (module,
#: string) -> how often it is written there
FOREIGN_NAMES = {
    ("client/apis/responses.py", "input_tokens"): 1,  # the Responses API's usage
    ("client/apis/responses.py", "output_tokens"): 1,
    ("client/apis/messages.py", "input_tokens"): 2,  # Anthropic's Messages usage
    ("client/apis/messages.py", "output_tokens"): 2,
    ("client/sse.py", "reasoning_tokens"): 1,  # usage_details: chat's and the Responses API's usage details
    ("workload/inputs/trace.py", "input_tokens"): 1,  # a trace file's column names, as other tools write them
    ("workload/inputs/trace.py", "output_tokens"): 1,
    ("report/exports/vllm_result.py", "ttft"): 1,  # vllm bench serve's result names (mean_ttft_ms, ...)
    ("report/exports/vllm_result.py", "tpot"): 1,
    ("report/exports/vllm_result.py", "itl"): 1,
    ("report/exports/mlperf_result.py", "ttft"): 1,  # MLPerf Endpoints' Report fields (ttft, tpot: its rollups' names)
    ("report/exports/mlperf_result.py", "tpot"): 1,
    ("report/load.py", "input_tokens"): 1,  # config.json's options: --input-tokens and --output-tokens as asked
    ("report/load.py", "output_tokens"): 1,
}


def test_every_metric_key_is_written_once_in_the_metric_table():
    """The table names each key once, as a constant; no other module writes one as a string (an f-string's
    subscript included), so a renamed or mistyped key cannot drift from the table."""
    from vllm_load import metric_table

    constants = {v for k, v in vars(metric_table).items() if k.isupper() and isinstance(v, str)}
    assert constants == set(metric_table.BY_KEY)
    found: dict[tuple[str, str], int] = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).as_posix()
        if rel == "metric_table.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in constants:
                found[(rel, node.value)] = found.get((rel, node.value), 0) + 1
    assert found == FOREIGN_NAMES


def test_the_summary_is_read_by_attribute():
    """A ``RunSummary``'s fields are read as attributes (an absent one is None), each metric's statistics through
    ``metric_stats``: no ``summary["requests"]`` or ``s.get("energy")`` on a value named as a summary (``summary``,
    ``s``, ``steady``, ``….summary``), where a misspelt key would read as missing instead of failing."""
    from vllm_load.metrics.summary import _FIELDS

    found = []
    for path in PKG.rglob("*.py"):
        if path.relative_to(PKG).as_posix() == "metrics/summary.py":  # the summary's own file form and upgrades
            continue
        for node, base, key in _key_reads(ast.parse(path.read_text())):
            name = ast.unparse(base)
            if key in _FIELDS and (name in ("summary", "s", "steady") or name.endswith(".summary")):
                found.append(f"{path.relative_to(PKG)}:{node.lineno}: {name}[{key!r}]")
    assert found == []


def _key_reads(scope: ast.AST):
    """Each read by a constant key under ``scope``: ``x["k"]`` and ``x.get("k")``, as (node, x, "k")."""
    for node in ast.walk(scope):
        if isinstance(node, ast.Subscript):
            base, key = node.value, node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and node.args:
            base, key = node.func.value, node.args[0]
        else:
            continue
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            yield node, base, key.value


def _part_reads(tree: ast.AST) -> list[tuple[int, str, str]]:
    """Each read by string key of a summary part's declared key: ``s.client["reasons"]``, ``(s.client or
    {}).get("cause")``, ``client["advice"]`` (a name as the part's field), ``e["gpus"]`` after ``e = s.energy`` or
    for a parameter ``e: Energy``, ``w["text"]`` for ``w`` in ``s.outages`` (inside that loop): (line, the value
    read, the key)."""
    from vllm_load.metrics.summary_parts import SUMMARY_PARTS

    def first(expr: ast.AST) -> ast.AST:
        return expr.values[0] if isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.Or) else expr

    def part_of(expr: ast.AST, loops: dict[str, type]) -> type | None:
        expr = first(expr)
        if isinstance(expr, ast.Name) and expr.id in loops:
            return loops[expr.id]
        field = expr.attr if isinstance(expr, ast.Attribute) else expr.id if isinstance(expr, ast.Name) else None
        shape, cls = SUMMARY_PARTS.get(field, ("", None))
        return cls if shape == "one" else None

    def reads(scope: ast.AST, loops: dict[str, type]) -> set[tuple[int, int, str, str]]:
        out = set()
        for node, base, key in _key_reads(scope):
            cls = part_of(base, loops)
            if cls is not None and key in cls.declared():
                out.add((node.lineno, node.col_offset, ast.unparse(base), key))
        return out

    found = reads(tree, {})
    classes = {cls.__name__: cls for _, cls in SUMMARY_PARTS.values()}
    for fn in ast.walk(tree):  # in a function: a parameter annotated as a part, a name given a part (e = s.energy)
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = {a.arg: classes[n.id] for a in fn.args.args + fn.args.kwonlyargs if a.annotation is not None
                     for n in ast.walk(a.annotation) if isinstance(n, ast.Name) and n.id in classes}
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    cls = part_of(node.value, {})
                    if cls is not None:
                        names[node.targets[0].id] = cls
            found |= reads(fn, names)
    for node in ast.walk(tree):  # a loop over a list of parts (outages, profiled): its name, inside the loop
        loops = node.generators if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)) \
            else [node] if isinstance(node, ast.For) else []
        for loop in loops:
            it = first(loop.iter)
            shape, cls = SUMMARY_PARTS.get(it.attr if isinstance(it, ast.Attribute) else "", ("", None))
            if shape == "list" and isinstance(loop.target, ast.Name):
                found |= reads(node, {loop.target.id: cls})
    return [(line, base, key) for line, _, base, key in sorted(found)]


def test_the_summary_parts_are_read_by_attribute():
    """The summary's nested parts (``summary_parts``: the client's verdict, timing, saturation, energy,
    trace, clock, outages, profiler windows) are read by their declared keys as attributes: none is read by string
    key anywhere in the package (the parts' own module, which declares them, aside)."""
    found = []
    for path in PKG.rglob("*.py"):
        if path.relative_to(PKG).as_posix() == "metrics/summary_parts.py":
            continue
        found += [f"{path.relative_to(PKG)}:{line}: {base}[{key!r}]"
                  for line, base, key in _part_reads(ast.parse(path.read_text()))]
    assert found == []
    # the scan finds each way a part was read before (so that passing is not its blindness)
    old = ('c = s.client or {}\nc.get("reasons")\ns.client["cause"]\n(s.client or {}).get("saturated")\n'
           'client["advice"]\nrun.summary.saturation["text"]\nfor w in (s.outages or []): w["outage"]\n'
           '[w["text"] for w in summary.outages]\ns.timing.get("tails")\nenergy.get("gpus")\n'
           'def f(s, r: Saturation | None):\n    t = s.trace\n    t["sent"]\n    r["onset_s"]\n')
    assert [k for _, _, k in _part_reads(ast.parse(old))] == ["cause", "saturated", "advice", "text", "outage", "text",
                                                             "tails", "gpus", "sent", "onset_s"]


def test_the_controller_is_its_parts():
    """The controller within 225 lines besides its imports (it was 473, importing 21 of plugin/'s modules; its parts are objects of their
    own). The 350-line cap every module had is gone: it squeezed hubs (generator.py held at 346-350 lines through
    nine features by folding statements) instead of moving features out; ``tests/test_features.py`` holds the
    features to their own modules instead, and a module is as long as its one job needs."""
    text = (PKG / "plugin" / "lifecycle" / "controller.py").read_text()
    imports = sum(n.end_lineno - n.lineno + 1 for n in ast.parse(text).body if isinstance(n, (ast.Import, ast.ImportFrom)))
    assert len(text.splitlines()) - imports <= 225  # its imports aside: a folder per concern spells more of them


#: the folders still over 15 modules (issue 70), at most as many as they hold now: each only shrinks
CROWDED: dict[str, int] = {}


def test_every_folder_is_a_concern_of_at_most_15_modules():
    """plugin/ was 60 modules on one shelf, 16 floors of imports deep: it is now a folder per concern (prepare,
    lifecycle, swarm, requests, load, webui, sources, watch), and no folder of the package holds more than 15
    modules (``__init__`` aside) or, in plugin/, any module beside its folders."""
    crowded = {str(d.relative_to(PKG)): n for d in [PKG, *PKG.rglob("*")] if d.is_dir() and d.name != "__pycache__"
               and (n := len([p for p in d.glob("*.py") if p.name != "__init__.py"])) > 15}
    assert all(n <= CROWDED.get(d, 15) for d, n in crowded.items()), crowded  # and none grows
    assert [p.name for p in (PKG / "plugin").glob("*.py")] == ["__init__.py"]


def test_each_option_is_defined_once_with_its_group():
    """Its flag is spelled once in the registry, its group given where it is defined (a second table of the
    groups' flags had to be kept equal by hand), and the listings read the groups from the options."""
    from vllm_load.options import GROUPS, OPTIONS

    source = (PKG / "options.py").read_text() + (PKG / "emulator_options.py").read_text() + "".join(
        p.read_text() for p in (PKG / "features").glob("*.py"))  # a feature's rows are in its own module
    assert [o.flag for o in OPTIONS if source.count(f'"{o.flag}"') != 1] == []
    assert all(o.group for o in OPTIONS)
    assert [f for flags in GROUPS.values() for f in flags] == [o.flag for o in OPTIONS]


def test_the_type_checkers_let_through_list_only_names_files_that_exist():
    """pyproject.toml's modules that mypy lets through (they had errors when it came) only shrink: a module that was
    fixed, moved or removed leaves the list, and none is added without a file."""
    import tomllib

    config = tomllib.loads((PKG.parent / "pyproject.toml").read_text())
    let_through = [m for o in config["tool"]["mypy"]["overrides"] if o.get("ignore_errors") for m in o["module"]]
    root = PKG.parent
    missing = [m for m in let_through if not (root / (m.replace(".", "/") + ".py")).exists()
               and not (root / m.replace(".", "/") / "__init__.py").exists()]
    assert missing == [] and len(let_through) <= 58


def _modules() -> dict[str, Path]:
    """Every module of vllm_load/ and server/ (installed as vllm_load_server), by its dotted name."""
    out = {}
    for base, top in ((PKG, "vllm_load"), (PKG.parent / "server", "vllm_load_server")):
        for p in base.rglob("*.py"):
            parts = (top, *p.relative_to(base).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _module_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project's modules ``name`` imports when it is imported: its module-level imports (a function's lazy
    import runs later, and ``if TYPE_CHECKING:`` never), ``from pkg import mod`` counted as ``pkg.mod``."""
    here = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here.split(".")[:len(here.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names} & known
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names} & known
    return out - {name}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import graph's circles: its strongly connected components of more than one module (Tarjan's, without
    recursion: the graph is some 300 modules deep at worst)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                part = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    part.append(w)
                    if w == v:
                        break
                if len(part) > 1:
                    out.append(sorted(part))
    return out


def test_no_import_circle_in_the_package_or_the_servers():
    """plugin/ once held a 10-module circle (controller, end_of_run, live_view, servers, shapes, startup, steps,
    target_check, validate, web_form) and the emulator a 9-module one: none now, at module level, in vllm_load/ or
    server/. The finder finds a circle where there is one (a three-module ring beside a chain)."""
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}) == [["a", "b", "c"]]
    modules = _modules()
    graph = {n: _module_imports(n, p, set(modules)) for n, p in modules.items()}
    assert sum(map(len, graph.values())) > 500  # the graph is read (each module's project imports)
    assert "vllm_load.plugin.lifecycle.end_of_run" in graph["vllm_load.plugin.lifecycle.controller"]
    assert import_circles(graph) == []
