"""LoRA adapters on the transformers engine, through peft.

Every adapter of `lora_adapters` ({name: local folder}) is loaded once onto the base model at start
(`PeftModel.from_pretrained`, then `load_adapter`); a batch then mixes rows of several adapters and the
base model in one `generate` call (peft's mixed-adapter inference: `adapter_names`, one per row, with
`__base__` for the base model), so rows need no regrouping by adapter on this engine.
"""

from __future__ import annotations

from typing import Any

from fleetllm.errors import EngineError, RowError

BASE = "__base__"  # peft's name for "no adapter" in adapter_names


def load_adapters(model, adapters: dict[str, str]):
    """The model with every adapter loaded (a PeftModel), or the model itself when there are none."""
    if not adapters:
        return model
    try:
        from peft import PeftModel
    except ImportError:
        raise EngineError("model.lora_adapters on the transformers engine needs peft: pip install peft "
                          "(or fleetllm[transformers])") from None
    names = list(adapters)
    try:
        model = PeftModel.from_pretrained(model, adapters[names[0]], adapter_name=names[0], is_trainable=False)
        for name in names[1:]:
            model.load_adapter(adapters[name], adapter_name=name, is_trainable=False)
    except (OSError, ValueError, KeyError) as exc:
        raise EngineError(f"peft could not load the LoRA adapters {adapters}: {exc}") from None
    model.eval()
    return model


def check_adapter(adapter: str | None, adapters: dict[str, Any]) -> None:
    """RowError when a request names an adapter the engine did not load."""
    if adapter and adapter not in adapters:
        known = sorted(adapters) or "none"
        raise RowError(f"unknown LoRA adapter {adapter!r}; this model has adapters {known} "
                       "(model.lora_adapters), or leave the adapter empty for the base model")


def adapter_names(adapters: list[str | None], n: int) -> list[str]:
    """peft's `adapter_names` for a batch: each row's adapter (BASE for none), repeated n times in place."""
    return [a or BASE for a in adapters for _ in range(n)]
