"""serve.yaml, LLMConfig and the OpenAI request models: pure logic, no Ray, no model."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from fleetllm.cli import main
from fleetllm.engines.stream_text import _held_back
from fleetllm.errors import SpecError
from fleetllm.serve import LLMConfig
from fleetllm.engines.openai_api.protocol import APIError, ChatCompletionRequest, CompletionRequest
from fleetllm.serve.spec import ServeSpec, load_serve_spec

ROOT = Path(__file__).resolve().parents[2]


def test_example_serve_yaml_loads_and_becomes_llm_configs():
    spec = load_serve_spec(ROOT / "examples" / "serve.yaml")
    assert (spec.host, spec.port, spec.api_key) == ("127.0.0.1", 8000, None)
    cfg, embed = spec.llm_configs()
    assert cfg.model_id == "smollm2" and cfg.resolved_engine() == "transformers" and cfg.task == "auto"
    assert embed.model_id == "minilm" and embed.model_loading_config.model_source == "all-minilm-l6-v2"
    opts = cfg.deployment_options()
    assert opts["num_replicas"] == 1 and opts["max_ongoing_requests"] == 32 and opts["max_queued_requests"] == 64
    assert opts["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 0.0}


def test_autoscaling_scales_the_queue_bound_per_replica():
    spec = ServeSpec.model_validate({"models": [{"model_id": "m", "max_queued_requests": 10,
                                                 "autoscaling": {"min_replicas": 1, "max_replicas": 3}}]})
    opts = spec.llm_configs()[0].deployment_options()
    assert "num_replicas" not in opts and opts["autoscaling_config"]["max_replicas"] == 3
    assert opts["max_queued_requests"] == 30


@pytest.mark.parametrize("bad, words", [
    ({"models": [{"model_id": "m", "replica": 2}]}, "models.0.replica: unknown field"),
    ({"models": [{"model_id": "m", "autoscaling": {"min_replicas": 3, "max_replicas": 1}}]}, "min_replicas"),
    ({"models": [{"model_id": "m"}, {"model_id": "m"}]}, "appears more than once"),
    ({"models": []}, "models"),
    ({"models": [{"model_id": "m", "engine": "tgi"}]}, "engine"),
])
def test_serve_spec_is_strict_and_names_the_problem(tmp_path, bad, words):
    path = tmp_path / "serve.yaml"
    import yaml

    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(SpecError, match=words.replace(".", r"\.")):
        load_serve_spec(path)


def test_llm_config_in_ray_serve_llm_shape():
    cfg = LLMConfig(model_loading_config=dict(model_id="smollm2", model_source="smollm2-135m-instruct"),
                    deployment_config=dict(autoscaling_config=dict(min_replicas=1, max_replicas=2)),
                    engine_kwargs=dict(max_model_len=2048))
    assert cfg.model_id == "smollm2" and cfg.deployment_options()["max_queued_requests"] == 128
    with pytest.raises(ValidationError, match="not supported"):
        LLMConfig(model_loading_config=dict(model_id="x"), deployment_config={"replicas": 2})


def test_stream_budget_defaults_to_a_cpu_and_a_gpu_limit():
    def budget(**model):
        return ServeSpec.model_validate({"models": [{"model_id": "m", **model}]}).llm_configs()[0].stream_budget()

    assert budget() == 40.0
    assert budget(gpus_per_replica=1) == 2000.0
    assert budget(gpus_per_replica=1, stream_messages_per_s=500) == 500
    cfg = ServeSpec.model_validate({"models": [{"model_id": "m", "gpus_per_replica": 1}]}).llm_configs()[0]
    assert cfg.stream_budget(direct=True) == 6000.0  # the replica is the HTTP ingress: no ingress process
    assert LLMConfig(model_loading_config=dict(model_id="x"), stream_messages_per_s=500).stream_budget(True) == 500
    with pytest.raises(ValidationError, match="stream_messages_per_s"):
        LLMConfig(model_loading_config=dict(model_id="x"), stream_messages_per_s=0)


def test_dry_run_prints_the_plan(capsys):
    assert main(["serve", str(ROOT / "examples" / "serve.yaml"), "--dry-run", "--port", "9000"]) == 0
    out = capsys.readouterr().out
    assert "http://127.0.0.1:9000/v1" in out and "model 'smollm2'" in out and "32 ongoing + 64 queued" in out
    assert "ingress: separate: an OpenAIIngress deployment routes" in out and "serves 2 models" in out  # 2 models


def test_request_models_check_types_and_ranges():
    ok = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}],
                                               "max_completion_tokens": 5, "stop": "x", "logprobs": True,
                                               "top_logprobs": 2})
    assert ok.engine_sampling() == {"n": 1, "max_tokens": 5, "stop": ["x"], "logprobs": 2}
    unknown = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}],
                                                    "unknown_new_field": 1})
    with pytest.raises(APIError, match="`unknown_new_field` is not a request field fleetllm knows") as err:
        unknown.engine_sampling()  # nothing is dropped silently (fleetllm.engines.fields)
    assert err.value.status == 400 and err.value.param == "unknown_new_field"
    # a custom role is passed to the chat template, as `vllm serve` does (issue 39)
    assert ChatCompletionRequest.model_validate({"messages": [{"role": "robot", "content": "x"}]}).messages
    for bad in ({"messages": []}, {"messages": "hi"}, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
                {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}):
        with pytest.raises(ValidationError):
            ChatCompletionRequest.model_validate(bad)
    assert CompletionRequest.model_validate({"prompt": ["one"]}).prompt == "one"
    with pytest.raises(ValidationError, match="one prompt"):
        CompletionRequest.model_validate({"prompt": ["a", "b"]})


def test_stop_string_prefixes_are_held_back_while_streaming():
    assert _held_back("Hello wor", ["world"]) == 3
    assert _held_back("Hello", ["world"]) == 0
    assert _held_back("a\n", ["\n\n", "xyz"]) == 1


def test_serve_model_form_builds_the_spec_as_vllm_serve_flags_say(capsys, tmp_path):
    """`fleetllm serve MODEL [--flags]` beside `fleetllm serve serve.yaml`; --api-key in both."""
    from fleetllm.cli import main

    assert main(["serve", "smollm2-135m-instruct", "--dry-run", "--served-model-name", "smol", "--engine",
                 "transformers", "--max-model-len", "2048", "--api-key", "sk-abc", "--replicas", "2"]) == 0
    plan = capsys.readouterr().out
    assert "(api key: required)" in plan and "model 'smol': source smollm2-135m-instruct, engine transformers" in plan
    assert "2 replica(s)" in plan and "engine_kwargs: {'max_model_len': 2048}" in plan
    spec = tmp_path / "serve.yaml"
    spec.write_text("models:\n  - model_id: m\n    source: smollm2-135m-instruct\n")
    assert main(["serve", str(spec), "--dry-run"]) == 0 and "(api key: none)" in capsys.readouterr().out
    assert main(["serve", str(spec), "--dry-run", "--api-key", "sk-abc"]) == 0
    assert "(api key: required)" in capsys.readouterr().out
    assert main(["serve", str(spec), "--dry-run", "--max-model-len", "9"]) == 2
    assert "--max-model-len applies to `fleetllm serve MODEL`" in capsys.readouterr().err
