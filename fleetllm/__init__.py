"""fleetllm: run LLMs over datasets and behind an OpenAI-compatible API, from a laptop to a Ray cluster.

Public API (imported lazily, so `import fleetllm` loads no torch, transformers, vllm or ray):

    from fleetllm import build_processor, TransformersEngineProcessorConfig, vLLMEngineProcessorConfig
    from fleetllm import ai_query
    from fleetllm.serve import LLMConfig, build_openai_app
"""

from __future__ import annotations

import importlib
import time as _time
from typing import Any

STARTED_AT = _time.time()  # when fleetllm was first imported: the origin of the run record's `timeline_s`

__version__ = "0.1.0"

_LAZY = {
    "build_processor": "fleetllm.batch.processor",
    "TransformersEngineProcessorConfig": "fleetllm.batch.processor",
    "vLLMEngineProcessorConfig": "fleetllm.batch.processor",
    "Processor": "fleetllm.batch.processor",
    "build_llm_processor": "fleetllm.batch.processor",
    "HttpRequestProcessorConfig": "fleetllm.batch.http_processor",
    "ChatTemplateStageConfig": "fleetllm.batch.ray_names",
    "TokenizerStageConfig": "fleetllm.batch.ray_names",
    "DetokenizeStageConfig": "fleetllm.batch.ray_names",
    "PrepareMultimodalStageConfig": "fleetllm.batch.ray_names",
    "PrepareImageStageConfig": "fleetllm.batch.ray_names",
    "run_job": "fleetllm.batch.runner",
    "ai_query": "fleetllm.query.ai_query",
    "JobSpec": "fleetllm.spec",
    "load_job_spec": "fleetllm.spec",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fleetllm' has no attribute {name!r}")
