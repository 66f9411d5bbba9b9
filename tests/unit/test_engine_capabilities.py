"""The capability table (fleetllm.engines.capabilities): its lookups, and its values against the engines."""

from __future__ import annotations

import pytest

from fleetllm.engines.base import EMBED_ENGINES, ENGINES, TASKS, engine_class
from fleetllm.engines.capabilities import (
    AUTO,
    ENGINE_CAPABILITIES,
    capabilities,
    declared,
    declared_by,
    engine_label,
    is_auto,
)
from fleetllm.errors import PlanError


def test_one_entry_per_engine():
    assert set(ENGINE_CAPABILITIES) == set(ENGINES) >= set(EMBED_ENGINES)
    assert all(name == c.name for name, c in ENGINE_CAPABILITIES.items())


@pytest.mark.parametrize("name", ["tensorrt", "", "VLLM", None, AUTO])
def test_an_unknown_name_is_refused_naming_the_engines(name):
    with pytest.raises(PlanError, match="unknown engine") as err:
        capabilities(name)
    assert "openai, transformers, vllm" in str(err.value)
    if name == AUTO:
        assert "resolved" in str(err.value)


@pytest.mark.parametrize("name", ["tensorrt", None, AUTO, ["vllm"], {"a": 1}])
def test_what_is_no_engine_declares_nothing(name):
    found = declared(name)
    assert not any(v for k, v in vars(found).items() if k != "name")
    assert declared_by(object()) == declared(None)


def test_declared_by_an_engine_object_reads_its_name():
    class Fake:
        name = "vllm"

    assert declared_by(Fake()) is capabilities("vllm") is declared("vllm")


@pytest.mark.parametrize("name", sorted(ENGINES))
@pytest.mark.parametrize("task", TASKS)
def test_the_engine_classes_agree(name, task):
    """Each engine class (generate and embed) carries its table name, and what it says of itself matches."""
    cls = engine_class(name, task)
    can = capabilities(name)
    assert cls.name == name
    assert can.continuous_batching == cls.concurrent_batches  # requests join a running batch
    assert can.is_endpoint == cls.retries_requests  # the endpoint's client retries its HTTP requests itself
    if can.is_endpoint:  # an endpoint engine serves both tasks with its one class
        assert set(cls.tasks) == set(TASKS)


def test_vllm_kwargs_back_its_declarations():
    """What vLLM declares, fleetllm passes to vLLM: its parallel sizes, prefix cache and scheduling policy."""
    from fleetllm.engines.vllm_defaults import FALLBACK_MAX_NUM_SEQS
    from fleetllm.engines.vllm_kwargs import VLLM_ONLY

    can = capabilities("vllm")
    assert can.shards_over_gpus and {"tensor_parallel_size", "pipeline_parallel_size"} <= VLLM_ONLY
    assert can.prefix_caching and "enable_prefix_caching" in VLLM_ONLY
    assert can.priority_scheduling and "scheduling_policy" in VLLM_ONLY
    assert can.default_max_num_seqs == FALLBACK_MAX_NUM_SEQS
    assert hasattr(engine_class("vllm"), "prompt_logprobs")  # echo asks vLLM; it has no torch model to run here
    assert not can.exposes_torch_model


def test_transformers_takes_static_batches_on_its_replica_devices():
    from fleetllm.engines.transformers_engine import OWN_KWARGS

    can = capabilities("transformers")
    assert not can.continuous_batching and "max_batch_size" in OWN_KWARGS  # serving sets it to what a replica admits
    assert can.cpu_unless_gpu_reserved and can.exposes_torch_model and not can.shards_over_gpus


def test_only_the_endpoint_is_an_endpoint():
    assert [n for n, c in ENGINE_CAPABILITIES.items() if c.is_endpoint] == ["openai"]


def test_auto():
    assert is_auto("auto") and not is_auto("vllm") and not is_auto(None)
    assert engine_label("auto", "vllm") == "vllm (auto)"
    assert engine_label("transformers", "transformers") == "transformers"
