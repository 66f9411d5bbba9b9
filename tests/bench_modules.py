"""Load a script of benchmarks/ as a module in a test (the scripts are not a package: each imports its
neighbours from its own folder, so that folder is on sys.path while it loads)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def benchmark_module(name: str):
    """benchmarks/<name>.py, loaded fresh."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))
