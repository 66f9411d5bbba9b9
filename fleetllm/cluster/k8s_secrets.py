"""Secrets in `fleetllm k8s render`: no secret value is written into a manifest but a `Secret`.

- A value that names a Kubernetes Secret (`{secretKeyRef: {name, key}}`: in `environment.env_vars`, or
  the serve `api_key`) becomes a container env var with `valueFrom.secretKeyRef` on the head and
  worker pods (Ray's processes inherit it); the spec in the ConfigMap and in serveConfigV2 keeps the
  reference, and the runtime env leaves it out.
- A literal value under a name that looks secret (TOKEN, SECRET, KEY, PASSWORD...), a literal serve
  `api_key` and a literal `model.engine_kwargs.api_key` of a job are moved into a `Secret` of their own
  (`<name>-secrets`, rendered beside the other manifests) and referenced from there the same way.

`secure(data, name, ...)` rewrites a spec (as YAML data) that way and returns the Secret and the env
entries the pods need; the render functions take the rewritten spec, so nothing else changes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from fleetllm.secrets import API_KEY_ENV, SecretRef, looks_secret


@dataclass
class Secured:
    """What a spec's secrets become: the Secret manifest (None if nothing was moved), the env entries of
    the head and worker containers, and the names moved out of the spec (for the printed line)."""

    secret: dict[str, Any] | None = None
    env: list[dict[str, Any]] = field(default_factory=list)
    moved: list[str] = field(default_factory=list)

    def manifests(self, others: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return ([self.secret] if self.secret else []) + others


class _Mover:
    def __init__(self, secret_name: str) -> None:
        self.secret_name, self.data, self.env, self.moved = secret_name, {}, [], []

    def reference(self, variable: str, value: Any) -> dict[str, Any]:
        """The env entry of `variable` and the reference that replaces `value` in the spec."""
        if isinstance(value, (dict, SecretRef)):
            ref = SecretRef.model_validate(value)
        else:
            self.data[variable] = str(value)
            self.moved.append(variable)
            ref = SecretRef.model_validate({"secretKeyRef": {"name": self.secret_name, "key": variable}})
        self.env.append({"name": variable, "valueFrom": ref.value_from()})
        return ref.model_dump()


def secure(data: dict[str, Any], name: str, labels: dict[str, str], namespace: str | None,
           serve: bool) -> tuple[dict[str, Any], Secured]:
    """(the spec with every secret value replaced by a reference, what the manifests need)."""
    data = copy.deepcopy(data)
    mover = _Mover(f"{name}-secrets")
    env_vars = (data.get("environment") or {}).get("env_vars") or {}
    for variable, value in list(env_vars.items()):
        if isinstance(value, dict) or (looks_secret(variable) and value is not None):
            env_vars[variable] = mover.reference(variable, value)
    if serve and data.get("api_key") is not None:
        data["api_key"] = mover.reference(API_KEY_ENV, data["api_key"])
    kwargs = (data.get("model") or {}).get("engine_kwargs") or {}
    if not serve and kwargs.get("api_key") is not None:  # the openai engine's key: read from its variable
        variable = kwargs.get("api_key_env") or "OPENAI_API_KEY"
        mover.reference(variable, kwargs.pop("api_key"))
        kwargs["api_key_env"] = variable
    out = Secured(env=mover.env, moved=mover.moved)
    if mover.data:
        meta: dict[str, Any] = {"name": mover.secret_name, "labels": dict(labels)}
        if namespace:
            meta["namespace"] = namespace
        out.secret = {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque",
                      "stringData": mover.data}
    return data, out


def secret_note(manifests: list[dict[str, Any]]) -> str | None:
    """The line `fleetllm k8s render` prints when it moved literal secrets into a Secret manifest."""
    secret = next((m for m in manifests if m.get("kind") == "Secret"), None)
    if secret is None:
        return None
    name = secret["metadata"]["name"]
    return (f"{', '.join(secret['stringData'])} written only into the Secret {name!r} (secret-{name}.yaml) and "
            "referenced from the pods with secretKeyRef; keep that file out of version control, or create the "
            "Secret yourself and give the spec {secretKeyRef: {name, key}} references instead")
