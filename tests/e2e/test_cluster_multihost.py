"""Two Ray nodes on two "hosts" (network namespaces joined by a veth pair), both started with
`fleetllm cluster start`; the worker starts first and joins the head that comes up 20 s later."""

from __future__ import annotations

import json
import re
import sys

import pytest

from netns import fleetllm_argv, netns_pair_fixture, two_node_cluster  # noqa: F401  (fixture import)

HEAD_DELAY_S = 20

DRIVER = r"""
import json, os, ray
ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
from ray.util import ActorPool

@ray.remote(num_cpus=1)
class Where:
    def node(self, x):
        ctx = ray.get_runtime_context()
        return {"x": x, "node": ctx.get_node_id(), "ip": ray.util.get_node_ip_address()}

@ray.remote(num_cpus=1)
def square(x):
    return x * x, ray.get_runtime_context().get_node_id()

# One CPU per node and two one-CPU actors: the pool must span both nodes.
actors = [Where.remote(), Where.remote()]
seen = list(ActorPool(actors).map(lambda a, x: a.node.remote(x), range(8)))
for actor in actors:  # the actors hold both CPUs; free them for the tasks
    ray.kill(actor)
tasks = ray.get([square.options(scheduling_strategy="SPREAD").remote(i) for i in range(6)])
alive = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
print("RESULT " + json.dumps({
    "alive": alive,
    "actor_nodes": sorted({s["node"] for s in seen}),
    "actor_ips": sorted({s["ip"] for s in seen}),
    "xs": sorted(s["x"] for s in seen),
    "squares": [t[0] for t in tasks],
    "task_nodes": sorted({t[1] for t in tasks}),
    "cpus": ray.cluster_resources().get("CPU"),
}))
"""


@pytest.fixture(scope="module")
def cluster(netns_pair):
    with two_node_cluster(netns_pair, head_delay_s=HEAD_DELAY_S) as c:
        yield c


def result_of(proc) -> dict:
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert line, f"driver failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return json.loads(line[-1][len("RESULT "):])


def test_worker_started_first_joins_the_late_head_on_a_retry(cluster):
    out = cluster.worker_output
    assert cluster.worker_returncode == 0, out
    assert "attempt 1/12: the head at 198.18.0.1:6379 is not reachable yet; retrying in 5 s" in out
    joined = re.search(r"joined the head at 198\.18\.0\.1:6379 on attempt (\d+)/12", out)
    assert joined, out
    # The head came up HEAD_DELAY_S after the worker began, so at least that many seconds of retries.
    assert int(joined.group(1)) >= HEAD_DELAY_S // 5


def test_driver_runs_tasks_and_an_actor_pool_on_both_nodes(cluster):
    result = result_of(cluster.run_driver(DRIVER))
    assert len(result["alive"]) == 2
    assert result["actor_nodes"] == result["alive"]
    assert result["actor_ips"] == ["198.18.0.1", "198.18.0.2"]
    assert result["xs"] == list(range(8))
    assert result["squares"] == [i * i for i in range(6)]
    assert set(result["task_nodes"]) <= set(result["alive"])
    assert result["cpus"] == 2.0


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
    ok = cluster.run(cluster.pair.head, fleetllm_argv("cluster", "wait", "--cpus", "2", "--timeout", "60"))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "cluster ready: 0 GPU(s), 2 CPU(s) on 2 node(s)" in ok.stdout

    short = cluster.run(
        cluster.pair.head, fleetllm_argv("cluster", "wait", "--cpus", "64", "--timeout", "3", "--address", cluster.address)
    )
    assert short.returncode == 2
    assert "waiting for 64 CPU(s): the cluster has 0 GPU(s), 2 CPU(s) on 2 node(s)" in short.stdout
    assert "waited 3 s for 64 CPU(s), but the cluster has only 0 GPU(s), 2 CPU(s) on 2 node(s)" in short.stderr


def test_cluster_status_lists_the_nodes(cluster):
    proc = cluster.run(cluster.pair.head, fleetllm_argv("cluster", "status", "--address", cluster.address))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"2\.0 ?CPU|0\.0/2\.0 CPU|/2\.0 CPU", proc.stdout), proc.stdout
    assert proc.stdout.count("node_") >= 2, proc.stdout
