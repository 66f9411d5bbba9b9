"""Ray Serve LLM's builder `build_llm_deployment` on fleetllm's app (docs/ray-compat.md)."""

from __future__ import annotations

from typing import Any

from fleetllm.serve.app import build_openai_app
from fleetllm.serve.ray_names import log
from fleetllm.serve.spec import LLMConfig


def build_llm_deployment(llm_config: Any, *, name_prefix: str | None = None, bind_kwargs: dict | None = None,
                         override_serve_options: dict | None = None, deployment_cls: Any = None):
    """Ray's single-model builder: the model's OpenAI-compatible app (the direct path: its replicas answer
    HTTP). fleetllm's replicas speak HTTP, not Ray's handle methods (`chat.remote(ChatCompletionRequest)`)."""
    if deployment_cls is not None or bind_kwargs:
        raise ValueError("build_llm_deployment: deployment_cls and bind_kwargs name Ray's LLMServer class; fleetllm "
                         "builds its own deployment (leave them out)")
    cfg = llm_config if isinstance(llm_config, LLMConfig) else LLMConfig.model_validate(llm_config)
    if override_serve_options:
        cfg = cfg.model_copy(update={"deployment_config": {**cfg.deployment_config, **override_serve_options}})
    if name_prefix:
        log.info("build_llm_deployment: name_prefix %r not used (deployments are named LLMServer-<model_id>)",
                 name_prefix)
    return build_openai_app({"llm_configs": [cfg], "ingress": "direct"})
