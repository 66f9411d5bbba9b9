"""A hub model's revision pinned to its commit: a branch or tag (`main`) moves, so a job names the commit
it started with, in its fingerprint and in what its replicas load. A model updated on the hub between a
crash and the resume is then a different job (refused, naming the model) instead of two models mixed.

The commit comes from the hub (`HfApi.model_info`); where the hub cannot be reached (offline,
HF_HUB_OFFLINE=1) from the local Hugging Face cache (`snapshot_download(local_files_only=True)`: the
snapshot the revision points to there).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path

from fleetllm.errors import ModelError
from fleetllm.models import ResolvedModel

COMMIT = re.compile(r"^[0-9a-f]{40}$")
log = logging.getLogger("fleetllm.models")


def pin_revision(model: ResolvedModel, revision: str | None = None) -> ResolvedModel:
    """The hub model with its revision (`revision`, else the model's, else main) as a commit hash;
    other models unchanged."""
    if model.kind != "hub":
        return model
    wanted = revision or model.revision or "main"
    if COMMIT.match(wanted):
        return dataclasses.replace(model, revision=wanted)
    sha = _from_hub(model.path, wanted) or _from_cache(model.path, wanted)
    if sha is None:
        raise ModelError(f"hub model {model.path!r} at revision {wanted!r}: its commit cannot be found (the hub "
                         "cannot be reached and the model is not in the local Hugging Face cache); connect to the "
                         "hub, or give model.revision as a commit hash")
    log.info("hub model %s at %s is commit %s", model.path, wanted, sha)
    return dataclasses.replace(model, revision=sha)


def _from_hub(repo: str, revision: str) -> str | None:
    from huggingface_hub import HfApi, constants

    if constants.HF_HUB_OFFLINE:
        return None
    try:
        return HfApi().model_info(repo, revision=revision).sha
    except Exception as exc:  # noqa: BLE001 - unreachable or refused: the cache may know
        log.info("hub model %s: the hub did not answer (%s); trying the local cache", repo, exc)
        return None


def _from_cache(repo: str, revision: str) -> str | None:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo, revision=revision, local_files_only=True)).name
    except Exception:  # noqa: BLE001 - not cached
        return None
