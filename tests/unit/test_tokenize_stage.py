"""The preprocess tokenization stage: the ids are the ones the vLLM engine would build itself."""

from __future__ import annotations

import pyarrow as pa

from fleetllm.batch.execution.tokenize_stage import (
    TOKEN_IDS_COLUMN,
    add_prompt_token_ids,
    load_tokenizer,
    tokenize_stage_kwargs,
    tokenizer_source,
)
from fleetllm.engines.vllm_engine import VLLMEngine


def test_tokenizer_source_follows_vllms_engine_arguments():
    assert tokenizer_source("/m", {}) == {"source": "/m", "revision": None, "trust_remote_code": False,
                                          "use_fast": True}
    got = tokenizer_source("/m", {"tokenizer": "/tok", "tokenizer_revision": "r1", "trust_remote_code": True,
                                  "tokenizer_mode": "slow"})
    assert got == {"source": "/tok", "revision": "r1", "trust_remote_code": True, "use_fast": False}
    assert tokenizer_source("/m", {"revision": "r2"})["revision"] == "r2"
    assert tokenizer_source("/m", {"tokenizer_mode": "mistral"}) is None  # not a Hugging Face tokenizer
    assert tokenizer_source("/m", {"skip_tokenizer_init": True}) is None


def test_only_engines_that_take_token_ids_get_the_stage():
    assert tokenize_stage_kwargs("vllm", "/m", {}, {"enable_thinking": False})["fn_kwargs"] == {
        "tokenizer": tokenizer_source("/m", {}), "chat_template_kwargs": {"enable_thinking": False}}
    assert tokenize_stage_kwargs("transformers", "/m", {}, {}) is None
    assert tokenize_stage_kwargs("openai", "/m", {}, {}) is None


def test_ids_match_the_engines_own_and_bad_rows_are_left_to_the_engine(embedded_model):
    source = tokenizer_source(embedded_model, {})
    template_kwargs = {"chat_template": "[{{ tag }}]{% for m in messages %}{{ m['content'] }}{% endfor %}",
                       "tag": "ZEBRA"}
    rows = [
        {"row_id": "chat", "messages": [{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "What is the capital of France?"}],
         "prompt": None, "error": None},
        {"row_id": "raw", "messages": None, "prompt": "Once upon a time", "error": None},
        {"row_id": "failed-before", "messages": None, "prompt": "x", "error": "prompt.template needs column 'q'"},
        {"row_id": "bad-messages", "messages": [{"role": "user", "content": None}], "prompt": None, "error": None},
    ]
    out = add_prompt_token_ids(pa.Table.from_pylist(rows), source, {})
    assert out.schema.field(TOKEN_IDS_COLUMN).type == pa.list_(pa.int32())
    assert out.column_names[:-1] == pa.Table.from_pylist(rows).column_names  # the row's columns are kept
    ids = out.column(TOKEN_IDS_COLUMN).to_pylist()

    engine = VLLMEngine(embedded_model)  # its prompt path, without starting vLLM
    engine.tokenizer = load_tokenizer(**source)
    from fleetllm.batch.execution.stages import request_from_row

    assert ids[0] == engine.prompt_token_ids(request_from_row(rows[0]))
    assert ids[1] == engine.prompt_token_ids(request_from_row(rows[1]))
    assert ids[1] == engine.tokenizer("Once upon a time")["input_ids"]  # raw prompts get special tokens
    assert ids[2] is None and ids[3] is None  # the replica records these rows' errors itself

    templated = add_prompt_token_ids(pa.Table.from_pylist(rows[:1]), source, template_kwargs)
    assert engine.tokenizer.decode(templated.column(TOKEN_IDS_COLUMN)[0].as_py()) == \
        "[ZEBRA]Be brief.What is the capital of France?"


def test_a_stale_ids_column_is_replaced(embedded_model):
    source = tokenizer_source(embedded_model, {})
    table = pa.Table.from_pylist([{"prompt": "hello", TOKEN_IDS_COLUMN: [1, 2, 3]}])
    out = add_prompt_token_ids(table, source, {})
    assert out.column_names.count(TOKEN_IDS_COLUMN) == 1
    assert out.column(TOKEN_IDS_COLUMN)[0].as_py() == load_tokenizer(**source)("hello")["input_ids"]
