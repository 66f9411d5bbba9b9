"""Secrets in specs: a value may name a Kubernetes Secret instead of holding the secret itself, and
an API key must be one a client can send.

    environment:
      env_vars:
        HF_TOKEN: {secretKeyRef: {name: hf, key: token}}   # read from the Secret `hf`, key `token`
    api_key: {secretKeyRef: {name: serve-key, key: key}}    # (serve.yaml)

A reference is never resolved by fleetllm: on Kubernetes (`fleetllm k8s render`) it becomes a
container env var with `valueFrom.secretKeyRef` on the head and worker pods, which Ray's processes
inherit; elsewhere the variable must already be set in the environment of the process (and, on a
cluster, of its nodes). The serve `api_key` reference becomes $FLEETLLM_API_KEY.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

API_KEY_ENV = "FLEETLLM_API_KEY"
SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")  # DNS-1123 subdomain
SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
# a name one of whose _-separated words says secret: HF_TOKEN, AWS_SECRET_ACCESS_KEY, OPENAI_API_KEY,
# DB_PASSWORD (not TOKENIZERS_PARALLELISM)
SECRET_LOOKING = re.compile(r"(?:^|_)(?:TOKEN|SECRET|KEY|APIKEY|PASSWORD|PASSWD|CREDENTIALS?)(?:_|$)", re.IGNORECASE)


class SecretKey(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(..., description="The Kubernetes Secret's name.")
    key: str = Field(..., description="The key within the Secret.")

    @field_validator("name")
    @classmethod
    def _dns(cls, value: str) -> str:
        if len(value) > 253 or not SECRET_NAME.match(value):
            raise ValueError(f"secretKeyRef.name {value!r} is not a Kubernetes name (lower case letters, digits, "
                             "'-' and '.')")
        return value

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        if not SECRET_KEY.match(value):
            raise ValueError(f"secretKeyRef.key {value!r} is not a Secret key (letters, digits, '-', '_', '.')")
        return value


class SecretRef(BaseModel):
    """A value kept in a Kubernetes Secret: `{secretKeyRef: {name, key}}`, as a pod's env `valueFrom`."""

    model_config = ConfigDict(extra="forbid")
    secretKeyRef: SecretKey = Field(..., description="The Secret and key holding the value.")

    def value_from(self) -> dict[str, dict[str, str]]:
        return {"secretKeyRef": self.secretKeyRef.model_dump()}


def looks_secret(name: str) -> bool:
    """An environment variable whose name says it holds a secret (HF_TOKEN, AWS_SECRET_ACCESS_KEY...)."""
    return SECRET_LOOKING.search(name) is not None


def check_api_key(key: str, where: str) -> str:
    """`key` if a client can send it in `Authorization: Bearer <key>`; else ValueError naming the fix.
    Surrounding spaces are dropped by HTTP clients and servers, and header values are ASCII."""
    if not key:
        raise ValueError(f"{where} is empty; give a key, or leave it out for a server without one")
    if key != key.strip():
        raise ValueError(f"{where} has spaces around it, which no client can send in the Authorization header "
                         "(HTTP drops them); remove them")
    bad = sorted({c for c in key if not (" " < c < "\x7f")})
    if bad:
        shown = ", ".join(repr(c) for c in bad[:5])
        raise ValueError(f"{where} holds {shown}: an API key must be printable ASCII without spaces to travel in "
                         "the Authorization header; choose another key")
    return key
