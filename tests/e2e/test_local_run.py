"""`fleetllm run` of a local one-replica job runs in one process without Ray (fleetllm.batch.execution.local_run):
the same outputs, manifest and report as the Ray path, and each resumes the other's output folder."""

import json
import os

from hostile_rows import HOSTILE, ROWS, check_rows
from test_cli_run import fleetllm, read_rows, write_job


def run_folder(tmp_path, name, tiny_model, rows, env=None):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = write_job(folder, model={"source": tiny_model}, output={"shard_rows": 5},
                    sampling={"max_tokens": 8, "extra": {"min_tokens": 8}},
                    compute={"batch_size": 4, "cpus_per_replica": 1})
    proc = fleetllm("run", str(job), timeout=600, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return job, folder / "out", json.loads((folder / "out" / "_SUCCESS").read_text())


def test_in_process_run_equals_the_ray_run_and_resumes_it(tmp_path, tiny_model):
    rows = [{"id": f"r{i:02d}", "instruction": f"Tell me about {i}."} for i in range(12)]
    _, local_out, local = run_folder(tmp_path, "local", tiny_model, rows)
    ray_job, ray_out, on_ray = run_folder(tmp_path, "ray", tiny_model, rows, env={"FLEETLLM_USE_RAY": "1"})
    assert local["in_process"] is True and on_ray["in_process"] is False
    assert set(local) == set(on_ray)  # the same report
    for key in ("rows", "rows_computed", "shards", "errors", "output_tokens", "input_tokens", "fingerprint",
                "complete", "replicas", "batches_in_flight_per_replica", "rows_per_engine_call"):
        assert local[key] == on_ray[key], key
    assert local["rows"] == 12 and local["shards"] == 3 and local["errors"] == 0
    assert local["nodes"] and local["engine_ready_after_start_s"] > 0

    def outputs(folder):
        return {r["row_id"]: (r["generated_text"], r["num_generated_tokens"], r["finish_reason"])
                for r in read_rows(folder)}

    assert outputs(local_out) == outputs(ray_out)
    from fleetllm.batch.output.commit import OutputFolder

    manifest = [vars(e) for e in OutputFolder(str(local_out), "parquet").read_commits().values()]
    ray_manifest = [vars(e) for e in OutputFolder(str(ray_out), "parquet").read_commits().values()]
    # (shard fingerprints name the input file, which differs between the two folders)
    assert sorted((m["shard"], m["rows"], m["errors"], m["output_tokens"]) for m in manifest) == \
        sorted((m["shard"], m["rows"], m["errors"], m["output_tokens"]) for m in ray_manifest)

    # the Ray run's folder, resumed in process: every shard is already committed, nothing is recomputed
    resumed = fleetllm("run", str(ray_job), timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    report = json.loads((ray_out / "_SUCCESS").read_text())
    assert report["in_process"] is True and report["rows_skipped"] == 12 and report["rows_computed"] == 0
    assert len(read_rows(ray_out)) == 12


def test_hostile_rows_in_process_give_what_the_ray_path_gives(tmp_path, tiny_model):
    """The rows of integration/test_messy_rows.py through the in-process path (shards of 3, so error rows open
    shards): each row its value or its error, as on Ray; a shard's first row being an error row does not
    cost the rows after it their prompts (Arrow's from_pylist takes the first row's keys)."""
    (tmp_path / "in.jsonl").write_text("\n".join(line for line, *_ in HOSTILE) + "\n")
    job = write_job(tmp_path, model={"source": tiny_model}, output={"shard_rows": 3}, sampling={"max_tokens": 3},
                    prompt={"system": None}, compute={"batch_size": 2, "cpus_per_replica": 1})
    proc = fleetllm("run", str(job), "--max-error-rate", "1", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "_SUCCESS").read_text())
    assert report["in_process"] is True and report["rows"] == ROWS
    out = read_rows(tmp_path / "out")
    assert len(out) == ROWS  # each row once
    check_rows({r["row_id"]: r for r in out})
