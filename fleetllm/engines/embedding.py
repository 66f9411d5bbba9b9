"""What every embedding engine shares: the model folder's declared shape and the `dimensions` rule.

A sentence-transformers folder declares its pooling (1_Pooling/config.json: mean, cls, max, ...),
whether vectors are normalized (a Normalize module in modules.json), the longest input
(sentence_bert_config.json max_seq_length) and, for Matryoshka models, the dimensions a vector may
be cut to (config.json `matryoshka_dimensions` / `is_matryoshka`, the keys vLLM reads). The
transformers and vLLM engines read the same facts here, so both refuse the same requests the same way.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetllm.errors import RowError


@dataclass(frozen=True)
class EmbeddingModelInfo:
    dimensions: int | None  # length of the vectors, when the folder says it
    max_input_tokens: int | None  # longest input in tokens (sentence_bert_config max_seq_length, else positions)
    normalize: bool  # a Normalize module follows the pooling
    pooling: str  # "mean" | "cls" | "max" | "lasttoken" | ... (the Pooling module's mode)
    matryoshka: bool  # vectors may be cut to fewer `dimensions`
    matryoshka_dimensions: tuple[int, ...] | None = None  # the only sizes allowed, when listed


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_model_info(folder: str) -> EmbeddingModelInfo:
    """The embedding facts a model folder declares (a hub id that is not a folder gives defaults)."""
    root = Path(folder)
    config = _read_json(root / "config.json") or {}
    modules = _read_json(root / "modules.json") or []
    pooling, dims, normalize = "mean", None, False
    for module in modules if isinstance(modules, list) else []:
        kind = str(module.get("type", ""))
        if kind.endswith("Pooling"):
            pool_cfg = _read_json(root / module.get("path", "") / "config.json") or {}
            dims = pool_cfg.get("word_embedding_dimension")
            modes = [k.removeprefix("pooling_mode_").removesuffix("_tokens").removesuffix("_token")
                     for k, v in pool_cfg.items() if k.startswith("pooling_mode_") and v is True]
            pooling = pool_cfg.get("pooling_mode") or (modes[0] if modes else "mean")
        elif kind.endswith("Normalize"):
            normalize = True
    st_config = _read_json(root / "sentence_bert_config.json") or {}
    max_len = st_config.get("max_seq_length") or config.get("max_position_embeddings")
    mds = config.get("matryoshka_dimensions")
    return EmbeddingModelInfo(
        dimensions=int(dims or config.get("hidden_size") or 0) or None,
        max_input_tokens=int(max_len) if max_len else None,
        normalize=normalize, pooling=pooling,
        matryoshka=bool(mds) or bool(config.get("is_matryoshka", False)),
        matryoshka_dimensions=tuple(int(d) for d in mds) if mds else None,
    )


def check_dimensions(dimensions: int | None, info: EmbeddingModelInfo, model: str = "the model") -> int | None:
    """The dimensions to cut vectors to (None: leave them whole); RowError naming `dimensions` when the
    model does not allow it. Asking for the model's own size is always allowed."""
    if dimensions is None or dimensions == info.dimensions:
        return None
    if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1:
        raise RowError(f"`dimensions` must be a whole number >= 1; got {dimensions!r}")
    if not info.matryoshka:
        raise RowError(f"`dimensions` ({dimensions}) is not supported by {model}: its vectors have "
                       f"{info.dimensions} dimensions and it is not a Matryoshka model; leave `dimensions` out")
    if info.dimensions is not None and dimensions > info.dimensions:
        raise RowError(f"`dimensions` ({dimensions}) is more than {model}'s {info.dimensions}; ask for fewer")
    if info.matryoshka_dimensions and dimensions not in info.matryoshka_dimensions:
        raise RowError(f"`dimensions` ({dimensions}) is not one of the sizes {model} was trained for: "
                       f"{list(info.matryoshka_dimensions)}")
    return dimensions


def cut(vector: list[float], dimensions: int | None, normalize: bool) -> list[float]:
    """A Matryoshka vector cut to `dimensions` (and normalized again when the model normalizes)."""
    if dimensions is None:
        return vector
    head = vector[:dimensions]
    if normalize:
        norm = math.sqrt(sum(x * x for x in head)) or 1.0
        head = [x / norm for x in head]
    return head
