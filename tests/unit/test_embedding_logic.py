"""Embeddings, pure logic: the model folder's declared shape, the `dimensions` rule, base64 vectors, the
embeddings request shape, a model's task, and the task of an OpenAI Batch file."""

import base64
import json
import struct

import pytest
from pydantic import ValidationError

from fleetllm import models
from fleetllm.batch.inputs.openai_batch import file_task
from fleetllm.engines.base import engine_class
from fleetllm.engines.embedding import EmbeddingModelInfo, check_dimensions, cut, read_model_info
from fleetllm.engines.openai_api.embeddings import EmbeddingsRequest, encode_vector
from fleetllm.errors import InputError, PlanError, RowError


def st_folder(tmp_path, matryoshka=None):
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 8, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    config = {"architectures": ["BertModel"], "hidden_size": 8, "max_position_embeddings": 512}
    if matryoshka:
        config["matryoshka_dimensions"] = matryoshka
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}))
    return tmp_path


def test_read_model_info_and_task_of_a_sentence_transformers_folder(tmp_path):
    info = read_model_info(str(st_folder(tmp_path)))
    assert info == EmbeddingModelInfo(8, 128, True, "cls", False, None)
    assert models.model_task(models.ResolvedModel(str(tmp_path), "local", str(tmp_path))) == "embed"


def test_model_task_of_embedded_and_causal_models(tmp_path):
    assert models.EMBEDDED["all-minilm-l6-v2"].task == "embed"
    assert models.model_task(models.ResolvedModel("smollm2-135m-instruct", "embedded", "/nowhere")) == "generate"
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert models.model_task(models.ResolvedModel(str(tmp_path), "local", str(tmp_path))) == "generate"
    assert models.model_task(models.ResolvedModel("org/name", "hub", "org/name")) == "generate"


def test_dimensions_rule(tmp_path):
    plain = read_model_info(str(st_folder(tmp_path)))
    assert check_dimensions(None, plain) is None and check_dimensions(8, plain) is None  # its own size: fine
    with pytest.raises(RowError, match=r"`dimensions` \(4\).*not a Matryoshka model"):
        check_dimensions(4, plain)
    mat = EmbeddingModelInfo(8, 128, True, "mean", True, (4, 8))
    assert check_dimensions(4, mat) == 4
    with pytest.raises(RowError, match="sizes"):
        check_dimensions(2, mat)
    with pytest.raises(RowError, match="more than"):
        check_dimensions(16, mat)
    assert cut([3.0, 4.0, 1.0], 2, normalize=True) == [0.6, 0.8]
    assert cut([3.0, 4.0, 1.0], None, normalize=True) == [3.0, 4.0, 1.0]


def test_embeddings_request_shapes_and_base64():
    assert EmbeddingsRequest(input="a").items() == [{"text": "a"}]
    assert EmbeddingsRequest(input=["a", "b"]).items() == [{"text": "a"}, {"text": "b"}]
    assert EmbeddingsRequest(input=[1, 2]).items() == [{"token_ids": [1, 2]}]
    assert EmbeddingsRequest(input=[[1], [2, 3]]).items() == [{"token_ids": [1]}, {"token_ids": [2, 3]}]
    for bad in ({"input": ""}, {"input": []}, {"input": ["a", ""]}, {"input": "a", "encoding_format": "int8"},
                {"input": "a", "extra": 1}):
        with pytest.raises(ValidationError):
            EmbeddingsRequest.model_validate(bad)
    vec = [0.5, -1.25, 3.0]
    assert list(struct.unpack("<3f", base64.b64decode(encode_vector(vec, "base64")))) == vec
    assert encode_vector(vec, "float") is vec


def test_embed_engines_are_their_own_classes():
    assert engine_class("transformers", "embed").__name__ == "TransformersEmbedEngine"
    assert engine_class("vllm", "embed").__name__ == "VLLMEmbedEngine"
    assert "embed" in engine_class("openai", "embed").tasks
    with pytest.raises(PlanError, match="unknown task"):
        engine_class("transformers", "rank")


def test_file_task_follows_the_lines_url(tmp_path):
    def write(name, *urls):
        path = tmp_path / name
        path.write_text("".join(json.dumps({"custom_id": str(i), "url": u, "body": {}}) + "\n" for i, u in enumerate(urls)))
        return str(path)

    assert file_task(write("e.jsonl", "/v1/embeddings", "/v1/embeddings")) == "embed"
    assert file_task(write("c.jsonl", "/v1/chat/completions", "/v1/completions")) == "generate"
    with pytest.raises(InputError, match="m.jsonl line 1 .*m.jsonl line 3"):
        file_task(write("m.jsonl", "/v1/embeddings", "/v1/embeddings", "/v1/chat/completions"))


def test_example_embed_job_loads():
    from pathlib import Path

    from fleetllm.spec import load_job_spec

    spec = load_job_spec(Path(__file__).resolve().parents[2] / "examples" / "embed.yaml")
    assert spec.task == "embed" and spec.model.source == "all-minilm-l6-v2"
