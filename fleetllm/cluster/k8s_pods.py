"""Building blocks of KubeRay manifests: Ray cluster specs, head/worker groups, containers, probes.

Pure functions returning plain dicts (dumped with yaml.safe_dump by fleetllm.cluster.k8s).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

GCS_PORT = 6379
DASHBOARD_PORT = 8265
CLIENT_PORT = 10001
SERVE_PORT = 8000
AGENT_PORT = 52365  # the dashboard agent on every node (KubeRay's default)
GPU_RESOURCE = "nvidia.com/gpu"


def ray_version() -> str:
    """The installed Ray's version (the image's Ray must match it)."""
    return metadata.version("ray")


def dns_name(text: str, limit: int = 50) -> str:
    """A DNS-1123 name (lower case, digits, '-') made from `text`."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)[:limit].strip("-")
    return name or "fleetllm"


@dataclass(frozen=True)
class PodShape:
    """What one pod of a group gets."""

    gpus: int = 0
    cpus: float = 1.0
    memory: str | None = None

    def resources(self) -> dict[str, dict[str, Any]]:
        cpu = str(max(1, math.ceil(self.cpus)))
        memory = self.memory or f"{8 + 16 * self.gpus}Gi"
        limits: dict[str, Any] = {"cpu": cpu, "memory": memory}
        if self.gpus:
            limits[GPU_RESOURCE] = self.gpus
        return {"requests": {"cpu": cpu, "memory": memory}, "limits": dict(limits)}


@dataclass(frozen=True)
class RenderOptions:
    """Choices the manifests do not take from the spec."""

    image: str = "fleetllm:0.1.0"
    namespace: str | None = None
    head_cpus: float = 2.0
    head_memory: str = "8Gi"
    worker_memory: str | None = None
    image_pull_policy: str = "IfNotPresent"
    labels: dict[str, str] = field(default_factory=dict)


def _http_probe(port: int, path: str, *, initial_delay: int, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "initialDelaySeconds": initial_delay,
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def head_probes() -> dict[str, Any]:
    """The head is ready when its GCS answers through the dashboard (a path Ray leaves open under
    token authentication)."""
    return {
        "readinessProbe": _http_probe(DASHBOARD_PORT, "/api/gcs_healthz", initial_delay=10, period=5, failures=10),
        "livenessProbe": _http_probe(DASHBOARD_PORT, "/api/gcs_healthz", initial_delay=30, period=10, failures=12),
    }


def worker_probes() -> dict[str, Any]:
    """A worker is healthy when its raylet answers through the node's dashboard agent."""
    return {
        "readinessProbe": _http_probe(AGENT_PORT, "/api/local_raylet_healthz", initial_delay=10, period=5, failures=10),
        "livenessProbe": _http_probe(AGENT_PORT, "/api/local_raylet_healthz", initial_delay=30, period=10, failures=12),
    }


def container(
    name: str,
    opts: RenderOptions,
    shape: PodShape,
    *,
    head: bool,
    env: list[dict[str, Any]] | None = None,
    mounts: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The Ray container of a head or worker pod."""
    ports = [{"name": "metrics", "containerPort": 8080}]
    if head:
        ports = [
            {"name": "gcs", "containerPort": GCS_PORT},
            {"name": "dashboard", "containerPort": DASHBOARD_PORT},
            {"name": "client", "containerPort": CLIENT_PORT},
            {"name": "serve", "containerPort": SERVE_PORT},
        ] + ports
    out: dict[str, Any] = {
        "name": name,
        "image": opts.image,
        "imagePullPolicy": opts.image_pull_policy,
        "ports": ports,
        "resources": shape.resources(),
        **(head_probes() if head else worker_probes()),
        # Ray's object store lives in /dev/shm; give it room (the default 64 MiB is too small).
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}] + list(mounts or []),
    }
    if env:
        out["env"] = env
    return out


def pod_template(
    containers: list[dict[str, Any]],
    labels: dict[str, str],
    volumes: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"labels": dict(labels)}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {
        "metadata": meta,
        "spec": {
            "containers": containers,
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}] + list(volumes or []),
        },
    }


def head_group(
    opts: RenderOptions,
    labels: dict[str, str],
    *,
    shape: PodShape | None = None,
    env: list[dict[str, Any]] | None = None,
    mounts: list[dict[str, Any]] | None = None,
    volumes: list[dict[str, Any]] | None = None,
    command: list[str] | None = None,
    args: list[str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """headGroupSpec: a head that schedules no work of its own (num-cpus 0) unless given GPUs."""
    shape = shape or PodShape(gpus=0, cpus=opts.head_cpus, memory=opts.head_memory)
    box = container("ray-head", opts, shape, head=True, env=env, mounts=mounts)
    if command:
        box["command"] = command
    if args:
        box["args"] = args
    params = {"dashboard-host": "0.0.0.0", "num-cpus": "0" if not shape.gpus else str(max(1, math.ceil(shape.cpus)))}
    if shape.gpus:
        params["num-gpus"] = str(shape.gpus)
    return {
        "rayStartParams": params,
        "serviceType": "ClusterIP",
        "template": pod_template([box], labels, volumes, annotations),
    }


def worker_group(
    name: str,
    opts: RenderOptions,
    labels: dict[str, str],
    shape: PodShape,
    *,
    replicas: int,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
    env: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One workerGroupSpec: `replicas` pods of `shape` (one engine replica per pod)."""
    params = {"num-cpus": str(max(1, math.ceil(shape.cpus)))}
    if shape.gpus:
        params["num-gpus"] = str(shape.gpus)
    low = replicas if min_replicas is None else min_replicas
    high = replicas if max_replicas is None else max_replicas
    box = container("ray-worker", opts, shape, head=False, env=env)
    return {
        "groupName": dns_name(name, 40),
        "replicas": replicas,
        "minReplicas": low,
        "maxReplicas": max(high, replicas),
        "rayStartParams": params,
        "template": pod_template([box], labels, annotations=annotations),
    }


def ray_cluster_spec(
    head: dict[str, Any],
    workers: list[dict[str, Any]],
    *,
    autoscale: bool = False,
    token_auth: bool = True,
) -> dict[str, Any]:
    """A RayCluster spec; token authentication stays on (KubeRay makes and mounts the token Secret)."""
    spec: dict[str, Any] = {"rayVersion": ray_version(), "headGroupSpec": head, "workerGroupSpecs": workers}
    if token_auth:
        spec["authOptions"] = {"mode": "token"}
    if autoscale:
        spec["enableInTreeAutoscaling"] = True
    return spec


def token_env(secret_name: str) -> list[dict[str, Any]]:
    """Env vars that give a Ray container the cluster token from a Secret (for templates without
    KubeRay's authOptions, such as AIBrix fleets)."""
    return [
        {"name": "RAY_AUTH_MODE", "value": "token"},
        {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret_name, "key": "auth_token"}}},
    ]


def config_map(name: str, filename: str, text: str, labels: dict[str, str], namespace: str | None) -> dict[str, Any]:
    """A ConfigMap holding one spec file (mounted at /etc/fleetllm)."""
    meta: dict[str, Any] = {"name": name, "labels": dict(labels)}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {filename: text}}


def spec_volume(config_map_name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts) that put a ConfigMap's spec file under /etc/fleetllm."""
    return (
        [{"name": "fleetllm-spec", "configMap": {"name": config_map_name}}],
        [{"name": "fleetllm-spec", "mountPath": "/etc/fleetllm", "readOnly": True}],
    )
