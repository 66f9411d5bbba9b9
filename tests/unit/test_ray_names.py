"""Ray Data LLM's and Ray Serve LLM's field names and shapes on fleetllm's configs: aliases, Ray's behaviour,
or a refusal naming the field (fleetllm.batch.ray_names, fleetllm.serve.ray_names; docs/ray-compat.md)."""

import logging

import pytest
from pydantic import ValidationError

from fleetllm import (ChatTemplateStageConfig, TransformersEngineProcessorConfig, build_processor, sizing,
                      vLLMEngineProcessorConfig)
from fleetllm.batch import ray_names
from fleetllm.batch.execution.engine_pool import EnginePool
from fleetllm.engines.fields import FieldError, check_sampling
from fleetllm.engines.vllm_kwargs import for_transformers
from fleetllm.errors import SpecError
from fleetllm.serve import LLMConfig, ModelLoadingConfig

MODEL = "smollm2-135m-instruct"


def test_rays_names_and_shapes_are_taken():
    c = vLLMEngineProcessorConfig(model_source="m", concurrency=(2, 2), max_concurrent_batches=4, task_type="generate",
                                  should_continue_on_error=True, accelerator_type="A10G",
                                  runtime_env={"env_vars": {"X": "1"}})
    assert (c.concurrency, c.batches_in_flight, c.accelerator_type) == (2, 4, "A10G")
    plan = sizing.plan_replicas("transformers", {}, 2, 1.0, 0, {"CPU": 8.0, "GPU": 0.0})
    pool = EnginePool(engine="transformers", model_path="m", engine_kwargs={}, replica_plan=plan, batch_size=4,
                      ray_remote_args={"accelerator_type": c.accelerator_type, "runtime_env": c.runtime_env})
    kwargs = pool.map_batches_kwargs()  # what Ray Data's map_batches gets for the replicas' actors
    assert kwargs["accelerator_type"] == "A10G" and kwargs["runtime_env"] == {"env_vars": {"X": "1"}}


def test_accelerator_type_reaches_ray_for_gpu_replicas_only():
    c = vLLMEngineProcessorConfig(model_source="m", accelerator_type="A10G", runtime_env={"env_vars": {"X": "1"}})
    assert ray_names.ray_remote_args(c, 1.0) == {"accelerator_type": "A10G", "runtime_env": {"env_vars": {"X": "1"}}}
    assert ray_names.ray_remote_args(c, 0.0) == {"runtime_env": {"env_vars": {"X": "1"}}}  # CPU: logged


def test_processor_takes_rays_names():
    c = TransformersEngineProcessorConfig(
        model_source=MODEL, max_concurrent_batches=3, concurrency=(1, 3), runtime_env={"env_vars": {"A": "1"}},
        chat_template_stage=ChatTemplateStageConfig(chat_template="{{ x }}", chat_template_kwargs={"k": 1}),
        tokenize_stage=False, detokenize_stage={"enabled": True}, should_continue_on_error=True,
        accelerator_type="L4", max_pending_requests=10, log_engine_metrics=True)
    assert c.batches_in_flight == 3 and c.concurrency == (1, 3)
    assert c.chat_template_kwargs == {"chat_template": "{{ x }}", "k": 1}
    assert (c.apply_chat_template, c.tokenize, c.detokenize) == (True, False, True)
    legacy = vLLMEngineProcessorConfig(model_source=MODEL, chat_template="T", apply_chat_template=False,
                                       task_type="embed")
    assert legacy.chat_template_kwargs == {"chat_template": "T"} and legacy.task_type == "embed"


@pytest.mark.parametrize("given, named", [
    ({"concurrency": (4, 1)}, r"concurrency=\(4, 1\): give an int or \(min, max\)"),
    ({"task_type": "classify"}, "task_type='classify'"),
    ({"should_continue_on_error": False}, "should_continue_on_error=False"),
    ({"max_concurrent_batches": 2, "batches_in_flight": 2}, "give max_concurrent_batches .* or batches_in_flight"),
    ({"dynamic_lora_loading_path": "s3://b/loras"}, "dynamic_lora_loading_path .* lora_adapters"),
    ({"placement_group_config": {"bundles": [{"GPU": 1}, {"GPU": 1}]}}, "placement_group_config"),
])
def test_what_fleetllm_does_not_do_is_refused_by_name(given, named):
    with pytest.raises(SpecError, match=named):
        TransformersEngineProcessorConfig(model_source=MODEL, **given)


def test_rays_image_stage_is_accepted_enabled_or_not():
    # fleetllm's image stage runs for a model that reads images (docs/images-and-adapters.md), whatever the flag
    for stage in ("prepare_image_stage", "prepare_multimodal_stage"):
        assert TransformersEngineProcessorConfig(model_source=MODEL, **{stage: True}).has_image
        assert not TransformersEngineProcessorConfig(model_source=MODEL, **{stage: {"enabled": False}}).has_image


def test_build_processor_takes_rays_arguments():
    config = TransformersEngineProcessorConfig(model_source=MODEL)
    p = build_processor(config, preprocess_map_kwargs={"num_cpus": 0.5},
                        builder_kwargs={"chat_template_kwargs": {"enable_thinking": False}})
    assert p.preprocess_map_kwargs == {"num_cpus": 0.5}
    assert p.config.chat_template_kwargs == {"enable_thinking": False}
    with pytest.raises(ValueError, match="builder_kwargs"):
        build_processor(config, builder_kwargs={"telemetry_agent": 1})


def test_vllm_only_engine_kwargs_leave_transformers(caplog):
    with caplog.at_level(logging.WARNING, logger="fleetllm"):
        out = for_transformers({"enable_chunked_prefill": True, "max_num_batched_tokens": 4096,
                                "max_model_len": 2048, "hf_token": "t"})
    assert out == {"max_model_len": 2048, "token": "t"}
    assert "enable_chunked_prefill" in caplog.text


def test_sampling_detokenize_does_not_fail_rows():
    assert check_sampling({"detokenize": False, "max_tokens": 4}, "transformers") == {"max_tokens": 4}
    with pytest.raises(FieldError, match="detokenize"):
        check_sampling({"detokenize": "no"}, "vllm")


def test_llm_config_takes_ray_serve_names():
    cfg = LLMConfig(model_loading_config=ModelLoadingConfig(model_id="m", model_source=MODEL), llm_engine="vLLM",
                    accelerator_type="A10G", runtime_env={"env_vars": {"X": "1"}},
                    placement_group_config={"bundles": [{"CPU": 1}]},
                    deployment_config={"request_router_config": {
                        "request_router_class": "ray.serve.llm.request_router:PrefixCacheAffinityRouter"}})
    assert cfg.engine == "vllm" and cfg.routing == "prefix_affinity"
    assert cfg.deployment_options()["ray_actor_options"]["runtime_env"] == {"env_vars": {"X": "1"}}
    with pytest.raises(ValidationError, match="request_router_config"):
        LLMConfig(model_loading_config=dict(model_id="m"),
                  deployment_config={"request_router_config": {"request_router_class": "my.Router"}})


def test_ray_serve_llm_names_on_llm_config():
    cfg = LLMConfig(model_loading_config=ModelLoadingConfig(model_id="m"), llm_engine="vLLM", accelerator_type="L4",
                    runtime_env={"env_vars": {"X": "1"}}, deployment_config={"ray_actor_options": {"num_cpus": 2}})
    assert cfg.engine == "vllm"
    assert cfg.deployment_options()["ray_actor_options"] == {"num_cpus": 2, "accelerator_type": "L4",
                                                             "runtime_env": {"env_vars": {"X": "1"}}}


def test_accelerator_type_of_a_cpu_replica_is_logged_not_passed(caplog):
    """Ray's Serve quick-start sets accelerator_type="A10G"; a transformers replica without GPUs has none to match."""
    with caplog.at_level(logging.WARNING, logger="fleetllm.serve"):
        cfg = LLMConfig(model_loading_config=ModelLoadingConfig(model_id="m"), engine="transformers",
                        accelerator_type="A10G")
    assert "accelerator_type" not in cfg.deployment_options()["ray_actor_options"]
    assert "A10G" in caplog.text
    gpu = LLMConfig(model_loading_config=ModelLoadingConfig(model_id="m"), engine="transformers",
                    accelerator_type="A10G", deployment_config={"ray_actor_options": {"num_gpus": 1}})
    assert gpu.deployment_options()["ray_actor_options"]["accelerator_type"] == "A10G"


def test_http_request_worker_retries_and_records_failures():
    """HttpRequestProcessorConfig's worker against a real HTTP server: a 503 is retried, a 404 is recorded."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from fleetllm import HttpRequestProcessorConfig
    from fleetllm.batch.http_processor import HttpCaller

    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((body, self.headers["Authorization"]))
            status = 503 if len(seen) == 1 else (404 if body.get("model") == "missing" else 200)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps({"echo": body}).encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        config = HttpRequestProcessorConfig(url=f"http://127.0.0.1:{server.server_port}/v1/chat/completions",
                                            headers={"Authorization": "Bearer k"}, max_retries=1,
                                            base_retry_wait_time_in_s=0.01)
        caller = HttpCaller(config.model_dump())
        ok = caller({"payload": {"model": "m"}})
        assert ok["http_response"] == {"echo": {"model": "m"}} and ok["error"] is None
        failed = caller({"payload": {"model": "missing"}})
        assert failed["http_response"] is None and "404" in failed["error"]
        assert [s[1] for s in seen] == ["Bearer k"] * 3  # 503, retried 200, 404 (not retried)
    finally:
        server.shutdown()
    with pytest.raises(ValidationError, match="session_factory"):
        HttpRequestProcessorConfig(url="http://x", session_factory=object())


def test_builder_router_cls_and_router_config():
    """Ray's prefix-aware-routing guide: build_openai_app({"router_cls": PrefixCacheAffinityRouter, "router_config":
    {...}}) is `routing: prefix_affinity` for every model, with the router's keyword arguments as given."""
    from fleetllm.serve.ray_names import builder_router
    from fleetllm.serve.routing import router_config

    given = {"llm_configs": [], "router_cls": "ray.serve.llm.request_router:PrefixCacheAffinityRouter",
             "router_config": {"imbalanced_threshold": 10, "match_rate_threshold": 0.1}}
    kwargs = builder_router(given)
    assert kwargs == {"imbalanced_threshold": 10, "match_rate_threshold": 0.1} and set(given) == {"llm_configs"}
    assert router_config(32, kwargs).request_router_kwargs == kwargs
    assert router_config(32).request_router_kwargs == {"imbalanced_threshold": 8}
    assert builder_router({"router_cls": "PowerOfTwoChoicesRequestRouter"}) is None
    for bad, named in (({"router_cls": "my.Router"}, "my.Router"), ({"router_config": {"x": 1}}, "router_cls"),
                       ({"router_cls": "PrefixCacheAffinityRouter", "router_config": {"x": 1}}, "'x'")):
        with pytest.raises(ValueError, match=named):
            builder_router(bad)


def test_num_replicas_auto_is_refused_by_name():
    with pytest.raises(ValidationError, match="num_replicas='auto'"):
        LLMConfig(model_loading_config=dict(model_id="m"), deployment_config={"num_replicas": "auto"})
