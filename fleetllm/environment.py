"""A job's (or a served app's) environment: `environment: {pip, env_vars, working_dir}` in the spec,
applied as Ray's `runtime_env`, so a cluster's workers install and set what the job needs.

    environment:
      pip: ["datasets>=3", "my-tokenizer-plugin==1.2"]   # installed in the replicas' environment
      env_vars: {HF_HUB_OFFLINE: "1"}                    # set in every replica process
      working_dir: ./src                                 # uploaded to every node (a local folder or a URI)
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class EnvironmentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    pip: list[str] = Field(default_factory=list, description="pip requirements installed for the replicas "
                           "(Ray runtime_env `pip`), e.g. ['datasets>=3'].")
    env_vars: dict[str, str] = Field(default_factory=dict, description="Environment variables set in every "
                                     "replica process (Ray runtime_env `env_vars`).")
    working_dir: str | None = Field(None, description="A local folder or a URI (s3://.../code.zip) shipped to "
                                    "every node and made the replicas' working directory.")

    @field_validator("env_vars", mode="before")
    @classmethod
    def _text_values(cls, value: Any) -> Any:
        if isinstance(value, dict):
            bad = [k for k, v in value.items() if isinstance(v, (dict, list)) or v is None]
            if bad:
                raise ValueError(f"environment.env_vars {bad} must be text, numbers or booleans (environment "
                                 "variables are strings); quote them")
            return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}
        return value

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
        if self.env_vars:
            env["env_vars"] = dict(self.env_vars)
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
