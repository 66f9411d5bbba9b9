"""The job's stages are defined once (fleetllm.batch.execution.pipeline) and the in-process executor runs exactly them."""

from __future__ import annotations

import json

from fleetllm.batch.execution.engine_pool import EnginePool
from fleetllm.batch.execution.image_stage import add_images
from fleetllm.batch.planning.job_plan import engine_pool, plan_job
from fleetllm.batch.execution.pipeline import job_stages
from fleetllm.batch.runner import make_preprocessor
from fleetllm.sizing import ReplicaPlan
from fleetllm.spec import JobSpec


def _pool(**over) -> EnginePool:
    plan = ReplicaPlan(engine="transformers", replicas=1, gpus_per_replica=0, cpus_per_replica=1.0, bundles=(),
                       uses_placement_group=False, description=("test",))
    return EnginePool(**{"engine": "transformers", "model_path": "/nonexistent", "engine_kwargs": {},
                         "replica_plan": plan, "batch_size": 4, **over})


def test_table_stages_are_chosen_in_one_place():
    assert _pool().table_stages() == []  # transformers pads its own batches; no images
    [(fn, kwargs)] = _pool(images={"max_images": 2}).table_stages(batch_size=8)
    assert fn is add_images and kwargs["fn_kwargs"] == {"limits": {"max_images": 2}} and kwargs["batch_size"] == 8
    assert _pool(images={"max_images": 2}, task="embed").table_stages() == []  # embed rows carry no images


def test_the_in_process_executor_runs_the_job_stages(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "q": f"question {i}"}) + "\n" for i in range(3)))
    spec = JobSpec.model_validate({
        "name": "j", "model": {"source": "m", "engine": "openai", "engine_kwargs": {"base_url": "http://127.0.0.1:9/v1"}},
        "input": {"path": str(src), "id_column": "id"}, "prompt": {"system": "Be brief.", "template": "Q: {q}"},
        "output": {"path": str(tmp_path / "out")}})
    plan = plan_job(spec)
    stages = job_stages(plan, make_preprocessor(spec, plan.task, plan.engine), engine_pool(plan))
    table = stages.prepared_table(plan.shards[0]).to_pylist()
    assert [r["row_id"] for r in table] == ["r0", "r1", "r2"]
    assert json.loads(table[1]["_messages"]) == [{"role": "system", "content": "Be brief."},
                                                {"role": "user", "content": "Q: question 1"}]
    assert "sampling_params" not in table[0]  # the job's sampling goes to the engine stage, not on rows
