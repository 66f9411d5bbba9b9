"""Did a vLLM start compile? Its compile caches say: vLLM's own (`$VLLM_CACHE_ROOT/torch_compile_cache`),
Triton's (`$TRITON_CACHE_DIR`, default ~/.triton/cache) and Inductor's (`$TORCHINDUCTOR_CACHE_DIR`, default
/tmp/torchinductor_<user>).

vLLM compiles the model with torch.compile on a start whose configuration (model, parallelism, CUDA graph
sizes, ...) it has not compiled on this machine before, and writes the result under its cache; a later start
of the same configuration loads it. After capturing its CUDA graphs, vLLM 0.25's model runner also JIT-compiles
its Triton kernels (`warmup_kernels`), into Triton's cache: 17-19 s of an 8B model's start on an H100 the first
times (lease 14: a probe that loaded its graphs from vLLM's cache still spent 17 s there, the runs after it none).
On a GPU the difference is ~30-60 s of an 8B model's start (lease 11: a probe's start 98 s cold, the run after it
~40 s), so a throughput profile keeps warm starts apart from cold ones (fleetllm.estimate.store.Profile). The
files a start writes there tell which it was, and their first and last write times how long the compiling took,
about (it leaves out the tracing before the first file).
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """vLLM's compile cache folder (VLLM_CACHE_ROOT, default ~/.cache/vllm, as vLLM reads it)."""
    root = os.environ.get("VLLM_CACHE_ROOT") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vllm")
    return Path(root).expanduser() / "torch_compile_cache"


def kernel_cache_roots() -> list[Path]:
    """Triton's and Inductor's caches, where the JIT-compiled kernels of a start go (as they read their folders)."""
    import getpass
    import tempfile

    triton = os.environ.get("TRITON_CACHE_DIR") or os.path.join(
        os.environ.get("TRITON_HOME") or os.path.expanduser("~"), ".triton", "cache")
    inductor = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
    return [Path(triton).expanduser(), Path(inductor).expanduser()]


def snapshot(root: Path | None = None) -> dict[str, float]:
    """Every file under the compile caches (vLLM's and the kernel caches; or `root` alone) with its modification
    time ({} when there is none yet)."""
    out: dict[str, float] = {}
    for folder_root in [root] if root else [cache_root(), *kernel_cache_roots()]:
        for folder, _, files in os.walk(folder_root):
            for name in files:
                path = os.path.join(folder, name)
                try:
                    out[path] = os.stat(path).st_mtime
                except OSError:  # removed meanwhile
                    continue
    return out


def compile_seconds(before: dict[str, float], root: Path | None = None) -> float:
    """Seconds the start compiled, from the files written since `before`: each cache's span of writes (first to
    last), their union (Inductor's writes fall within vLLM's compile; Triton's JIT comes after the CUDA graphs'
    capture, which a warm start pays too: the time between is not counted), 0.0 when it wrote none (a warm start,
    or an eager engine). A profile counts a start under 1 s of writes as warm (fleetllm.estimate.store.COMPILED_S)."""
    roots = [root] if root else [cache_root(), *kernel_cache_roots()]
    spans = []
    for path_root in roots:
        prefix = str(path_root) + os.sep
        written = [t for path, t in snapshot(path_root).items() if path.startswith(prefix) and before.get(path) != t]
        if written:
            spans.append((min(written), max(written)))
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(spans):  # the union of the spans
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return round(total, 3)
