"""The package structure stays as docs/architecture.md draws it: every import of fleetllm/
(module level, inside functions, under TYPE_CHECKING) read with ast, then the forbidden directions
and the cycles refused.

Layers: the command modules (`fleetllm/cli.py`, `__main__`, `models_cli`, every `<package>/cli.py`) sit
on top and may import anything; nothing else imports them. Below them the packages (engines, batch,
serve, query, cluster, report, testing) and the top-level modules (spec, sizing, models, ...), each a
node of the package graph, which has no cycle; nor has the graph of files.

Sizes (issue 32): no module of fleetllm/ over MAX_MODULE_LINES lines, no function (or method) over
MAX_FUNCTION_LINES lines (end_lineno - lineno + 1, decorators not counted), but for the exceptions named
below with their reason.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "fleetllm"
COMMAND_MODULES = {"fleetllm.cli", "fleetllm.__main__", "fleetllm.models_cli"}
FORBIDDEN = {  # package -> packages its library modules (not its command) must not import
    "engines": {"batch", "serve", "query", "cluster", "report"},
    "batch": {"serve", "query", "cluster"},  # cluster/ is deployment tooling above serve/
    "serve": {"batch", "query"},
}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
# "path relative to fleetllm/" -> why it may be longer; "path:function" for a function. None now.
SIZE_EXCEPTIONS: dict[str, str] = {}


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE_ROOT.rglob("*.py"):
        parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the fleetllm modules it imports (a `from package import name` of a submodule counts
    as that submodule)."""
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for target in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges[name].add(target)
    return edges


def is_command(module: str) -> bool:
    return module in COMMAND_MODULES or module.endswith(".cli")


def node_of(module: str) -> str:
    """The package-graph node: the subpackage (engines, batch, ...) or the top-level module itself."""
    parts = module.split(".")
    if len(parts) == 1:
        return "fleetllm"
    if (PACKAGE_ROOT / parts[1]).is_dir():
        return parts[1]
    return parts[1] + ".py"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


MODS = modules()
EDGES = imports(MODS)


def test_the_reader_sees_the_imports():
    """A vacuous graph would pass every check below: these edges exist."""
    assert "fleetllm.batch.planning.job_plan" in EDGES["fleetllm.batch.runner"]
    assert "fleetllm.engines.openai.client" in EDGES["fleetllm.engines.openai.engine"]
    assert "fleetllm.engines.transformers_stream" in EDGES["fleetllm.engines.transformers_engine"]  # lazy import
    assert "fleetllm.batch.cli" in EDGES["fleetllm.query.cli"]
    assert "fleetllm.ray_resources" in EDGES["fleetllm.batch.execution.stream"]  # lazy, inside wait_for_cluster


def test_no_forbidden_direction():
    bad = sorted(f"{a} -> {b}" for a, targets in EDGES.items() for b in targets
                 if not is_command(a) and node_of(b) in FORBIDDEN.get(node_of(a), set()))
    assert bad == [], "imports against the architecture (docs/architecture.md):\n" + "\n".join(bad)


def test_only_commands_import_commands():
    bad = sorted(f"{a} -> {b}" for a, targets in EDGES.items() for b in targets if is_command(b) and not is_command(a))
    assert bad == [], "a library module imports a command module:\n" + "\n".join(bad)


def test_no_cycle_between_packages():
    graph: dict[str, set[str]] = defaultdict(set)
    for a, targets in EDGES.items():
        for b in targets:
            if not is_command(a) and not is_command(b) and node_of(a) != node_of(b):
                graph[node_of(a)].add(node_of(b))
    assert cycles(graph) == []


def test_no_cycle_between_files():
    assert cycles(EDGES) == []


# --- engine names (issue 32) ----------------------------------------------------------------------
# Outside fleetllm/engines/ code asks what an engine can do (fleetllm.engines.capabilities), never which engine
# it is: no engine name is compared. Exceptions, each with its reason: none.
ENGINE_NAMES = {"vllm", "transformers", "openai"}
ENGINE_NAME_EXCEPTIONS: dict[str, str] = {}  # "fleetllm/x/cli.py:LINE" -> why that comparison must stay


def _engine_names(node: ast.AST) -> set[str]:
    """The engine names among a comparison operand: a string constant, or the constants of a tuple/list/set."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & ENGINE_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_engine_names(e) for e in node.elts)) if node.elts else set()
    return set()


def engine_name_comparisons(path: Path) -> list[str]:
    """`file:line: comparison` for each comparison (==, !=, in, ..., or a match case) with an engine name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            operands = [node.value]
        else:
            continue
        if any(_engine_names(o) for o in operands):
            found.append(f"{path.relative_to(PACKAGE_ROOT.parent)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_engine_name_reader_sees_comparisons():
    """A reader that finds nothing would pass the test below: the engines' own module compares names."""
    found = engine_name_comparisons(PACKAGE_ROOT / "engines" / "capabilities.py")
    assert any("requested == 'vllm'" in f for f in found), found


def test_no_engine_name_compared_outside_engines():
    bad = [f for path in sorted(PACKAGE_ROOT.rglob("*.py")) if path.relative_to(PACKAGE_ROOT).parts[0] != "engines"
           for f in engine_name_comparisons(path) if f.split(": ")[0] not in ENGINE_NAME_EXCEPTIONS]
    assert bad == [], ("engine names compared outside fleetllm/engines/; ask fleetllm.engines.capabilities what the "
                       "engine can do instead:\n" + "\n".join(bad))


def long_modules(mods: dict[str, Path]) -> list[str]:
    return sorted(f"{p.relative_to(PACKAGE_ROOT)}: {n} lines" for p in mods.values()
                  if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
                  and str(p.relative_to(PACKAGE_ROOT)) not in SIZE_EXCEPTIONS)


def long_functions(mods: dict[str, Path]) -> list[str]:
    found = []
    for path in mods.values():
        rel = str(path.relative_to(PACKAGE_ROOT))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES and f"{rel}:{node.name}" not in SIZE_EXCEPTIONS:
                    found.append(f"{rel}:{node.name} (line {node.lineno}): {n} lines")
    return sorted(found)


def test_no_module_over_the_limit():
    assert long_modules(MODS) == [], (f"modules over {MAX_MODULE_LINES} lines: move a coherent part to a module "
                                      "of its own (or name the exception in SIZE_EXCEPTIONS, with why)")


def test_no_function_over_the_limit():
    assert long_functions(MODS) == [], (f"functions over {MAX_FUNCTION_LINES} lines: split them (or name the "
                                        "exception in SIZE_EXCEPTIONS, with why)")


def test_the_size_exceptions_are_still_needed():
    """An exception whose module or function has shrunk (or gone) is dropped from the list."""
    stale = []
    for key in SIZE_EXCEPTIONS:
        rel, _, func = key.partition(":")
        path = PACKAGE_ROOT / rel
        if not path.exists():
            stale.append(key)
        elif not func:
            stale += [key] if len(path.read_text().splitlines()) <= MAX_MODULE_LINES else []
        else:
            sizes = [n.end_lineno - n.lineno + 1 for n in ast.walk(ast.parse(path.read_text()))
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == func]
            stale += [key] if not sizes or max(sizes) <= MAX_FUNCTION_LINES else []
    assert stale == []
