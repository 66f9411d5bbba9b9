"""Did a vLLM start compile? Its compile cache (`$VLLM_CACHE_ROOT/torch_compile_cache`) says.

vLLM compiles the model with torch.compile on a start whose configuration (model, parallelism, CUDA graph
sizes, ...) it has not compiled on this machine before, and writes the result under its cache; a later start
of the same configuration loads it. On a GPU the difference is ~30-60 s of an 8B model's start (lease 11: a
probe's start 98 s cold, the run after it ~40 s), so a throughput profile keeps warm starts apart from cold ones
(fleetllm.estimate.store.Profile). The files a start writes there tell which it was, and their first and last
write times how long the compiling took, about (it leaves out the tracing before the first file).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """vLLM's compile cache folder (VLLM_CACHE_ROOT, default ~/.cache/vllm, as vLLM reads it)."""
    root = os.environ.get("VLLM_CACHE_ROOT") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vllm")
    return Path(root).expanduser() / "torch_compile_cache"


def snapshot(root: Path | None = None) -> dict[str, float]:
    """Every file under the compile cache with its modification time ({} when there is no cache yet)."""
    root = root or cache_root()
    out: dict[str, float] = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            try:
                out[path] = os.stat(path).st_mtime
            except OSError:  # removed meanwhile
                continue
    return out


def compile_seconds(before: dict[str, float], root: Path | None = None) -> float:
    """Seconds the start compiled, from the files written since `before`: the span of their writes, 0.0 when
    it wrote none (a warm start, or an eager engine). A profile counts a start under 1 s of writes as warm
    (fleetllm.estimate.store.COMPILED_S)."""
    written = [t for path, t in snapshot(root).items() if before.get(path) != t]
    return round(max(written) - min(written), 3) if written else 0.0
