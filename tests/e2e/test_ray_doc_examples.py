"""Ray's own `ray.data.llm` and `ray.serve.llm` documentation examples, run against fleetllm.

Each example is Ray's code with only the import (`ray.data.llm` -> `fleetllm`; vLLMEngineProcessorConfig
imported as fleetllm's TransformersEngineProcessorConfig, the engine this CPU machine runs), the model (the
embedded smollm2-135m-instruct / all-minilm-l6-v2) and the sizes (max_tokens, batch sizes) changed.
Sources (ray-project/ray, Apache License 2.0; the adapted examples below are Ray's, under that license):
- doc/source/data/doc_code/working-with-llms/minimal_quickstart.py @ 1658f595a39735cd0329f5a935dab465b82158a2
- doc/source/data/doc_code/working-with-llms/basic_llm_example.py @ 240738c34f40b25a44858b43af652e748bea1735
- doc/source/data/doc_code/working-with-llms/tokenization_aggregation_example.py @ 7cf44582c11b2516ad91162f618ba1f57f81ab06
- doc/source/data/doc_code/working-with-llms/tokenization_disaggregation_example.py @ 4fcdee0bb418a4e633d93fa10e9d3820c12033dd
- doc/source/data/doc_code/working-with-llms/embedding_example.py @ 6e4f371ed2f9d2b72d47e6e335d7daa68634a4d8
- python/ray/data/llm.py (Ray 2.60.0 docstrings: build_processor's builder_kwargs and map_kwargs examples)
- python/ray/serve/llm/__init__.py (Ray 2.60.0 docstrings: build_openai_app with LLMServingArgs)
- doc/source/data/doc_code/working-with-llms/openai_api_example.py @ 240738c34f40b25a44858b43af652e748bea1735
  (HttpRequestProcessorConfig; the url is the Serve app the quick-start test starts)
- doc/source/serve/llm/quick-start.md @ 0afabf1d6d82c96d4c94f6d839bbc99efcdb0b01 (the bind pattern for
  several models, queried with the OpenAI client; `serve.run(..., blocking=True)` made non-blocking)
- doc/source/serve/llm/user-guides/ (Serve LLM user guides: the code of model-loading.md @ 07b5c0e4,
  deployment-initialization.md @ 0718d5b0, observability.md @ 2a04e40c, configuration.md @ 07b40725,
  prefix-aware-routing.md @ 00c950af, vllm-compatibility.md @ 205081dc (JSON mode, against the quick-start's
  app: its server config is the quick-start's llm_config1)) and
  doc/source/llm/doc_code/serve/direct_streaming/direct_streaming_example.py @ 7cf44582: the apps are built, as
  the guides show; `serve.run(app, blocking=True)` left out (one served app per module: the quick-start's)
Examples needing what fleetllm does not claim are listed in SKIPPED with the reason (docs/ray-compat.md).
"""

import pytest

from fleetllm import TransformersEngineProcessorConfig as vLLMEngineProcessorConfig  # noqa: N813 - the import changed
from fleetllm import DetokenizeStageConfig, TokenizerStageConfig, build_llm_processor, build_processor

pytestmark = pytest.mark.usefixtures("ray_local")
MODEL = "smollm2-135m-instruct"

SKIPPED = {
    "basic_llm_example.py __parallel_config_example__": "tensor/pipeline parallel on 4 GPUs with accelerator_type L4",
    "basic_llm_example.py __runai_config_example__": "load_format runai_streamer (vLLM on GPUs)",
    "basic_llm_example.py __s3_config_example__": "a model in an S3 bucket (no network here)",
    "basic_llm_example.py __lora_config_example__": "dynamic_lora_loading_path on S3 (refused, naming lora_adapters; "
                                                    "no network here)",
    "vlm_example.py, vlm_image_example.py, vlm_video_example.py, omni_audio_example.py":
        "Qwen2.5-VL from the hub (no network here; the processor takes such image rows: "
        "tests/integration/test_processor.py); video and audio (not claimed)",
    "serve_deployment_example.py": "ServeDeploymentProcessorConfig (not claimed)",
    "serve_multimodal_example.py": "ServeDeploymentProcessorConfig and images through Qwen3.5-4B (neither claimed)",
    "classification_example.py": "task_type='classify' on a sequence classification model (not claimed; refused)",
    "custom_tokenizer_example.py": "all stages disabled, `tokenized_prompt` in and `generated_tokens` out of the "
                                   "engine stage (fleetllm's engine stage takes messages/prompt and returns text)",
    "build_llm_deployment docstring": "queries the deployment handle with chat.remote(ChatCompletionRequest); "
                                      "fleetllm's replicas speak HTTP",
    "quick-start.md Multi-LoRA deployment": "lora_config with dynamic_lora_loading_path on S3 (no network here)",
    "quick-start.md Vision language models": "pixtral-12b on an L40S (no such model here)",
    "quick-start.md Serving small models on fraction of GPUs": "placement_group_config with fractional GPU bundles",
    "quick-start.md Embeddings": "engine_kwargs task=embed of Qwen2.5-0.5B (a chat model; fleetllm embeds with "
                                 "embedding models, task: embed)",
    "user-guides/autoscaling.md": "AutoscalingPolicy(TTFTAutoscalingPolicy) reading p99 TTFT from Prometheus "
                                  "(fleetllm autoscales on Ray Serve's ongoing requests: autoscaling_config)",
    "user-guides/multi-lora.md": "lora_config's dynamic_lora_loading_path on S3 (fleetllm names adapters in "
                                 "lora_adapters; model:adapter requests: tests/e2e/test_serve_images_adapters.py)",
    "user-guides/model-loading.md, deployment-initialization.md: S3/GCS/Azure bucket_uri, s3:// with "
                                 "runai_streamer, runai_streamer_sharded":
        "model_source as a cloud mirror (dict(bucket_uri=...)) and vLLM's RunAI streamer load formats on GPUs "
        "(fleetllm loads an alias, a local folder or a hub id; no network here)",
    "user-guides/model-loading.md, deployment-initialization.md: callback_config (CloudDownloader, custom "
    "callbacks)": "callbacks of Ray's LLMServer (not claimed; refused, named)",
    "user-guides/model-loading.md, deployment-initialization.md: ray.init(runtime_env=...)":
        "Ray's own cluster-wide runtime_env (the tests' cluster is the fixture's)",
    "user-guides/configuration.md: lora_config, experimental_configs, model_source bucket_uri":
        "lora_config (fleetllm: lora_adapters), Ray LLMServer knobs (not claimed; refused, named), cloud mirrors "
        "(as above)",
    "user-guides/observability.md YAML": "not valid YAML as printed (accelerator_type, deployment_config and "
                                         "log_engine_metrics are indented outside the list item)",
    "direct_streaming_custom_router_example.py": "request_router_config naming Ray's ConsistentHashRouter (fleetllm "
                                                 "runs power of two or PrefixCacheAffinityRouter; refused, named)",
    "user-guides/direct-streaming.md HAProxy variables, session affinity":
        "RAY_SERVE_ENABLE_HA_PROXY / RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING are Ray's; fleetllm's one-model app is "
        "direct without them (its replica answers HTTP), and has no session-id routing",
    "user-guides/governance.md": "GovernanceIngress / LLMMiddleware via ingress_cls_config (not claimed)",
    "user-guides/claude-code.md": "the Anthropic Messages API (/v1/messages) over Ray's direct streaming "
                                  "(fleetllm serves the OpenAI API only)",
    "user-guides/vllm-compatibility.md Embeddings": "engine_kwargs task=embed of a chat model (as quick-start.md "
                                                    "Embeddings)",
    "user-guides/vllm-compatibility.md JSON schema with Pydantic":
        "response_format json_schema given the bare Pydantic schema, without OpenAI's {name, schema}: fleetllm "
        "answers 400 naming it (JSON mode runs)",
    "user-guides/vllm-compatibility.md Transcriptions, Vision language models":
        "audio (not claimed); images through a hub VLM (no network here; image parts served: "
        "tests/e2e/test_serve_images_adapters.py)",
}


def test_minimal_quickstart():
    import ray

    ds = ray.data.from_items([
        {"prompt": "What is machine learning?"},
        {"prompt": "Explain neural networks in one sentence."},
    ])
    config = vLLMEngineProcessorConfig(
        model_source=MODEL,
        concurrency=1,  # 1 vLLM engine replica
        batch_size=32,  # 32 samples per batch
    )
    processor = build_processor(
        config,
        preprocess=lambda row: {
            "messages": [{"role": "user", "content": row["prompt"]}],
            "sampling_params": {"temperature": 0.7, "max_tokens": 8},
        },
        postprocess=lambda row: {
            "prompt": row["prompt"],
            "response": row["generated_text"],
        },
    )
    ds = processor(ds)
    results = list(ds.iter_rows())
    assert sorted(r["prompt"] for r in results) == ["Explain neural networks in one sentence.",
                                                    "What is machine learning?"]
    assert all(r["response"] for r in results)


def test_basic_llm_example_with_vllm_engine_kwargs_and_ray_fields():
    """basic_llm_example.py's first config (vLLM engine_kwargs) plus the Ray fields its other configs set
    (runtime_env, max_concurrent_batches, a (min, max) concurrency, the stage configs, should_continue_on_error,
    map kwargs) and sampling_params.detokenize."""
    import ray

    config = vLLMEngineProcessorConfig(
        model_source=MODEL,
        engine_kwargs={
            "enable_chunked_prefill": True,
            "max_num_batched_tokens": 4096,  # Reduce if CUDA OOM occurs
            "max_model_len": 2048,
            "hf_token": None,
        },
        runtime_env={"env_vars": {"HF_TOKEN": "your_huggingface_token"}},
        concurrency=(1, 1),
        batch_size=4,
        max_concurrent_batches=1,
        chat_template_stage={"enabled": True},
        tokenize_stage=True,
        detokenize_stage=True,
        should_continue_on_error=True,
    )
    processor = build_llm_processor(
        config,
        preprocess=lambda row: dict(
            messages=[
                {"role": "system", "content": "You are a bot that responds with haikus."},
                {"role": "user", "content": row["item"]},
            ],
            sampling_params=dict(temperature=0.3, max_tokens=8, detokenize=False),
        ),
        postprocess=lambda row: dict(
            answer=row["generated_text"],
            **row,  # This will return all the original columns in the dataset.
        ),
        preprocess_map_kwargs=dict(num_cpus=0.1),
        postprocess_map_kwargs=dict(num_cpus=0.1),
    )
    processor.log_input_column_names()
    too_long = "haiku " * 3000  # past max_model_len: this row fails, is kept, and bypasses postprocess
    ds = ray.data.from_items(["Start of the haiku is: Complete this for me...", too_long])
    rows = processor(ds).take_all()
    assert len(rows) == 2
    good = [r for r in rows if r["item"] != too_long][0]
    assert good["answer"] and good["__inference_error__"] is None and good["error"] is None
    bad = [r for r in rows if r["item"] == too_long][0]
    assert bad["error"] and bad["__inference_error__"] == bad["error"] and bad.get("answer") is None


@pytest.mark.parametrize("stages, detokenize", [
    (dict(tokenize_stage=TokenizerStageConfig(enabled=False), detokenize_stage=DetokenizeStageConfig(enabled=False)),
     True),
    (dict(tokenize_stage=True, detokenize_stage=True), False),
], ids=["tokenization_aggregation_example", "tokenization_disaggregation_example"])
def test_tokenization_examples(stages, detokenize):
    import ray

    config = vLLMEngineProcessorConfig(
        model_source=MODEL,
        engine_kwargs={"max_model_len": 2048},
        concurrency=1,
        batch_size=64,
        **stages,
    )
    processor = build_processor(
        config,
        preprocess=lambda row: dict(
            messages=[
                {"role": "user", "content": row["item"]},
            ],
            sampling_params=dict(
                temperature=0.3,
                max_tokens=8,
                detokenize=detokenize,
            ),
        ),
        postprocess=lambda row: dict(resp=row["generated_text"]),
    )
    rows = processor(ray.data.from_items(["Hello world!"])).take_all()
    assert rows[0]["resp"]


@pytest.mark.parametrize("stages", [
    dict(apply_chat_template=False, detokenize=False),
    dict(chat_template_stage=False, detokenize_stage=False),
], ids=["basic_llm_example __embedding_config_example__", "embedding_example.py"])
def test_embedding_examples(embedding_model, stages):
    """basic_llm_example.py's __embedding_config_example__ (the legacy flags) and embedding_example.py (the
    stage configs): task_type embed, otherwise the same code."""
    import ray

    embedding_config = vLLMEngineProcessorConfig(
        model_source=embedding_model,
        task_type="embed",
        engine_kwargs=dict(
            enable_prefix_caching=False,
            enable_chunked_prefill=False,
            max_model_len=256,
            enforce_eager=True,
        ),
        batch_size=32,
        concurrency=1,
        **stages,
    )
    processor = build_llm_processor(
        embedding_config,
        preprocess=lambda row: dict(prompt=row["text"]),
        postprocess=lambda row: {
            "text": row["prompt"],
            "embedding": row["embeddings"],
        },
    )
    rows = processor(ray.data.from_items([{"text": "Hello world"}, {"text": "Ray Data"}])).take_all()
    assert sorted(r["text"] for r in rows) == ["Hello world", "Ray Data"]
    assert all(len(r["embedding"]) == 384 for r in rows)


def test_builder_kwargs_chat_template_kwargs():
    """ray/data/llm.py's build_processor docstring: builder_kwargs=dict(chat_template_kwargs=...)."""
    import ray

    config = vLLMEngineProcessorConfig(model_source=MODEL, concurrency=1, batch_size=64)
    processor = build_processor(
        config,
        preprocess=lambda row: dict(
            messages=[{"role": "user", "content": row["prompt"]}],
            sampling_params=dict(temperature=0.6, max_tokens=8),
        ),
        postprocess=lambda row: dict(resp=row["generated_text"]),
        builder_kwargs=dict(chat_template_kwargs={"enable_thinking": True}),
    )
    rows = processor(ray.data.from_items([{"prompt": "What is 2+2?"}])).take_all()
    assert rows[0]["resp"]


def test_serve_quick_start_bind_pattern_two_models():
    """quick-start.md: "For deploying multiple models" in the bind pattern, then the OpenAI client (streaming,
    as in the quick-start's client) and Ray's builder pattern with LLMServingArgs built for the same configs."""
    from openai import OpenAI
    from ray import serve

    from fleetllm.serve import LLMConfig, LLMServingArgs, build_openai_app
    from fleetllm.serve.deployments import LLMServer, OpenAiIngress, make_fastapi_ingress
    from fleetllm.testing.serve_process import free_port

    llm_config1 = LLMConfig(
        model_loading_config=dict(
            model_id="qwen-0.5b",
            model_source=MODEL,
        ),
        deployment_config=dict(
            autoscaling_config=dict(
                min_replicas=1, max_replicas=2,
            )
        ),
        accelerator_type="A10G",
    )
    llm_config2 = LLMConfig(
        model_loading_config=dict(
            model_id="qwen-1.5b",
            model_source=MODEL,
        ),
        deployment_config=dict(
            autoscaling_config=dict(
                min_replicas=1, max_replicas=2,
            )
        ),
        accelerator_type="A10G",
    )
    # deployment #1
    server_options1 = LLMServer.get_deployment_options(llm_config1)
    server_deployment1 = serve.deployment(LLMServer).options(
        **server_options1).bind(llm_config1)
    # deployment #2
    server_options2 = LLMServer.get_deployment_options(llm_config2)
    server_deployment2 = serve.deployment(LLMServer).options(
        **server_options2).bind(llm_config2)
    # ingress
    ingress_options = OpenAiIngress.get_deployment_options(
        llm_configs=[llm_config1, llm_config2])
    ingress_cls = make_fastapi_ingress(OpenAiIngress)
    ingress_deployment = serve.deployment(ingress_cls).options(
        **ingress_options).bind([server_deployment1, server_deployment2])

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(ingress_deployment, blocking=False, name="ray-bind", route_prefix="/")
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="fake-key")
        for model in ("qwen-0.5b", "qwen-1.5b"):
            response = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Hello!"}], stream=True,
                max_tokens=8, temperature=0)
            text = "".join(chunk.choices[0].delta.content or "" for chunk in response if chunk.choices)
            assert text
        assert sorted(m.id for m in client.models.list().data) == ["qwen-0.5b", "qwen-1.5b"]
        run_openai_api_example(f"http://127.0.0.1:{port}/v1/chat/completions")
        run_vllm_compatibility_json_mode(client)
    finally:
        serve.shutdown()
    app = build_openai_app(LLMServingArgs(llm_configs=[llm_config1, llm_config2]))  # the builder pattern
    assert app is not None


def run_vllm_compatibility_json_mode(client) -> None:
    """vllm-compatibility.md's JSON mode client (streaming) against the quick-start's app, whose llm_config1 is
    that guide's server config; max_tokens added (the size)."""
    response = client.chat.completions.create(
        model="qwen-0.5b",
        response_format={"type": "json_object"},
        messages=[
            {
                "role": "system",
                "content": "You are a helpful assistant that outputs JSON."
            },
            {
                "role": "user",
                "content": "List three colors in JSON format"
            }
        ],
        stream=True,
        max_tokens=16,
    )

    text = ""
    for chunk in response:
        if chunk.choices and chunk.choices[0].delta.content is not None:
            text += chunk.choices[0].delta.content
    assert text.lstrip().startswith(("{", "["))


def run_openai_api_example(url: str) -> None:
    """openai_api_example.py against the served app (the model, url and sizes changed); a row sent to a model
    the app does not serve keeps its error and skips postprocess."""
    import os

    import ray

    from fleetllm import HttpRequestProcessorConfig

    OPENAI_KEY = os.environ.get("OPENAI_API_KEY", "your-api-key-here")
    ds = ray.data.from_items(["Hand me a haiku.", "missing-model"])
    config = HttpRequestProcessorConfig(
        url=url,
        headers={"Authorization": f"Bearer {OPENAI_KEY}"},
        qps=1,
    )
    processor = build_llm_processor(
        config,
        preprocess=lambda row: dict(
            payload=dict(
                model="qwen-0.5b" if row["item"] != "missing-model" else "missing-model",
                messages=[
                    {
                        "role": "system",
                        "content": "You are a bot that responds with haikus.",
                    },
                    {"role": "user", "content": row["item"]},
                ],
                temperature=0.0,
                max_tokens=8,
            ),
        ),
        postprocess=lambda row: dict(
            response=row["http_response"]["choices"][0]["message"]["content"]
        ),
    )
    rows = processor(ds).take_all()
    assert len(rows) == 2
    assert [r["response"] for r in rows if "response" in r][0]
    failed = [r for r in rows if r.get("error")]
    assert len(failed) == 1 and "404" in failed[0]["error"] and failed[0]["http_response"] is None


# Ray Serve LLM user guides: each function is a guide's code (the import, the model and the sizes changed), built
# as the guide shows; `serve.run(app, blocking=True)` is left out (the quick-start test serves this module's app).
def model_loading_from_hugging_face_hub():
    from fleetllm.serve import LLMConfig, build_openai_app

    llm_config = LLMConfig(
        model_loading_config=dict(
            model_id="llama-3-8b",
            model_source=MODEL,
        ),
        accelerator_type="A10G",
    )

    return build_openai_app({"llm_configs": [llm_config]})


def model_loading_fast_download():
    from fleetllm.serve import LLMConfig, build_openai_app

    llm_config = LLMConfig(
        model_loading_config=dict(
            model_id="llama-3-8b",
            model_source=MODEL,
        ),
        accelerator_type="A10G",
        runtime_env=dict(
            env_vars={
                "HF_HUB_ENABLE_HF_TRANSFER": "1"
            }
        ),
    )

    return build_openai_app({"llm_configs": [llm_config]})


def model_loading_gated_models():
    import os

    from fleetllm.serve import LLMConfig, build_openai_app

    llm_config = LLMConfig(
        model_loading_config=dict(
            model_id="llama-3-8b-instruct",
            model_source=MODEL,
        ),
        deployment_config=dict(
            autoscaling_config=dict(
                min_replicas=1,
                max_replicas=2,
            )
        ),
        accelerator_type="A10G",
        runtime_env=dict(
            env_vars={
                "HF_TOKEN": os.environ["HF_TOKEN"]
            }
        ),
    )

    return build_openai_app({"llm_configs": [llm_config]})


def model_loading_baseline_setup():
    from fleetllm.serve import LLMConfig, build_openai_app

    llm_config = LLMConfig(
        model_loading_config={
            "model_id": "llama",
            "model_source": MODEL,
        },
        deployment_config={
            "autoscaling_config": {
                "target_ongoing_requests": 1,
                "min_replicas": 0,
                "initial_replicas": 0,
                "max_replicas": 8,
            }
        },
        accelerator_type="H100",
        engine_kwargs={
            "tensor_parallel_size": 1,
        },
    )

    return build_openai_app({"llm_configs": [llm_config]})


def observability_disable_engine_metrics():
    from fleetllm.serve import LLMConfig, build_openai_app

    llm_config = LLMConfig(
        model_loading_config=dict(
            model_id="qwen-0.5b",
            model_source=MODEL,
        ),
        deployment_config=dict(
            autoscaling_config=dict(
                min_replicas=1, max_replicas=2,
            )
        ),
        log_engine_metrics=False  # Disable engine metrics
    )

    return build_openai_app({"llm_configs": [llm_config]})


def configuration_minimal_and_options():
    """configuration.md: the minimal config, then its placement_group_config (both forms) and deployment_config
    snippets on it."""
    from fleetllm.serve import LLMConfig, build_openai_app

    llm_config = LLMConfig(
        model_loading_config=dict(
            model_id="qwen-0.5b",
            model_source=MODEL,
        ),
        accelerator_type="A10G",
    )
    for placement_group_config in (dict(bundle_per_worker={"CPU": 1, "GPU": 1}, strategy="SPREAD"),
                                   dict(bundles=[{"CPU": 1, "GPU": 1}] * 4, strategy="STRICT_PACK")):
        LLMConfig(model_loading_config=dict(model_id="qwen", model_source=MODEL),
                  placement_group_config=placement_group_config)
    options = LLMConfig(
        model_loading_config=dict(model_id="qwen", model_source=MODEL),
        deployment_config=dict(
            autoscaling_config=dict(
                min_replicas=1,
                max_replicas=4,
            ),
            max_ongoing_requests=64,
        ),
    )
    assert options.deployment_options()["max_ongoing_requests"] == 64
    return build_openai_app({"llm_configs": [llm_config]})


def prefix_aware_routing():
    from ray.serve.llm.request_router import (
        PrefixCacheAffinityRouter
    )

    from fleetllm.serve import LLMConfig, build_openai_app

    llm_config = LLMConfig(
        model_loading_config=dict(
            model_id="qwen-7b",
            model_source=MODEL,
        ),
        # Enable APC in vLLM
        engine_kwargs=dict(
            enable_prefix_caching=True,
        ),
        deployment_config=dict(
            autoscaling_config=dict(
                min_replicas=2,
                max_replicas=4,
            )
        ),
        accelerator_type="A10G",
    )

    # Configure prefix-aware router
    app = build_openai_app({
        "llm_configs": [llm_config],
        "router_cls": PrefixCacheAffinityRouter,
        "router_config": {
            "imbalanced_threshold": 10,
            "match_rate_threshold": 0.1,
        }
    })
    return app


def direct_streaming_example():
    from fleetllm.serve import LLMConfig, build_openai_app

    llm_config = LLMConfig(
        model_loading_config={
            "model_id": "qwen3.5-0.8b",
            "model_source": MODEL,
        },
        deployment_config={
            "autoscaling_config": {"min_replicas": 1, "max_replicas": 4},
        },
        engine_kwargs={
            "trust_remote_code": True,
            "tensor_parallel_size": 1,
            "enable_auto_tool_choice": True,
            "tool_call_parser": "qwen3_coder",
            "reasoning_parser": "qwen3",
        },
    )

    return build_openai_app({"llm_configs": [llm_config]})


@pytest.mark.parametrize("example", [
    model_loading_from_hugging_face_hub, model_loading_fast_download, model_loading_gated_models,
    model_loading_baseline_setup, observability_disable_engine_metrics, configuration_minimal_and_options,
    prefix_aware_routing, direct_streaming_example,
], ids=lambda f: f.__name__)
def test_serve_user_guide_examples_build(example, monkeypatch):
    from ray.serve import Application

    monkeypatch.setenv("HF_TOKEN", "your_huggingface_token")  # the gated-model guide reads it
    app = example()
    assert isinstance(app, Application)
    deployment = app._bound_deployment
    if example is direct_streaming_example:
        assert deployment.name.startswith("LLMServer")  # one model: its replicas are the HTTP ingress
    if example is prefix_aware_routing:
        (server,) = [d for d in deployment.init_args[0].values()]
        router = server._bound_deployment._deployment_config.request_router_config
        assert router.request_router_kwargs == {"imbalanced_threshold": 10, "match_rate_threshold": 0.1}


def test_configuration_yaml_equivalent_through_rays_builder_args():
    """configuration.md's YAML equivalent, with `import_path: fleetllm.serve:build_openai_app`, built the way
    `serve run config.yaml` builds it (Ray applies `args` to the builder)."""
    import yaml
    from ray._common.utils import import_attr
    from ray.serve import Application
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary

    config = yaml.safe_load(f"""
applications:
- args:
    llm_configs:
    - model_loading_config:
        model_id: qwen-0.5b
        model_source: {MODEL}
      accelerator_type: A10G
      engine_kwargs:
        tensor_parallel_size: 2
        max_model_len: 2048
      deployment_config:
        autoscaling_config:
          min_replicas: 1
          max_replicas: 4
  import_path: fleetllm.serve:build_openai_app
  name: llm_app
  route_prefix: "/"
""")
    (application,) = config["applications"]
    builder = import_attr(application["import_path"])
    assert isinstance(call_user_app_builder_with_args_if_necessary(builder, application["args"]), Application)
