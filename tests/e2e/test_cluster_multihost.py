"""Two Ray nodes on two "hosts" (network namespaces joined by a veth pair), both started with
`fleetllm cluster start`, token authentication on; the worker starts first and joins the head that
comes up 20 s later. Then `fleetllm run` jobs on the cluster: one engine replica per node (the report
names both nodes), and a run whose worker host dies mid-job and still completes, every row once.

One cluster for the module (starting one costs most of the time); the node-killing test runs last."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from netns import REPO, fleetllm_argv, netns_pair_fixture, two_node_cluster  # noqa: F401  (fixture import)

HEAD_DELAY_S = 20
ROWS = 96
SHARD_ROWS = 4
SHARDS = ROWS // SHARD_ROWS


@pytest.fixture(scope="module")
def cluster(netns_pair):
    # 2 CPUs a node and 1.5 CPUs an engine replica: one replica fits on each node, never two on one,
    # and each node keeps 0.5 CPU for Ray Data's read and prepare tasks.
    with two_node_cluster(netns_pair, head_cpus=2, worker_cpus=2, head_delay_s=HEAD_DELAY_S) as c:
        yield c


def test_worker_started_first_joins_the_late_head_on_a_retry(cluster):
    out = cluster.worker_output
    assert cluster.worker_returncode == 0, out
    assert "attempt 1/12: the head at 198.18.0.1:6379 is not reachable yet; retrying in 5 s" in out
    joined = re.search(r"joined the head at 198\.18\.0\.1:6379 on attempt (\d+)/12", out)
    assert joined, out
    # The head came up HEAD_DELAY_S after the worker began, so at least that many seconds of retries.
    assert int(joined.group(1)) >= HEAD_DELAY_S // 5


def test_driver_with_a_wrong_token_is_refused(cluster):
    env = dict(cluster.env, RAY_AUTH_TOKEN="0" * 32)
    code = "import os, ray; ray.init(address=os.environ['RAY_ADDRESS']); print('CONNECTED')"
    proc = cluster.run(cluster.pair.head, [sys.executable, "-c", code], env=env, timeout=120)
    assert "CONNECTED" not in proc.stdout
    assert proc.returncode != 0
    assert "InvalidAuthToken" in proc.stdout + proc.stderr


def test_joining_with_a_wrong_token_fails_at_once_without_retrying(cluster, tmp_path):
    env = dict(cluster.env, RAY_AUTH_TOKEN="1" * 32)
    proc = cluster.run(cluster.pair.worker, fleetllm_argv(
        "cluster", "start", "--address", cluster.address, "--node-ip-address", cluster.pair.worker_ip,
        "--num-cpus", "1", "--temp-dir", str(tmp_path), "--retries", "5", "--retry-interval", "1",
    ), env=env, timeout=150)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "refused this node's authentication token" in proc.stderr
    assert "retrying" not in proc.stdout  # an auth refusal is not retried


def test_cluster_wait_sees_both_nodes_and_times_out_clearly(cluster):
    ok = cluster.run(cluster.pair.head, fleetllm_argv("cluster", "wait", "--cpus", "4", "--timeout", "60"))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "cluster ready: 0 GPU(s), 4 CPU(s) on 2 node(s)" in ok.stdout

    short = cluster.run(
        cluster.pair.head, fleetllm_argv("cluster", "wait", "--cpus", "64", "--timeout", "3", "--address", cluster.address)
    )
    assert short.returncode == 2
    assert "waiting for 64 CPU(s): the cluster has 0 GPU(s), 4 CPU(s) on 2 node(s)" in short.stdout
    assert "waited 3 s for 64 CPU(s), but the cluster has only 0 GPU(s), 4 CPU(s) on 2 node(s)" in short.stderr


def test_cluster_status_lists_the_nodes(cluster):
    proc = cluster.run(cluster.pair.head, fleetllm_argv("cluster", "status", "--address", cluster.address))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"/4\.0 CPU", proc.stdout), proc.stdout
    assert proc.stdout.count("node_") >= 2, proc.stdout


# ----------------------------------------------------------------------------------- batch jobs


@pytest.fixture(scope="module")
def input_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("in") / "rows.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i:03d}", "text": f"count to {i}"}) + "\n" for i in range(ROWS)))
    return path


def write_job(tmp_path: Path, model: str, input_file: Path, address: str, name: str,
              max_tokens: int = 16) -> tuple[Path, Path]:
    """A job on the tiny random model: 2 replicas of 1.5 CPUs (one per node), 24 shards of 4 rows,
    `max_tokens` tokens a row (ignore_eos), cluster.address = the head."""
    out = tmp_path / "out"
    spec = {
        "name": name,
        "model": {"source": model, "engine": "transformers"},
        "input": {"path": str(input_file), "id_column": "id"},
        "prompt": {"template": "{text}"},
        "sampling": {"max_tokens": max_tokens, "temperature": 0.0, "extra": {"ignore_eos": True}},
        "output": {"path": str(out), "format": "parquet", "shard_rows": SHARD_ROWS},
        "compute": {"replicas": 2, "cpus_per_replica": 1.5, "batch_size": 2},
        "cluster": {"address": address},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path, out


def job_env(cluster) -> dict[str, str]:
    """The cluster's environment (token included) without RAY_ADDRESS, so the job finds the head
    through cluster.address alone; Ray Data waits for both replicas before handing out rows, so a
    replica slow to start cannot leave its node without shards."""
    env = {k: v for k, v in cluster.env.items() if k != "RAY_ADDRESS"}
    env["RAY_DATA_DEFAULT_WAIT_FOR_MIN_ACTORS_S"] = "300"
    return env


def alive_nodes(cluster) -> dict[str, str]:
    """{node id: node IP} of the cluster's live nodes, seen by a driver on the head."""
    code = ("import json, os, ray; ray.init(address=os.environ['RAY_ADDRESS'], log_to_driver=False); "
            "print('NODES ' + json.dumps({n['NodeID']: n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']}))")
    proc = cluster.run_driver(code, timeout=120)
    line = [l for l in proc.stdout.splitlines() if l.startswith("NODES ")]
    assert line, proc.stdout + proc.stderr
    return json.loads(line[-1][len("NODES "):])


def check_exactly_once(out: Path, report: dict, tokens: int = 16) -> None:
    assert report["complete"] is True and report["rows"] == ROWS and report["errors"] == 0, report
    parts = sorted(out.glob("part-*.parquet"))
    assert len(parts) == SHARDS
    tables = [pq.read_table(p) for p in parts]
    ids = [i for t in tables for i in t.column("row_id").to_pylist()]
    assert sorted(ids) == [f"r{i:03d}" for i in range(ROWS)]  # every input id, once
    assert [n for t in tables for n in t.column("num_generated_tokens").to_pylist()] == [tokens] * ROWS
    commits = [json.loads(p.read_text()) for p in sorted((out / "_fleetllm" / "commits").glob("shard-*.json"))]
    assert sorted(e["shard"] for e in commits) == list(range(SHARDS))  # each shard committed once
    assert [p.name for p in out.rglob(".tmp-*")] == []  # no half-written file left behind


def test_batch_job_runs_a_replica_on_each_node_and_the_report_names_both(cluster, tiny_model, input_file, tmp_path):
    alive = alive_nodes(cluster)
    assert sorted(alive.values()) == [cluster.pair.head_ip, cluster.pair.worker_ip]
    nodes = sorted(alive)
    job, out = write_job(tmp_path, tiny_model, input_file, cluster.address, "two-nodes")
    proc = cluster.run(cluster.pair.head, fleetllm_argv("run", str(job)), env=job_env(cluster), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-5000:]
    report = json.loads((out / "_SUCCESS").read_text())
    check_exactly_once(out, report)
    assert report["replicas"] == 2
    assert report["nodes"] == nodes  # both node ids: the replicas that computed the shards
    assert len(report["shard_nodes"]) == SHARDS
    assert {n for ns in report["shard_nodes"].values() for n in ns} == set(nodes)


def test_worker_node_killed_mid_job_the_job_completes_exactly_once(cluster, tiny_model, input_file, tmp_path):
    """The worker host dies after shards from both nodes are committed. Its replica cannot be placed
    again at once (the head has room for one); Ray Data retries the lost batches on it once the head's
    replica goes idle and frees its CPUs, and the driver's assembler keeps one copy of each row.
    Runs last in the module: the worker node is gone afterwards."""
    # 96 tokens a row: long enough that the kill comes while shards are left, even when a loaded machine lets
    # the driver commit in bursts (in the whole suite at 16 tokens, all 24 shards were committed before the
    # test saw both nodes in the commits)
    job, out = write_job(tmp_path, tiny_model, input_file, cluster.address, "node-dies", max_tokens=96)
    commits = out / "_fleetllm" / "commits"
    proc = subprocess.Popen(
        cluster.pair.argv(cluster.pair.head, fleetllm_argv("run", str(job))), env=job_env(cluster), cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        committed: list[dict] = []
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            if commits.exists():
                committed = [json.loads(p.read_text()) for p in commits.glob("shard-*.json")]
                if len(committed) >= 4 and len({n for e in committed for n in e["nodes"]}) == 2:
                    break
            time.sleep(0.1)
        assert proc.poll() is None, f"the job ended before the kill:\n{proc.stdout.read()}"
        assert 4 <= len(committed) < SHARDS
        cluster.kill_worker()
        assert cluster.pair.pids(cluster.pair.worker) == []  # the whole worker host is gone
        output, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output[-8000:]
    report = json.loads((out / "_SUCCESS").read_text())
    check_exactly_once(out, report, tokens=96)
    alive = alive_nodes(cluster)
    assert list(alive.values()) == [cluster.pair.head_ip]
    (dead,) = set(report["nodes"]) - set(alive)  # the worker computed shards before it died
    assert report["nodes"] == sorted([dead, *alive])
    assert report["rows_computed"] == ROWS and report["shards_computed"] == SHARDS
    assert f"Wrote {ROWS} rows" in output
