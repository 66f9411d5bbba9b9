"""How a request becomes vLLM's input (the vLLM engine's part; fleetllm.engines.vllm_engine): the prompt's
token ids (the chat template applied), or a prompt with images (fleetllm.engines.vllm_inputs), each checked
against the context; the row's sampling dict and structured-output constraint as vLLM SamplingParams; the
LoRA request of the row's adapter. A failure is the row's RowError, never the engine's.
"""

from __future__ import annotations

from typing import Any

from fleetllm.engines.base import GenerationRequest, clean_sampling
from fleetllm.engines.chat import prompt_ids, render_prompt
from fleetllm.engines.fields import output_budget
from fleetllm.errors import RowError
from fleetllm.structured import StructuredOutput


def to_plain(value: Any) -> Any:
    """Numpy scalars/arrays (Arrow hands rows over that way) as plain Python values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    return value


class VLLMRequests:
    """The request methods of VLLMEngine (a mixin: VLLMEngine derives from it and from Engine). They read
    what VLLMEngine.start() sets: tokenizer, _max_model_len, chars_per_token, _sampling_cls, loras; and
    Engine's check_sampling, model_path, chat_template_kwargs, engine_kwargs."""

    def prompt_token_ids(self, request: GenerationRequest) -> list[int]:
        """The token ids vLLM gets for a request (chat template applied to `messages`); the batch pipeline
        builds them ahead in its preprocess tasks (`request.prompt_token_ids`, same tokenizer files)."""
        if request.prompt_token_ids is not None:  # vLLM needs Python ints (Arrow's to_pylist gives them)
            ids = request.prompt_token_ids
            return ids if isinstance(ids, list) else list(map(int, ids))
        text = render_prompt(self.tokenizer, request, self.chat_template_kwargs)
        return self.tokenizer(text, add_special_tokens=request.messages is None)["input_ids"]

    def sampling_params(self, sampling: dict[str, Any] | None, num_prompt_tokens: int, delta: bool = False,
                        structured: StructuredOutput | None = None):
        """Map a row's sampling dict (and its structured-output constraint) onto vLLM SamplingParams; raises
        RowError (FieldError) for a field the table refuses, a value out of range, or a max_tokens the context
        cannot hold."""
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        params = self.check_sampling({k: to_plain(v) for k, v in clean_sampling(sampling).items()})
        params.setdefault("temperature", 0.0)
        params["max_tokens"] = output_budget(params, num_prompt_tokens, self._max_model_len)
        params["output_kind"] = RequestOutputKind.DELTA if delta else RequestOutputKind.FINAL_ONLY
        try:
            if structured is not None:  # vLLM's structured output backends (xgrammar, guidance, ...) do the rest
                params["structured_outputs"] = StructuredOutputsParams(**structured.to_structured_outputs())
            return self._sampling_cls(**params)
        except Exception as exc:  # vLLM validates values (n>1 with greedy, negative top_p, ...)
            raise RowError(f"invalid sampling options {clean_sampling(sampling)}: {exc}") from None

    def _prepare(self, request: GenerationRequest, delta: bool = False) -> tuple[dict[str, Any], Any, Any]:
        lora = self.loras.get(request.adapter)
        if request.images:  # vLLM expands the image tokens and checks the length; the text's ids bound max_tokens
            from fleetllm.engines.vllm_inputs import image_prompt

            prompt = image_prompt(self.model_path, request, self.chat_template_kwargs, self.engine_kwargs)
            ids = self.tokenizer(prompt["prompt"], add_special_tokens=False)["input_ids"]
            return prompt, self.sampling_params(request.sampling, len(ids), delta, request.structured), lora
        ids, params = self._prepare_ids(request, delta)
        return {"prompt_token_ids": ids}, params, lora

    def _prepare_ids(self, request: GenerationRequest, delta: bool = False) -> tuple[list[int], Any]:
        self.check_sampling({k: to_plain(v) for k, v in clean_sampling(request.sampling).items()})
        ids = prompt_ids(request, self.prompt_token_ids, self._max_model_len, self.chars_per_token)
        if len(ids) + 1 > self._max_model_len:
            raise RowError(f"prompt is {len(ids)} tokens; the model's context is {self._max_model_len} tokens "
                           "(max_model_len): shorten the prompt or raise engine_kwargs.max_model_len")
        return ids, self.sampling_params(request.sampling, len(ids), delta, request.structured)
