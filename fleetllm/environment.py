"""A job's (or a served app's) environment: `environment: {pip, env_vars, working_dir}` in the spec,
applied as Ray's `runtime_env`, so a cluster's workers install and set what the job needs.

    environment:
      pip: ["datasets>=3", "my-tokenizer-plugin==1.2"]   # installed in the replicas' environment
      env_vars: {HF_HUB_OFFLINE: "1"}                    # set in every replica process
        # or HF_TOKEN: {secretKeyRef: {name: hf, key: token}}: a Kubernetes Secret (fleetllm.secrets)
      working_dir: ./src                                 # uploaded to every node (a local folder or a URI)
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fleetllm.secrets import SecretRef


class EnvironmentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    pip: list[str] = Field(default_factory=list, description="pip requirements installed for the replicas "
                           "(Ray runtime_env `pip`), e.g. ['datasets>=3'].")
    env_vars: dict[str, str | SecretRef] = Field(
        default_factory=dict, description="Environment variables set in every replica process (Ray runtime_env "
        "`env_vars`). A value may be {secretKeyRef: {name, key}}: a Kubernetes Secret, set on the pods by "
        "`fleetllm k8s render` and never written into a manifest (elsewhere the variable must already be set).")
    working_dir: str | None = Field(None, description="A local folder or a URI (s3://.../code.zip) shipped to "
                                    "every node and made the replicas' working directory.")

    @field_validator("env_vars", mode="before")
    @classmethod
    def _text_values(cls, value: Any) -> Any:
        if isinstance(value, dict):
            bad = [k for k, v in value.items() if isinstance(v, list) or v is None
                   or (isinstance(v, dict) and set(v) != {"secretKeyRef"})]
            if bad:
                raise ValueError(f"environment.env_vars {bad} must be text, numbers or booleans (environment "
                                 "variables are strings; quote them), or a Kubernetes Secret reference "
                                 "{secretKeyRef: {name, key}}")
            return {str(k): v if isinstance(v, (dict, SecretRef)) else str(v).lower() if isinstance(v, bool)
                    else str(v) for k, v in value.items()}
        return value

    def literal_env(self) -> dict[str, str]:
        """The env_vars that hold their value (not a Secret reference)."""
        return {k: v for k, v in self.env_vars.items() if isinstance(v, str)}

    def secret_refs(self) -> dict[str, SecretRef]:
        return {k: v for k, v in self.env_vars.items() if isinstance(v, SecretRef)}

    @field_validator("pip")
    @classmethod
    def _no_blank(cls, value: list[str]) -> list[str]:
        if any(not p.strip() for p in value):
            raise ValueError(f"environment.pip has an empty requirement in {value}; remove it")
        return value

    def runtime_env(self) -> dict[str, Any] | None:
        """Ray's runtime_env for this environment (None when empty)."""
        env: dict[str, Any] = {}
        if self.pip:
            env["pip"] = list(self.pip)
        if self.literal_env():  # a Secret reference is the pods' own variable (fleetllm.secrets)
            env["env_vars"] = self.literal_env()
        if self.working_dir:
            env["working_dir"] = self.working_dir
        return env or None

    def describe(self) -> str:
        """One line for a plan."""
        if self.runtime_env() is None:
            return "the workers' own (no environment: section)"
        parts = []
        if self.pip:
            parts.append(f"pip {self.pip}")
        if self.env_vars:
            parts.append(f"env_vars {sorted(self.env_vars)}")
        if self.working_dir:
            parts.append(f"working_dir {self.working_dir}")
        return "; ".join(parts) + " (Ray runtime_env)"

    def check_local(self) -> None:
        """A local working_dir must exist where the run starts (it is uploaded from there)."""
        import os

        from fleetllm.errors import SpecError

        wd = self.working_dir
        if wd and "://" not in wd and not os.path.isdir(wd):
            raise SpecError(f"environment.working_dir {wd!r} is not a folder; give a local folder or a URI "
                            "such as s3://bucket/code.zip")

    def check_refs_set(self) -> None:
        """On a local Ray (whose processes inherit this one's environment), the variables that name
        Kubernetes Secrets must be set here; on a cluster they are the nodes' (not checked from here)."""
        import os

        from fleetllm.errors import SpecError

        unset = {k: r.secretKeyRef for k, r in self.secret_refs().items() if k not in os.environ}
        if unset:
            shown = ", ".join(f"{k} (Secret {r.name!r}, key {r.key!r})" for k, r in sorted(unset.items()))
            raise SpecError(f"environment.env_vars {shown} name Kubernetes Secrets, which only pods rendered by "
                            f"`fleetllm k8s render` read; set {', '.join(sorted(unset))} in this environment")
