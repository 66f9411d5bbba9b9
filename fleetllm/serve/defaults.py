"""A serving request's default sampling, picked as `vllm serve` picks it.

A field the request leaves out takes the model's `generation_config.json` value (vLLM's
`--generation-config auto`: temperature, top_p, top_k, min_p, repetition_penalty; its max_new_tokens is
not read: fleetllm's own default max_tokens applies), else OpenAI's default (temperature 1.0: a request
without `temperature` samples). Batch jobs do not come here: their `sampling` block is explicit
(temperature 0 unless set).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# generation_config.json key -> request field (the keys vLLM's get_diff_sampling_param reads)
GENERATION_CONFIG_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                            "repetition_penalty": "repetition_penalty"}
OPENAI_DEFAULTS: dict[str, Any] = {"temperature": 1.0}


def model_sampling_defaults(model_path: str | Path | None) -> dict[str, Any]:
    """The sampling fields the model's generation_config.json sets, over OpenAI's defaults."""
    out = dict(OPENAI_DEFAULTS)
    path = Path(model_path) / "generation_config.json" if model_path else None
    if path is None or not path.is_file():
        return out
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return out
    for key, field in GENERATION_CONFIG_FIELDS.items():
        if isinstance(config, dict) and isinstance(config.get(key), (int, float)) and not isinstance(
                config.get(key), bool):
            out[field] = config[key]
    return out


def with_defaults(sampling: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """The request's sampling, each field it leaves out (or sends as null) taken from `defaults`."""
    return {**defaults, **{k: v for k, v in sampling.items() if v is not None}}
