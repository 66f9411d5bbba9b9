"""Inference engines behind one interface. Engine modules import torch/vllm lazily."""

from fleetllm.engines.base import Engine, GenerationRequest, GenerationResult, create_engine

__all__ = ["Engine", "GenerationRequest", "GenerationResult", "create_engine"]
