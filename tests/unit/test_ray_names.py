"""ray.data.llm's field names and shapes on the processor configs: aliases, Ray's behaviour, or a refusal
naming the field (fleetllm.batch.ray_names)."""

import pytest

from fleetllm import sizing
from fleetllm.batch.engine_pool import EnginePool
from fleetllm.batch.processor import TransformersEngineProcessorConfig, vLLMEngineProcessorConfig
from fleetllm.errors import SpecError


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


@pytest.mark.parametrize("given, named", [
    ({"concurrency": (1, 4)}, r"concurrency=\(1, 4\) asks Ray Data for an autoscaling pool"),
    ({"task_type": "embed"}, "task_type='embed'"),
    ({"should_continue_on_error": False}, "should_continue_on_error=False"),
    ({"max_concurrent_batches": 2, "batches_in_flight": 2}, "give max_concurrent_batches .* or batches_in_flight"),
])
def test_what_fleetllm_does_not_do_is_refused_by_name(given, named):
    with pytest.raises(SpecError, match=named):
        TransformersEngineProcessorConfig(model_source="m", **given)


def test_ray_serve_llm_names_on_llm_config():
    from fleetllm.serve import LLMConfig, ModelLoadingConfig

    cfg = LLMConfig(model_loading_config=ModelLoadingConfig(model_id="m"), llm_engine="vLLM", accelerator_type="L4",
                    runtime_env={"env_vars": {"X": "1"}}, deployment_config={"ray_actor_options": {"num_cpus": 2}})
    assert cfg.engine == "vllm"
    assert cfg.deployment_options()["ray_actor_options"] == {"num_cpus": 2, "accelerator_type": "L4",
                                                             "runtime_env": {"env_vars": {"X": "1"}}}
