"""Kubernetes manifests for fleetllm: KubeRay RayJob (batch), RayService + Service + Gateway API
HTTPRoute (serving), and AIBrix RayClusterFleet (serving fleets with rolling updates).

Pure functions from a spec to dicts; `render_spec_file` picks by the YAML's shape (a top-level `models:`
key means a serve spec) and `write_manifests` dumps them with yaml.safe_dump.

Serve specs are validated by fleetllm.serve.spec.ServeSpec (through serve_adapter.serve_view), the
model `fleetllm serve` runs. The RayService's app is `fleetllm.cluster.serve_adapter:app_from_spec`, a
Ray Serve application builder called with `args = {"spec": <the serve spec as a dict>}`.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import yaml

from fleetllm.cluster.k8s_pods import (
    SERVE_PORT,
    PodShape,
    RenderOptions,
    config_map,
    dns_name,
    head_group,
    ray_cluster_spec,
    spec_volume,
    token_env,
    worker_group,
)
from fleetllm.cluster.k8s_secrets import secure
from fleetllm.cluster.serve_adapter import ServeView, serve_view
from fleetllm.errors import SpecError
from fleetllm.serve.spec import load_serve_spec
from fleetllm.sizing import replica_gpus
from fleetllm.spec import JobSpec, load_yaml, parse_spec

SERVE_APP_IMPORT_PATH = "fleetllm.cluster.serve_adapter:app_from_spec"
SPEC_DIR = "/etc/fleetllm"


def _meta(name: str, opts: RenderOptions, labels: dict[str, str]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(labels)}
    if opts.namespace:
        meta["namespace"] = opts.namespace
    return meta


def _base_labels(name: str, opts: RenderOptions, component: str) -> dict[str, str]:
    """Kubernetes' recommended labels (app.kubernetes.io/*): kubectl, dashboards and tools select on them."""
    from fleetllm import __version__

    return {"app.kubernetes.io/name": "fleetllm", "app.kubernetes.io/instance": name,
            "app.kubernetes.io/component": component, "app.kubernetes.io/part-of": "fleetllm",
            "app.kubernetes.io/managed-by": "fleetllm", "app.kubernetes.io/version": __version__, **opts.labels}


def worker_shape(gpus: int, cpus_per_replica: float, opts: RenderOptions) -> PodShape:
    """A worker pod holding one engine replica: its GPUs, the replica's CPUs plus one for Ray (at least
    4 per GPU, for the engine's tokenizer and scheduler processes)."""
    return PodShape(gpus=gpus, cpus=max(cpus_per_replica + 1, 4 * gpus), memory=opts.worker_memory)


def job_gpus_per_replica(job: JobSpec) -> int:
    """compute.gpus_per_replica when set; else tp x pp for vllm/auto (a GPU cluster runs vLLM), 0 for
    transformers. Fractions round up: a pod gets whole GPUs."""
    return math.ceil(replica_gpus(job.model.engine, job.model.engine_kwargs, job.compute.gpus_per_replica,
                                  gpus_present=True))


# --------------------------------------------------------------------------------------------- jobs


def render_job(job: JobSpec, spec_text: str, opts: RenderOptions, replicas: int | None = None,
               env: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """A ConfigMap with the job YAML and a RayJob that runs `python -m fleetllm run` on it.

    One worker pod per engine replica, each with gpus_per_replica GPUs (tp x pp); `replicas` overrides
    compute.replicas (needed when it is 'auto'); `env`: the head's and workers' env entries (Secret
    references, fleetllm.cluster.k8s_secrets)."""
    if replicas is None:
        if job.compute.replicas == "auto":
            raise SpecError("compute.replicas is 'auto'; pass --replicas N to size the worker group on Kubernetes")
        replicas = int(job.compute.replicas)
    name = dns_name(job.name)
    labels = _base_labels(name, opts, "job")
    cm_name = f"{name}-spec"
    volumes, mounts = spec_volume(cm_name)
    shape = worker_shape(job_gpus_per_replica(job), job.compute.cpus_per_replica, opts)
    head = head_group(opts, labels, env=env, mounts=mounts, volumes=volumes)
    workers = [worker_group("replicas", opts, labels, shape, replicas=replicas, env=env)]
    rayjob = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": _meta(name, opts, labels),
        "spec": {
            "entrypoint": f"python -m fleetllm run {SPEC_DIR}/job.yaml",
            "submissionMode": "K8sJobMode",
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 600,
            "backoffLimit": 0,
            "rayClusterSpec": ray_cluster_spec(head, workers),
        },
    }
    if job.environment.runtime_env():  # the job's environment: (pip, env_vars, working_dir)
        rayjob["spec"]["runtimeEnvYAML"] = yaml.safe_dump(job.environment.runtime_env(), sort_keys=False)
    return [config_map(cm_name, "job.yaml", spec_text, labels, opts.namespace), rayjob]


def job_path_notes(job: JobSpec) -> list[str]:
    """Warnings for paths that only exist on the machine that renders the manifests."""
    notes = []
    wd = job.environment.working_dir
    for field_name, path in (("input.path", job.input.path), ("output.path", job.output.path),
                             *((("environment.working_dir", wd),) if wd else ())):
        if "://" not in path:
            notes.append(
                f"{field_name} {path!r} is a local path; inside the cluster use a URL (s3://, gs://, ...) "
                "or a volume mounted at that path in the head and worker pods"
            )
    return notes


# ------------------------------------------------------------------------------------------- serve


def cluster_serve_spec(data: dict[str, Any]) -> dict[str, Any]:
    """The serve spec as it runs inside the cluster: listening on all interfaces, port 8000, the
    cluster's own Ray (address null)."""
    spec = copy.deepcopy(data)
    spec["host"] = "0.0.0.0"
    spec["port"] = SERVE_PORT
    spec["cluster"] = {"address": None}
    return spec


def serve_config(view: ServeView) -> dict[str, Any]:
    """serveConfigV2 (a Ray Serve multi-application config) running the fleetllm app."""
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": "0.0.0.0", "port": SERVE_PORT},
        "applications": [
            {
                "name": dns_name(view.name),
                "route_prefix": "/",
                "import_path": SERVE_APP_IMPORT_PATH,
                "args": {"spec": cluster_serve_spec(view.spec_dict())},
                **({"runtime_env": view.spec.environment.runtime_env()} if view.spec.environment.runtime_env() else {}),
            }
        ],
    }


def _serve_workers(view: ServeView, opts: RenderOptions, labels: dict[str, str],
                   env: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    return [
        worker_group(
            m.model_id,
            opts,
            labels,
            worker_shape(m.gpus_per_replica, m.cpus_per_replica, opts),
            replicas=m.replicas,
            min_replicas=m.min_replicas,
            max_replicas=m.max_replicas,
            env=env,
        )
        for m in view.models
    ]


def render_rayservice(view: ServeView, opts: RenderOptions, env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A RayService whose cluster has one worker group per served model (one pod per replica); `env`:
    the head's and workers' env entries (Secret references)."""
    name = dns_name(view.name)
    labels = _base_labels(name, opts, "serve")
    autoscale = any(m.min_replicas != m.max_replicas for m in view.models)
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": _meta(name, opts, labels),
        "spec": {
            "serveConfigV2": yaml.safe_dump(serve_config(view), sort_keys=False),
            "rayClusterConfig": ray_cluster_spec(
                head_group(opts, labels, env=env), _serve_workers(view, opts, labels, env), autoscale=autoscale
            ),
        },
    }


def render_service(view: ServeView, opts: RenderOptions) -> dict[str, Any]:
    """A ClusterIP Service in front of the RayService's serving pods (port 8000, OpenAI API)."""
    name = dns_name(view.name)
    labels = _base_labels(name, opts, "serve")
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(f"{name}-openai", opts, labels),
        "spec": {
            "type": "ClusterIP",
            # Our pod templates carry app.kubernetes.io/instance; KubeRay labels the pods whose Serve
            # proxy is ready with ray.io/serve=true.
            "selector": {"app.kubernetes.io/instance": name, "ray.io/serve": "true"},
            "ports": [{"name": "http", "port": SERVE_PORT, "targetPort": SERVE_PORT, "protocol": "TCP"}],
        },
    }


def render_httproute(
    view: ServeView, opts: RenderOptions, service: str, gateway: str = "aibrix-eg",
    gateway_namespace: str = "aibrix-system"
) -> dict[str, Any]:
    """A Gateway API HTTPRoute with one rule per model, matched on the `model` header (which the
    gateway, e.g. AIBrix's, fills from the request body), all sent to `service`."""
    name = dns_name(view.name)
    labels = _base_labels(name, opts, "serve")
    rules = [
        {
            "matches": [
                {
                    "path": {"type": "PathPrefix", "value": "/v1"},
                    "headers": [{"type": "Exact", "name": "model", "value": m.model_id}],
                }
            ],
            "backendRefs": [{"name": service, "port": SERVE_PORT}],
            "timeouts": {"request": "300s"},
        }
        for m in view.models
    ]
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": _meta(f"{name}-router", opts, labels),
        "spec": {"parentRefs": [{"name": gateway, "namespace": gateway_namespace}], "rules": rules},
    }


def render_fleet(
    view: ServeView, opts: RenderOptions, *, max_surge: int | str = 1, max_unavailable: int | str = 0,
    env: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """One AIBrix RayClusterFleet per model (a ConfigMap with that model's serve spec each).

    Each fleet replica is a whole Ray cluster serving one engine replica (a head, and one worker with
    the replica's GPUs); `replicas` is the model's replica count and updates roll
    (maxSurge/maxUnavailable). The head runs KubeRay's `ray start` then `python -m fleetllm serve`.
    Token auth: the containers read RAY_AUTH_TOKEN from the Secret `<name>-ray-token` (key
    auth_token), which you create once: `kubectl create secret generic <name>-ray-token
    --from-literal=auth_token=$(openssl rand -hex 32)`.
    """
    out: list[dict[str, Any]] = []
    for model in view.models:
        name = dns_name(f"{view.name}-{model.model_id}")
        labels = {**_base_labels(name, opts, "fleet"), "model.aibrix.ai/name": model.model_id}
        cm_name = f"{name}-spec"
        volumes, mounts = spec_volume(cm_name)
        pod_env = token_env(f"{name}-ray-token") + list(env or [])
        annotations = {"ray.io/overwrite-container-cmd": "true"}
        head = head_group(
            opts,
            labels,
            env=pod_env,
            mounts=mounts,
            volumes=volumes,
            annotations=annotations,
            command=["/bin/bash", "-lc", "--"],
            args=[f"ulimit -n 65536; $KUBERAY_GEN_RAY_START_CMD; python -m fleetllm serve {SPEC_DIR}/serve.yaml"],
        )
        shape = worker_shape(model.gpus_per_replica, model.cpus_per_replica, opts)
        workers = [worker_group(model.model_id, opts, labels, shape, replicas=1, env=pod_env)]
        # the fleet's RayCluster template has no authOptions
        cluster = ray_cluster_spec(head, workers, token_auth=False)
        fleet = {
            "apiVersion": "orchestration.aibrix.ai/v1alpha1",
            "kind": "RayClusterFleet",
            "metadata": _meta(name, opts, labels),
            "spec": {
                "replicas": model.replicas,
                "selector": {"matchLabels": {"model.aibrix.ai/name": model.model_id}},
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": max_surge, "maxUnavailable": max_unavailable},
                },
                "template": {"metadata": {"labels": labels, "annotations": annotations}, "spec": cluster},
            },
        }
        spec_text = yaml.safe_dump(cluster_serve_spec(view.spec_dict(model.model_id)), sort_keys=False)
        out += [config_map(cm_name, "serve.yaml", spec_text, labels, opts.namespace), fleet]
    return out


# ----------------------------------------------------------------------------------------- files


def is_serve_spec(data: dict[str, Any]) -> bool:
    """A serve YAML has a top-level `models:` list; a job YAML does not."""
    return "models" in data


def render_spec_file(
    path: str | Path,
    opts: RenderOptions,
    *,
    fleet: bool = False,
    replicas: int | None = None,
    gateway: str = "aibrix-eg",
    gateway_namespace: str = "aibrix-system",
    **fleet_kwargs: Any,
) -> list[dict[str, Any]]:
    """All manifests for a job or serve YAML file; secret values go into a `Secret` manifest of their own,
    first in the list, and nowhere else (fleetllm.cluster.k8s_secrets)."""
    data = load_yaml(path)
    if is_serve_spec(data):
        name = dns_name(load_serve_spec(path).name)  # the loader `fleetllm serve` uses
        data, secured = secure(data, name, _base_labels(name, opts, "serve"), opts.namespace, serve=True)
        view = serve_view(data, str(path))
        if fleet:
            return secured.manifests(render_fleet(view, opts, env=secured.env, **fleet_kwargs))
        service = render_service(view, opts)
        route = render_httproute(view, opts, service["metadata"]["name"], gateway, gateway_namespace)
        return secured.manifests([render_rayservice(view, opts, secured.env), service, route])
    if fleet:
        raise SpecError(f"{path} is a job spec; --fleet renders serve specs (a YAML with `models:`)")
    name = dns_name(parse_spec(JobSpec, data, str(path)).name)
    data, secured = secure(data, name, _base_labels(name, opts, "job"), opts.namespace, serve=False)
    job = parse_spec(JobSpec, data, str(path))
    text = yaml.safe_dump(data, sort_keys=False) if secured.moved else Path(path).read_text()  # values removed
    return secured.manifests(render_job(job, text, opts, replicas=replicas, env=secured.env))


class _ManifestDumper(yaml.SafeDumper):
    """yaml's safe dumper, writing multi-line strings (serveConfigV2, spec files) as literal blocks."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_ManifestDumper.add_representer(str, _str_representer)


def dump_manifest(manifest: dict[str, Any]) -> str:
    """A manifest as YAML text (safe dumper; multi-line strings as literal blocks)."""
    return yaml.dump(manifest, Dumper=_ManifestDumper, sort_keys=False)


def write_manifests(manifests: list[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    """One YAML file per manifest, named `<kind>-<name>.yaml`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for manifest in manifests:
        path = out / f"{manifest['kind'].lower()}-{manifest['metadata']['name']}.yaml"
        path.write_text(dump_manifest(manifest))
        paths.append(path)
    return paths
