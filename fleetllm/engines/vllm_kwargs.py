"""vLLM engine arguments a Ray example passes (`engine_kwargs`) that the transformers engine has no use for.

With `engine: auto` on a machine without GPUs a `ray.data.llm` or Ray Serve LLM example written for vLLM
runs on transformers: its vLLM-only `engine_kwargs` (scheduler, cache and parallelism settings) are dropped
with a logged note instead of reaching `from_pretrained` (where they fail), and `hf_token` becomes
transformers' `token`.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("fleetllm.engines")

# vLLM EngineArgs names (vllm/engine/arg_utils.py) that configure vLLM's scheduler, KV cache, parallelism,
# loading or serving: meaningless to transformers' from_pretrained.
VLLM_ONLY = frozenset({
    "enable_chunked_prefill", "max_num_batched_tokens", "max_num_seqs", "gpu_memory_utilization", "block_size",
    "enable_prefix_caching", "enforce_eager", "tensor_parallel_size", "pipeline_parallel_size",
    "data_parallel_size", "distributed_executor_backend", "swap_space", "cpu_offload_gb", "kv_cache_dtype",
    "enable_lora", "max_lora_rank", "max_loras", "max_cpu_loras", "quantization", "seed", "disable_log_stats",
    "disable_log_requests", "enable_log_requests", "max_seq_len_to_capture", "guided_decoding_backend",
    "structured_outputs_config", "limit_mm_per_prompt", "mm_processor_kwargs", "tokenizer_mode", "task",
    "runner", "convert", "override_pooler_config", "pooler_config", "compilation_config", "speculative_config",
    "num_scheduler_steps", "scheduling_policy", "enable_expert_parallel", "max_logprobs", "served_model_name",
    "tokenizer", "tokenizer_revision", "disable_custom_all_reduce", "long_prefill_token_threshold",
    "max_num_partial_prefills", "kv_transfer_config", "async_scheduling", "enable_sleep_mode", "scheduler_cls",
    "mixed_step_tokens",  # fleetllm.engines.vllm_scheduler: a step budget for vLLM's scheduler
})
RENAMED = {"hf_token": "token"}  # vLLM's name -> from_pretrained's


def for_transformers(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` without the vLLM-only arguments (logged once per engine start), hf_token renamed `token`."""
    out = {RENAMED.get(k, k): v for k, v in kwargs.items() if k not in VLLM_ONLY}
    dropped = sorted(set(kwargs) & VLLM_ONLY)
    if dropped:
        log.warning("engine_kwargs %s are vLLM settings the transformers engine does not use; dropped", dropped)
    return out
