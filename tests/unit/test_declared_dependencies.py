"""Every third-party package fleetllm's library code imports is declared in pyproject.toml: a runtime
dependency, or an extra (engines, storage, test tools). fleetllm/testing/ (test tools) may import what the
`test` extra declares; nothing else may rely on it."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROVIDED_BY = {"yaml": "pyyaml"}  # an import name whose distribution is not installed here under that name


def requirement_name(req: str) -> str:
    return re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower().replace("_", "-")


def declared() -> tuple[set[str], set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {requirement_name(r) for r in project["dependencies"]}
    extras = project["optional-dependencies"]
    test = {requirement_name(r) for r in extras.get("test", [])}
    return runtime | {requirement_name(r) for k, reqs in extras.items() if k != "test" for r in reqs}, test


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "fleetllm"}


def test_every_imported_package_is_declared():
    library, test_extra = declared()
    dists = metadata.packages_distributions()
    missing = []
    for path in sorted((ROOT / "fleetllm").rglob("*.py")):
        allowed = library | (test_extra if "testing" in path.parts else set())
        for name in imported(path):
            candidates = {PROVIDED_BY.get(name, name)} | {d.lower().replace("_", "-") for d in dists.get(name, [])}
            if not candidates & {a.replace("_", "-") for a in allowed}:
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_httpx_is_a_test_tool_only():
    library, test_extra = declared()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "httpx" in test_extra and "httpx" not in {requirement_name(r) for r in project["dependencies"]}
    users = [p for p in (ROOT / "fleetllm").rglob("*.py") if "httpx" in imported(p)]
    assert users and all("testing" in p.parts for p in users)
