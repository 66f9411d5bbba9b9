"""Library code reports through logging.getLogger("fleetllm...") (an application embedding fleetllm decides
where records go), not print; the CLI shows those records on stderr."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "fleetllm"
# what a command's user reads on stdout, printed by the module the command calls
PRINTS_FOR_A_COMMAND = {"batch/runner.py": "the --dry-run plan", "cluster/bootstrap.py": "`fleetllm cluster start/stop`"}


def library_modules():
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        rel = path.relative_to(PACKAGE_ROOT).as_posix()
        if path.name in ("cli.py", "__main__.py", "models_cli.py") or rel.startswith("testing/"):
            continue
        yield rel, path


def test_library_modules_log_instead_of_printing():
    found = []
    for rel, path in library_modules():
        if rel in PRINTS_FOR_A_COMMAND:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                found.append(f"{rel}:{node.lineno}")
    assert not found, f"print() in library code (use logging.getLogger('fleetllm....')): {found}"


def test_the_cli_shows_library_records_on_stderr(capsys):
    from fleetllm.cli import configure_logging

    logger = logging.getLogger("fleetllm")
    saved = logger.handlers[:], logger.level, logger.propagate
    logger.handlers.clear()
    try:
        configure_logging()
        logging.getLogger("fleetllm.engines.vllm").info("vLLM sized for %d rows in flight", 8)
        logging.getLogger("fleetllm.engines.vllm").debug("not shown")
    finally:
        logger.handlers[:], logger.level, logger.propagate = saved
    assert capsys.readouterr().err == "fleetllm: vLLM sized for 8 rows in flight\n"
