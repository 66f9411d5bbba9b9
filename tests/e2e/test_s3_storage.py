"""Jobs from s3:// to s3:// against a real S3 API server (moto's server mode on 127.0.0.1).

fleetllm runs as a subprocess configured only through the environment (AWS_ENDPOINT_URL and
credentials), as a user's job would be; the results are read back with pyarrow's own S3 filesystem
and Ray Data."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.dataset as pads
import pytest
import yaml
from kill_mid_run import committed_shards, kill_after_commits

from fleetllm.testing.s3_server import S3Server

pytest.importorskip("s3fs", reason="the S3 tests need fleetllm[s3] (s3fs) and moto[server]")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def s3():
    with S3Server.serving("bkt") as server:
        yield server


def s3fs_():
    import s3fs

    return s3fs.S3FileSystem()


def put_lines(url: str, rows: list[dict]) -> None:
    s3fs_().pipe_file(url, "".join(json.dumps(r) + "\n" for r in rows).encode())


def write_job(tmp_path, name: str, model: str, **over) -> Path:
    job = {"name": name, "model": {"source": model, "engine": "transformers"},
           "input": {"path": f"s3://bkt/{name}/in.jsonl", "id_column": "id"},
           "prompt": {"template": "{q}"}, "sampling": {"max_tokens": 4, "temperature": 0.0},
           "output": {"path": f"s3://bkt/{name}/out", "format": "parquet", "shard_rows": 2},
           "compute": {"replicas": 1, "batch_size": 2, "cpus_per_replica": 1}}
    for key, value in over.items():
        job[key] = {k: v for k, v in {**job[key], **value}.items() if v is not None}  # None: leave it out
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def fleetllm(s3, *args, timeout=600):
    return subprocess.run([sys.executable, "-m", "fleetllm", *args], cwd=ROOT, capture_output=True, text=True,
                          env=s3.env(), timeout=timeout)


def read_back(s3, prefix: str) -> list[dict]:
    """The documented readers, on pyarrow's S3 filesystem: a pyarrow dataset, and Ray Data."""
    dataset = pads.dataset(f"bkt/{prefix}", filesystem=s3.arrow_fs(), format="parquet", exclude_invalid_files=True)
    return dataset.to_table().to_pylist()


def report(prefix: str) -> dict:
    return json.loads(s3fs_().cat_file(f"bkt/{prefix}/_SUCCESS"))


def test_the_lock_object_is_a_conditional_create(s3):
    from fleetllm.batch.output.commit import OutputFolder
    from fleetllm.batch.output.folder_lock import FolderLocked

    with OutputFolder("s3://bkt/lk/out", "parquet").lock():
        with pytest.raises(FolderLocked, match=rf"host {socket.gethostname()}, pid {os.getpid()}"):
            OutputFolder("s3://bkt/lk/out", "parquet").lock().acquire()
    fs = s3fs_()
    assert not fs.exists("bkt/lk/out/_fleetllm/lock.json")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = {"host": socket.gethostname(), "pid": int(dead.stdout), "started": "earlier", "run": "x"}
    fs.pipe_file("bkt/lk/out/_fleetllm/lock.json", json.dumps(stale).encode())
    with OutputFolder("s3://bkt/lk/out", "parquet").lock() as lock:  # its process is gone: taken over
        assert lock.took_over == stale
    fs.pipe_file("bkt/lk/out/_fleetllm/lock.json", json.dumps({**stale, "host": "elsewhere"}).encode())
    with pytest.raises(FolderLocked, match="host elsewhere.*if that run is gone, delete "
                                           "s3://bkt/lk/out/_fleetllm/lock.json"):
        OutputFolder("s3://bkt/lk/out", "parquet").lock().acquire()


def test_s3_to_s3_on_the_embedded_model_killed_and_resumed_exactly_once(s3, tmp_path, embedded_model, ray_local):
    rows = [{"id": "fr", "q": "What is the capital of France?"}] + \
           [{"id": f"k{i:02d}", "q": f"Say the number {i}."} for i in range(11)]
    put_lines("s3://bkt/kill/in.jsonl", rows)
    job = write_job(tmp_path, "kill", "smollm2-135m-instruct", sampling={"max_tokens": 12})
    code, stderr = kill_after_commits(["run", str(job)], "s3://bkt/kill/out", commits=2, timeout_s=400,
                                      env=s3.env())
    assert code == -signal.SIGKILL, f"the run ended before it could be killed: {stderr[-2000:]}"
    committed = committed_shards("s3://bkt/kill/out")
    assert 2 <= committed < 6

    resumed = fleetllm(s3, "run", str(job))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Wrote 12 rows to s3://bkt/kill/out" in resumed.stdout
    done = report("kill/out")
    assert done["complete"] is True and done["rows_skipped"] == committed * 2
    assert done["rows_computed"] == 12 - committed * 2
    out = read_back(s3, "kill/out")
    assert sorted(r["row_id"] for r in out) == sorted(r["id"] for r in rows)  # every row exactly once
    assert "Paris" in next(r["generated_text"] for r in out if r["row_id"] == "fr")
    import ray

    ds = ray.data.read_parquet("s3://bkt/kill/out", filesystem=s3.arrow_fs())
    assert sorted(ds.to_pandas()["row_id"]) == sorted(r["id"] for r in rows)
    assert not [k for k in s3fs_().ls("bkt/kill/out") if os.path.basename(k).startswith(".tmp-")]


def test_two_runs_on_one_prefix_one_refuses_and_overwrite_keeps_foreign_objects(s3, tmp_path, tiny_model):
    put_lines("s3://bkt/two/in.jsonl", [{"id": f"t{i}", "q": f"Q {i}"} for i in range(8)])
    job = write_job(tmp_path, "two", tiny_model, sampling={"max_tokens": 32, "extra": {"min_tokens": 32}},
                    compute={"batch_size": 1})
    first = subprocess.Popen([sys.executable, "-m", "fleetllm", "run", str(job)], cwd=ROOT, env=s3.env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    fs = s3fs_()
    deadline = time.time() + 300
    while time.time() < deadline and first.poll() is None:
        fs.invalidate_cache()
        if fs.exists("bkt/two/out/_fleetllm/lock.json"):
            break
        time.sleep(0.1)
    second = fleetllm(s3, "run", str(job), timeout=300)
    stdout, stderr = first.communicate(timeout=600)
    assert second.returncode == 2, second.stderr[-2000:]
    assert f"in use by another fleetllm run (host {socket.gethostname()}, pid {first.pid}, started" in second.stderr
    assert first.returncode == 0, stderr[-3000:]
    assert sorted(r["row_id"] for r in read_back(s3, "two/out")) == [f"t{i}" for i in range(8)]

    fs.pipe_file("bkt/two/out/data.parquet", b"not fleetllm's")
    def listing():  # the run's logs (_fleetllm/logs/) are kept even for a refused run
        return sorted(p for p in fs.find("bkt/two/out") if "/_fleetllm/logs/" not in p)

    before = listing()
    refused = fleetllm(s3, "run", str(job), "--overwrite", timeout=300)
    assert refused.returncode == 2 and "fleetllm did not write: data.parquet" in refused.stderr
    fs.invalidate_cache()
    assert listing() == before
    fs.rm("bkt/two/out/data.parquet")
    again = fleetllm(s3, "run", str(job), "--overwrite")
    assert again.returncode == 0, again.stderr[-3000:]
    assert report("two/out")["rows_computed"] == 8
    assert sorted(r["row_id"] for r in read_back(s3, "two/out")) == [f"t{i}" for i in range(8)]


def test_an_openai_batch_file_in_and_out_of_s3(s3, tmp_path, tiny_model):
    lines = [{"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "m", "messages": [{"role": "user", "content": f"Hi {i}"}], "max_tokens": 3}}
             for i in range(5)]
    lines.append({"custom_id": "bad", "method": "POST", "url": "/v1/images/generations", "body": {"input": "x"}})
    put_lines("s3://bkt/batch/in.jsonl", lines)
    job = write_job(tmp_path, "batch", tiny_model, input={"format": "openai_batch", "id_column": None},
                    prompt={"template": None}, output={"format": "openai_batch"})  # the lines hold the requests
    proc = fleetllm(s3, "run", str(job), "--max-error-rate", "0.5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    fs = s3fs_()
    ok = [json.loads(x) for x in fs.cat_file("bkt/batch/out/output.jsonl").decode().splitlines()]
    bad = [json.loads(x) for x in fs.cat_file("bkt/batch/out/errors.jsonl").decode().splitlines()]
    assert sorted(x["custom_id"] for x in ok) == [f"b{i}" for i in range(5)]
    assert all(x["response"]["status_code"] == 200 for x in ok)
    assert [x["custom_id"] for x in bad] == ["bad"] and "url" in bad[0]["error"]["message"]
