"""Rendered Kubernetes manifests validate against the KubeRay / AIBrix CRD schemas.

The CRDs live in ../shared/reference/k8s-crds relative to the repository root; without that folder
the schema tests skip and say so. Each schema is also made strict (additionalProperties: false where
the CRD lists the properties), so a misspelt field fails here instead of being pruned silently by the
API server.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetllm.cluster.k8s import (
    SERVE_APP_IMPORT_PATH,
    dump_manifest,
    render_fleet,
    render_job,
    render_spec_file,
    serve_view,
)
from fleetllm.cluster.k8s_pods import GPU_RESOURCE, RenderOptions
from fleetllm.errors import SpecError
from fleetllm.spec import JobSpec

ROOT = Path(__file__).resolve().parents[2]
# $FLEETLLM_K8S_CRDS overrides the location (for checkouts that are not beside shared/, e.g. worktrees).
CRD_DIR = Path(os.environ.get("FLEETLLM_K8S_CRDS") or ROOT.parent / "shared" / "reference" / "k8s-crds")
CRD_FILES = {
    "RayJob": "ray.io_rayjobs.yaml",
    "RayService": "ray.io_rayservices.yaml",
    "RayClusterFleet": "orchestration.aibrix.ai_rayclusterfleets.yaml",
}

needs_crds = pytest.mark.skipif(
    not CRD_DIR.is_dir(), reason=f"CRD schemas not found at {CRD_DIR}; schema validation skipped"
)


def _strict(schema: Any) -> Any:
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            out.get("type") == "object"
            and "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@lru_cache(maxsize=None)
def crd_validator(kind: str):
    """A validator of the storage version's openAPIV3Schema (built once per kind: the CRDs are large)."""
    import jsonschema

    crd = yaml.load((CRD_DIR / CRD_FILES[kind]).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    schema = _strict(version["schema"]["openAPIV3Schema"])
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    cls.check_schema(schema)
    return cls(schema)


def validate(manifest: dict[str, Any]) -> None:
    # What the API server would receive: the YAML as written, read back.
    reread = yaml.safe_load(dump_manifest(manifest))
    error = next(iter(sorted(crd_validator(manifest["kind"]).iter_errors(reread), key=lambda e: e.path)), None)
    if error is not None:
        raise error


def job(**compute: Any) -> JobSpec:
    engine_kwargs = compute.pop("engine_kwargs", {})
    return JobSpec.model_validate(
        {
            "name": "Batch_Job 1",
            "model": {"source": "Qwen/Qwen2.5-7B-Instruct", "engine": "vllm", "engine_kwargs": engine_kwargs},
            "input": {"path": "s3://bucket/in.jsonl"},
            "output": {"path": "s3://bucket/out"},
            "compute": compute,
        }
    )


SERVE = {
    "name": "smollm2",
    "host": "127.0.0.1",
    "port": 8000,
    "api_key": None,
    "models": [
        {
            "model_id": "smollm2",
            "source": "smollm2-135m-instruct",
            "engine": "transformers",
            "engine_kwargs": {},
            "chat_template_kwargs": {},
            "replicas": 1,
            "autoscaling": None,
            "max_ongoing_requests": 32,
            "max_queued_requests": 64,
            "cpus_per_replica": 1,
            "gpus_per_replica": 0,
        },
        {
            "model_id": "qwen-7b",
            "source": "Qwen/Qwen2.5-7B-Instruct",
            "engine": "vllm",
            "engine_kwargs": {"tensor_parallel_size": 2},
            "chat_template_kwargs": {},
            "replicas": 2,
            "autoscaling": {"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 8},
            "max_ongoing_requests": 32,
            "max_queued_requests": 64,
            "cpus_per_replica": 2,
            "gpus_per_replica": 0,
        },
    ],
    "cluster": {"address": None},
}

OPTS = RenderOptions(image="registry.example/fleetllm:test", namespace="llm")


def containers(group: dict[str, Any]) -> list[dict[str, Any]]:
    return group["template"]["spec"]["containers"]


def test_crd_folder_location_is_beside_the_repo():
    if not CRD_DIR.is_dir():
        pytest.skip(f"CRD schemas not found at {CRD_DIR}; schema validation skipped")
    assert set(CRD_FILES.values()) <= {p.name for p in CRD_DIR.iterdir()}


@needs_crds
def test_one_gpu_job_renders_a_valid_rayjob():
    cm, rayjob = render_job(job(replicas=1), "name: x\n", OPTS)
    validate(rayjob)
    spec = rayjob["spec"]
    assert rayjob["metadata"] == {"name": "batch-job-1", "labels": rayjob["metadata"]["labels"], "namespace": "llm"}
    assert spec["entrypoint"] == "python -m fleetllm run /etc/fleetllm/job.yaml"
    cluster = spec["rayClusterSpec"]
    assert cluster["rayVersion"] == metadata.version("ray")
    assert cluster["authOptions"] == {"mode": "token"}
    (workers,) = cluster["workerGroupSpecs"]
    assert workers["replicas"] == workers["minReplicas"] == workers["maxReplicas"] == 1
    (box,) = containers(workers)
    assert box["image"] == "registry.example/fleetllm:test"
    assert box["resources"]["limits"][GPU_RESOURCE] == 1
    assert workers["rayStartParams"]["num-gpus"] == "1"
    assert box["readinessProbe"]["httpGet"]["path"] == "/api/local_raylet_healthz"
    assert box["livenessProbe"]["httpGet"]["port"] == 52365
    (head_box,) = containers(cluster["headGroupSpec"])
    assert GPU_RESOURCE not in head_box["resources"]["limits"]
    assert head_box["readinessProbe"]["httpGet"] == {"path": "/api/gcs_healthz", "port": 8265}
    assert {"name": "fleetllm-spec", "mountPath": "/etc/fleetllm", "readOnly": True} in head_box["volumeMounts"]
    # The ConfigMap carries the job YAML the entrypoint reads.
    assert cm["kind"] == "ConfigMap" and cm["data"] == {"job.yaml": "name: x\n"}
    assert cluster["headGroupSpec"]["template"]["spec"]["volumes"][1]["configMap"]["name"] == cm["metadata"]["name"]


@needs_crds
def test_tp2_times_4_replicas_job_gets_4_pods_of_2_gpus():
    _, rayjob = render_job(job(replicas=4, engine_kwargs={"tensor_parallel_size": 2}), "", OPTS)
    validate(rayjob)
    (workers,) = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert workers["replicas"] == 4
    (box,) = containers(workers)
    assert box["resources"]["limits"][GPU_RESOURCE] == 2
    assert int(box["resources"]["limits"]["cpu"]) >= 8


def test_pipeline_parallel_multiplies_and_explicit_gpus_win():
    _, rayjob = render_job(
        job(replicas=2, engine_kwargs={"tensor_parallel_size": 2, "pipeline_parallel_size": 2}), "", OPTS
    )
    (box,) = containers(rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0])
    assert box["resources"]["limits"][GPU_RESOURCE] == 4
    _, rayjob = render_job(job(replicas=2, gpus_per_replica=1, engine_kwargs={"tensor_parallel_size": 2}), "", OPTS)
    (box,) = containers(rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0])
    assert box["resources"]["limits"][GPU_RESOURCE] == 1


def test_auto_replicas_needs_an_explicit_count():
    with pytest.raises(SpecError, match="--replicas"):
        render_job(job(replicas="auto"), "", OPTS)
    _, rayjob = render_job(job(replicas="auto"), "", OPTS, replicas=3)
    assert rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 3


@needs_crds
def test_serve_spec_renders_rayservice_service_and_httproute(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(SERVE))
    rayservice, service, route = render_spec_file(path, OPTS)
    validate(rayservice)

    config = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    (app,) = config["applications"]
    assert app["import_path"] == SERVE_APP_IMPORT_PATH
    got = app["args"]["spec"]["models"]  # the validated spec: what the file says, plus the spec's defaults
    assert [{k: m[k] for k in want} for m, want in zip(got, SERVE["models"])] == SERVE["models"]
    assert app["args"]["spec"]["host"] == "0.0.0.0"
    cluster = rayservice["spec"]["rayClusterConfig"]
    assert cluster["rayVersion"] == metadata.version("ray")
    small, big = cluster["workerGroupSpecs"]
    assert GPU_RESOURCE not in containers(small)[0]["resources"]["limits"]
    assert containers(big)[0]["resources"]["limits"][GPU_RESOURCE] == 2  # TP=2 with gpus_per_replica 0 on vllm
    assert (big["minReplicas"], big["replicas"], big["maxReplicas"]) == (1, 2, 3)
    assert cluster["enableInTreeAutoscaling"] is True

    # Service: structure checked here (no CRD).
    assert service["apiVersion"] == "v1" and service["kind"] == "Service"
    assert service["metadata"]["namespace"] == "llm"
    assert service["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": 8000, "protocol": "TCP"}]
    pod_labels = cluster["headGroupSpec"]["template"]["metadata"]["labels"]
    selector = service["spec"]["selector"]
    assert {k: v for k, v in selector.items() if k != "ray.io/serve"}.items() <= pod_labels.items()

    # HTTPRoute: one rule per model, matched on the `model` header, all to the Service.
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1" and route["kind"] == "HTTPRoute"
    assert route["spec"]["parentRefs"] and all("name" in ref for ref in route["spec"]["parentRefs"])
    headers = [rule["matches"][0]["headers"][0] for rule in route["spec"]["rules"]]
    assert headers == [
        {"type": "Exact", "name": "model", "value": "smollm2"},
        {"type": "Exact", "name": "model", "value": "qwen-7b"},
    ]
    for rule in route["spec"]["rules"]:
        assert rule["backendRefs"] == [{"name": service["metadata"]["name"], "port": 8000}]


@needs_crds
def test_fleet_variant_is_a_valid_rayclusterfleet_per_model():
    manifests = render_fleet(serve_view(SERVE), OPTS, max_surge="25%", max_unavailable=0)
    fleets = [m for m in manifests if m["kind"] == "RayClusterFleet"]
    maps = [m for m in manifests if m["kind"] == "ConfigMap"]
    assert len(fleets) == len(maps) == 2
    for fleet in fleets:
        validate(fleet)
    small, big = fleets
    assert big["spec"]["replicas"] == 2
    assert big["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}}
    template = big["spec"]["template"]
    assert big["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert template["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    cluster = template["spec"]
    assert cluster["rayVersion"] == metadata.version("ray")
    head_box = containers(cluster["headGroupSpec"])[0]
    assert "$KUBERAY_GEN_RAY_START_CMD" in head_box["args"][0] and "fleetllm serve" in head_box["args"][0]
    env = {e["name"]: e for e in head_box["env"]}
    assert env["RAY_AUTH_MODE"]["value"] == "token" and "secretKeyRef" in env["RAY_AUTH_TOKEN"]["valueFrom"]
    (workers,) = cluster["workerGroupSpecs"]
    assert containers(workers)[0]["resources"]["limits"][GPU_RESOURCE] == 2
    # Each fleet's ConfigMap serves only its own model, one replica per Ray cluster.
    spec = yaml.safe_load(maps[1]["data"]["serve.yaml"])
    assert [m["model_id"] for m in spec["models"]] == ["qwen-7b"] and spec["models"][0]["replicas"] == 1


def test_a_misspelt_field_fails_the_strict_schema():
    if not CRD_DIR.is_dir():
        pytest.skip(f"CRD schemas not found at {CRD_DIR}")
    import jsonschema

    _, rayjob = render_job(job(replicas=1), "", OPTS)
    broken = copy.deepcopy(rayjob)
    broken["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replica"] = 3
    with pytest.raises(jsonschema.ValidationError, match="replica"):
        validate(broken)


def test_serve_view_rejects_a_spec_without_models():
    with pytest.raises(SpecError, match="models"):
        serve_view({"name": "x", "models": []})


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"replica": 2}, "models.0.replica: unknown field"),
        ({"engine": "tgi"}, "models.0.engine"),
        ({"autoscaling": {"min_replicas": 3, "max_replicas": 1}}, "min_replicas (3) is above max_replicas (1)"),
    ],
)
def test_render_refuses_what_fleetllm_serve_refuses(tmp_path, change, problem):
    """k8s render validates through ServeSpec/load_serve_spec: the same file, the same error."""
    from fleetllm.serve.spec import load_serve_spec

    bad = copy.deepcopy(SERVE)
    bad["models"][0].update(change)
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(SpecError) as served:
        load_serve_spec(path)
    with pytest.raises(SpecError) as rendered:
        render_spec_file(path, OPTS)
    assert problem in str(served.value)
    assert str(rendered.value) == str(served.value)


def test_example_serve_yaml_renders_with_servespec_defaults(tmp_path):
    """examples/serve.yaml (what `fleetllm serve` runs) renders; fields it leaves out get ServeSpec's
    defaults in the spec the cluster runs."""
    rayservice, _, _ = render_spec_file(ROOT / "examples" / "serve.yaml", OPTS)
    (app,) = yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"]
    example = yaml.safe_load((ROOT / "examples" / "serve.yaml").read_text())
    assert [m["model_id"] for m in app["args"]["spec"]["models"]] == [m["model_id"] for m in example["models"]]

    minimal = tmp_path / "serve.yaml"
    minimal.write_text("models:\n  - model_id: tiny\n")
    rayservice, _, route = render_spec_file(minimal, OPTS)
    (app,) = yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"]
    (model,) = app["args"]["spec"]["models"]
    assert model["source"] == "smollm2-135m-instruct" and model["max_ongoing_requests"] == 32
    assert app["args"]["spec"]["name"] == "fleetllm" and app["args"]["spec"]["host"] == "0.0.0.0"
    assert route["spec"]["rules"][0]["matches"][0]["headers"][0]["value"] == "tiny"


def test_fleet_of_a_job_spec_is_refused(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job(replicas=1).model_dump()))
    with pytest.raises(SpecError, match="--fleet"):
        render_spec_file(path, OPTS, fleet=True)


def test_cli_render_writes_files(tmp_path):
    spec = tmp_path / "serve.yaml"
    spec.write_text(yaml.safe_dump(SERVE))
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "fleetllm", "k8s", "render", str(spec), "-o", str(out), "--fleet", "--image", "img:1"],
        capture_output=True, text=True, check=False, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(Path(line).name for line in result.stdout.split())
    assert "rayclusterfleet-smollm2-qwen-7b.yaml" in names
    fleet = yaml.safe_load((out / "rayclusterfleet-smollm2-qwen-7b.yaml").read_text())
    assert containers(fleet["spec"]["template"]["spec"]["headGroupSpec"])[0]["image"] == "img:1"


def test_every_object_and_pod_carries_kubernetes_recommended_labels(tmp_path):
    import fleetllm

    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(SERVE))
    objects = [*render_spec_file(path, OPTS), *render_job(job(replicas=2), "name: x\n", OPTS)]
    for obj in objects:
        found = [obj["metadata"]["labels"]]
        cluster = obj.get("spec", {}).get("rayClusterConfig") or obj.get("spec", {}).get("rayClusterSpec")
        if cluster:
            found += [g["template"]["metadata"]["labels"] for g in [cluster["headGroupSpec"],
                                                                      *cluster["workerGroupSpecs"]]]
        for labels in found:
            assert labels["app.kubernetes.io/name"] == "fleetllm" and labels["app.kubernetes.io/instance"]
            assert labels["app.kubernetes.io/managed-by"] == "fleetllm"
            assert labels["app.kubernetes.io/version"] == fleetllm.__version__
            assert labels["app.kubernetes.io/component"] in ("job", "serve")
            assert not [k for k in labels if k.startswith("fleetllm.io/")], labels


def test_render_refuses_a_replica_listening_itself_which_a_rayservice_cannot_give(tmp_path):
    path = tmp_path / "serve.yaml"
    one = {"model_id": "smollm2", "source": "smollm2-135m-instruct", "replicas": 1}
    path.write_text(yaml.safe_dump({**copy.deepcopy(SERVE), "http": "replica", "models": [one]}))
    with pytest.raises(SpecError, match="http: replica needs a Ray started by `fleetllm serve`"):
        render_spec_file(path, OPTS)
