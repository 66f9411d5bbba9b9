"""Vision-language models on the transformers engine: the model's processor and its image-text-to-text
class through the Auto classes (AutoProcessor, AutoModelForImageTextToText), so a hub VLM that they
load works (SmolVLM/Idefics3, Qwen2-VL, LLaVA, ...; some processors need torchvision).

A request's images arrive as checked bytes (fleetllm.engines.images) and its image parts as
`image_url` parts; the processor's chat template places the image tokens and the processor expands
them, so a row's `num_input_tokens` counts its image tokens.
"""

from __future__ import annotations

from typing import Any

from fleetllm.engines.base import GenerationRequest
from fleetllm.engines.images import decode, model_messages
from fleetllm.errors import RowError


def is_vision_config(config) -> bool:
    """Whether a model config is a vision-language model's (it has a vision tower)."""
    return getattr(config, "vision_config", None) is not None


def load_processor(model_path: str, hub: dict[str, Any] | None = None):
    """The model's processor; `hub`: trust_remote_code and a hub model's pinned revision, as the model loads."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model_path, **(hub or {}))


def render(processor, request: GenerationRequest, default_kwargs: dict[str, Any]) -> str:
    """The prompt text of a request with images, from the processor's chat template."""
    if request.messages is None:
        raise RowError("images need chat `messages` (image_url content parts), not a raw `prompt`")
    kwargs = {**default_kwargs, **(request.chat_template_kwargs or {})}
    return processor.apply_chat_template(model_messages(list(request.messages)), tokenize=False,
                                         add_generation_prompt=True, **kwargs)


def inputs(processor, texts: list[str], images: list[list[bytes]]):
    """The processor's batch (input_ids with the image tokens expanded, pixel values...), left padded."""
    processor.tokenizer.padding_side = "left"
    decoded = [[decode(b) for b in row] for row in images]
    return processor(text=texts, images=decoded, padding=True, return_tensors="pt")


def prompt_ids(processor, request: GenerationRequest, default_kwargs: dict[str, Any]) -> tuple[str, list[int]]:
    """(prompt text, its token ids with every image's tokens) of one request with images."""
    text = render(processor, request, default_kwargs)
    try:
        batch = inputs(processor, [text], [list(request.images or [])])
    except (ValueError, OSError, TypeError) as exc:
        raise RowError(f"the model's processor refused the images: {exc}") from None
    return text, batch["input_ids"][0].tolist()
