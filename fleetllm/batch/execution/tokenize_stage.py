"""Chat templating and tokenization ahead of the replicas, for engines that take token ids (vLLM).

Ray Data runs this stage as tasks on the cluster's CPUs, beside the replicas (fused with reading and
preprocessing), so a replica hands a whole shard to vLLM at once instead of rendering and tokenizing
each row under the GIL that its async engine's output loop also needs. ray.data.llm splits the same
work into its ChatTemplateStage and TokenizeStage.

The ids are the ones the engine would build (the same tokenizer files, chat template arguments and
special-token rule as `VLLMEngine.prompt_token_ids`). A row whose prompt cannot be built here gets no
ids: the replica then builds it itself and records that row's error, as before.
"""

from __future__ import annotations

import functools
from typing import Any

from fleetllm.batch.execution.stages import request_from_row
from fleetllm.engines.chat import render_prompt

TOKEN_IDS_COLUMN = "_prompt_token_ids"
# vLLM tokenizer modes whose tokenizer is the Hugging Face one from the same files.
HF_TOKENIZER_MODES = {"auto": True, "hf": True, "slow": False}


def tokenizer_source(model_path: str, engine_kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """How vLLM will load the tokenizer, as AutoTokenizer arguments; None when this stage should leave
    tokenization to the engine (no tokenizer, or a tokenizer mode that is not Hugging Face's)."""
    mode = engine_kwargs.get("tokenizer_mode", "auto")
    if engine_kwargs.get("skip_tokenizer_init") or mode not in HF_TOKENIZER_MODES:
        return None
    return {"source": engine_kwargs.get("tokenizer") or model_path,
            "revision": engine_kwargs.get("tokenizer_revision") or engine_kwargs.get("revision"),
            "trust_remote_code": bool(engine_kwargs.get("trust_remote_code", False)),
            "use_fast": HF_TOKENIZER_MODES[mode]}


def tokenizes_ahead(engine: str, model_path: str, engine_kwargs: dict[str, Any]) -> bool:
    """Whether a generate job's rows are templated and tokenized in this stage, ahead of the replicas:
    the engine takes token ids (`Engine.takes_token_ids`: vLLM) and its tokenizer is Hugging Face's."""
    from fleetllm.engines.base import engine_class

    return bool(engine_class(engine).takes_token_ids) and tokenizer_source(model_path, engine_kwargs) is not None


@functools.lru_cache(maxsize=4)  # once per worker process and tokenizer
def load_tokenizer(source: str, revision: str | None, trust_remote_code: bool, use_fast: bool):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source, revision=revision, trust_remote_code=trust_remote_code,
                                         use_fast=use_fast)


def add_prompt_token_ids(batch, tokenizer: dict[str, Any], chat_template_kwargs: dict[str, Any]):
    """A pyarrow batch with the `_prompt_token_ids` column (list<int32>, null where not built)."""
    import pyarrow as pa

    tok = load_tokenizer(**tokenizer)
    rows = batch.to_pylist()
    texts: dict[bool, list[str]] = {True: [], False: []}  # by add_special_tokens: raw prompts get them
    where: dict[bool, list[int]] = {True: [], False: []}
    for i, row in enumerate(rows):
        if row.get("error"):
            continue
        try:
            request = request_from_row(row, chat_template_kwargs)
            text = render_prompt(tok, request, chat_template_kwargs)
        except Exception:  # the replica builds this row again and records its error
            continue
        special = request.messages is None
        texts[special].append(text)
        where[special].append(i)
    ids: list[list[int] | None] = [None] * len(rows)
    for special, group in texts.items():
        if group:
            for i, row_ids in zip(where[special], tok(group, add_special_tokens=special)["input_ids"]):
                ids[i] = row_ids
    if TOKEN_IDS_COLUMN in batch.column_names:
        batch = batch.drop_columns([TOKEN_IDS_COLUMN])
    return batch.append_column(TOKEN_IDS_COLUMN, pa.array(ids, type=pa.list_(pa.int32())))


def tokenize_stage_kwargs(engine: str, model_path: str, engine_kwargs: dict[str, Any],
                          chat_template_kwargs: dict[str, Any], batch_size: int | None = None) -> dict[str, Any] | None:
    """`ds.map_batches(add_prompt_token_ids, **kwargs)` arguments, or None when the engine tokenizes
    itself (transformers pads its own batches; openai sends text). batch_size None: a whole block
    (`fleetllm run`: one shard)."""
    if not tokenizes_ahead(engine, model_path, engine_kwargs):
        return None
    source = tokenizer_source(model_path, engine_kwargs)
    return dict(fn_kwargs={"tokenizer": source, "chat_template_kwargs": dict(chat_template_kwargs or {})},
                batch_format="pyarrow", batch_size=batch_size, num_cpus=0.25)
