"""OpenAI-compatible serving on Ray Serve.

    from fleetllm.serve import LLMConfig, build_openai_app
    app = build_openai_app({"llm_configs": [LLMConfig(
        model_loading_config=dict(model_id="smollm2", model_source="smollm2-135m-instruct"),
        deployment_config=dict(autoscaling_config=dict(min_replicas=1, max_replicas=2)),
        engine_kwargs=dict(max_model_len=2048))]})
    ray.serve.run(app)                      # or: fleetllm serve examples/serve.yaml

Imports are lazy: importing fleetllm.serve loads neither Ray nor torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "LLMConfig": "fleetllm.serve.spec",
    "ModelLoadingConfig": "fleetllm.serve.spec",  # as ray.serve.llm exports it
    "LLMServingArgs": "fleetllm.serve.ray_names",
    "build_llm_deployment": "fleetllm.serve.ray_builders",
    "LLMServer": "fleetllm.serve.deployments",
    "OpenAiIngress": "fleetllm.serve.deployments",
    "make_fastapi_ingress": "fleetllm.serve.deployments",
    "ServeSpec": "fleetllm.serve.spec",
    "load_serve_spec": "fleetllm.serve.spec",
    "build_openai_app": "fleetllm.serve.app",
    "make_api": "fleetllm.serve.api",
    "run_serve": "fleetllm.serve.run",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fleetllm.serve' has no attribute {name!r}")
