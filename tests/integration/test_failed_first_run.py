"""A run that failed before computing anything (a model that does not load: a typo'd model id) leaves
a job record but no results; the corrected rerun takes the folder without --overwrite. A folder with
results of another configuration is still refused."""

import json
import shutil

import pyarrow.parquet as pq
import pytest

from fleetllm.batch.runner import run_job
from fleetllm.errors import FleetError, PlanError
from fleetllm.spec import JobSpec

IDS = [f"r{i}" for i in range(4)]


def spec(tmp_path, source: str, **sampling) -> JobSpec:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": i, "q": f"Question {i}?"}) + "\n" for i in IDS))
    return JobSpec.model_validate({
        "name": "typo", "model": {"source": source, "engine": "transformers"},
        "input": {"path": str(src), "id_column": "id"}, "prompt": {"template": "{q}"},
        "sampling": {"max_tokens": 2, **sampling}, "output": {"path": str(tmp_path / "out"), "shard_rows": 2},
        "compute": {"replicas": 1, "batch_size": 4}})


def test_the_corrected_rerun_of_a_run_that_committed_nothing_needs_no_overwrite(tiny_model, tmp_path):
    typo = tmp_path / "tiny-modle"  # the wrong model folder: its config and tokenizer, no weights
    shutil.copytree(tiny_model, typo, ignore=shutil.ignore_patterns("*.safetensors"))
    with pytest.raises(FleetError):
        run_job(spec(tmp_path, str(typo)))
    assert (tmp_path / "out" / "_fleetllm" / "job.json").exists()  # the failed run's record
    report = run_job(spec(tmp_path, str(tiny_model)))
    assert report["complete"] is True and report["rows"] == len(IDS)
    rows = [r for p in sorted((tmp_path / "out").glob("part-*.parquet")) for r in pq.read_table(p).to_pylist()]
    assert sorted(r["row_id"] for r in rows) == IDS
    with pytest.raises(PlanError, match="different job configuration"):  # results now: a change is refused
        run_job(spec(tmp_path, str(tiny_model), max_tokens=3))


def test_a_replica_on_ray_that_cannot_load_its_model_says_why(tiny_model, tmp_path, ray_local):
    """On Ray the engine starts in a replica's actor, whose death Ray Data reports as ActorDiedError: the run raises
    the replica's own EngineError instead (the model folder named), as a run in this process does."""
    from fleetllm.errors import EngineError

    typo = tmp_path / "tiny-modle"
    shutil.copytree(tiny_model, typo, ignore=shutil.ignore_patterns("*.safetensors"))
    with pytest.raises(EngineError, match=r"transformers could not load '.*tiny-modle'.*no file named"):
        run_job(spec(tmp_path, str(typo)))
