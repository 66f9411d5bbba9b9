"""LoRA adapter sources (`lora_adapters: {name: source}`): a local folder, an object-store URL or a hub id,
resolved to a local folder holding `adapter_config.json` (peft's format, which vLLM also loads).

Object-store folders (s3://, gs://, abfs://, ...) are copied once into FLEETLLM_HOME/adapters/<hash>/;
hub ids are fetched with huggingface_hub into its cache. `max_rank` reads the adapters' ranks, so the
vLLM engine sizes `max_lora_rank` itself.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Iterable, Mapping

from fleetllm.errors import ModelError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
CONFIG = "adapter_config.json"


def check_names(adapters: Mapping[str, str], base_id: str | None = None) -> None:
    """ValueError naming an adapter name that cannot be a model id (or collides with the base's)."""
    for name in adapters:
        if not NAME.match(name):
            raise ValueError(f"LoRA adapter name {name!r} must be letters, digits, '.', '_' or '-' "
                             "(it becomes a model id and a column value)")
        if base_id is not None and name == base_id:
            raise ValueError(f"LoRA adapter name {name!r} is the base model's id; give the adapter another name")


def model_ids(served: Mapping[str, Iterable[str]]) -> dict[str, tuple[str, str]]:
    """The model ids of served models' LoRA adapters ({base model id: adapter names}): each adapter's name
    (vLLM's --lora-modules convention; unless another served model has that id, or an earlier base an adapter
    of that name) and `<model_id>:<name>` (Ray Serve LLM's multiplexing), mapped to (base model id, name)."""
    ids: dict[str, tuple[str, str]] = {}
    for base, names in served.items():
        for name in names or ():
            ids[f"{base}:{name}"] = (base, name)
            if name not in served:
                ids.setdefault(name, (base, name))
    return ids


def resolve(name: str, source: str) -> str:
    """The local folder of one adapter source; ModelError naming the adapter and the fix."""
    local = Path(source).expanduser()
    if is_local(source):
        if not (local / CONFIG).is_file():
            raise ModelError(f"LoRA adapter {name!r}: {source!r} is not a peft adapter folder (no {CONFIG} in it); "
                             "give a folder saved with peft's save_pretrained")
        return str(local.resolve())
    if "://" in source:
        return _from_store(name, source)
    if source.count("/") == 1:
        try:
            from huggingface_hub import snapshot_download

            return snapshot_download(source)
        except Exception as exc:  # noqa: BLE001 - offline, unknown id, no access: one message
            raise ModelError(f"LoRA adapter {name!r}: could not fetch {source!r} from the Hugging Face hub: "
                             f"{exc}") from None
    raise ModelError(f"LoRA adapter {name!r}: source {source!r} is neither a local folder, an object-store URL "
                     "(s3://...) nor a Hugging Face id of the form org/name")


def resolve_all(adapters: Mapping[str, str], fetch: bool = True) -> dict[str, str]:
    """{name: local folder}. fetch=False (planning): nothing copied or downloaded; local folders resolved and
    checked, object-store URLs and hub ids fetched before taken as their copies, the others kept as given."""
    if fetch:
        return {name: resolve(name, source) for name, source in adapters.items()}
    return {name: resolve(name, source) if is_local(source) else (fetched(source) or source)
            for name, source in adapters.items()}


def fetched(source: str) -> str | None:
    """The local copy of an object-store URL or hub id fetched before, or None (nothing is downloaded)."""
    if "://" in source:
        dest = _store_copy(source)
        return str(dest) if (dest / CONFIG).is_file() else None
    if source.count("/") == 1:
        try:
            from huggingface_hub import snapshot_download

            return snapshot_download(source, local_files_only=True)
        except Exception:  # noqa: BLE001 - not in the hub cache (or no hub library): not fetched
            return None
    return None


def _store_copy(url: str) -> Path:
    from fleetllm.models import fleetllm_home

    return fleetllm_home() / "adapters" / hashlib.sha256(url.encode()).hexdigest()[:16]


def is_local(source: str) -> bool:
    return Path(source).expanduser().exists() or source.startswith((".", "/", "~"))


def _from_store(name: str, url: str) -> str:
    import fsspec

    dest = _store_copy(url)
    if (dest / CONFIG).is_file():
        return str(dest)
    try:
        fs, root = fsspec.core.url_to_fs(url)
        tmp = dest.with_name(dest.name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        for path in fs.find(root):
            target = tmp / Path(path).relative_to(root.rstrip("/")) if path != root else tmp / Path(path).name
            target.parent.mkdir(parents=True, exist_ok=True)
            fs.get(path, str(target))
        if not (tmp / CONFIG).is_file():
            raise ModelError(f"LoRA adapter {name!r}: {url!r} holds no {CONFIG}; give the adapter's folder")
        tmp.rename(dest)
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - credentials, missing bucket: one message
        raise ModelError(f"LoRA adapter {name!r}: could not copy {url!r}: {exc}") from None
    return str(dest)


def rank(folder: str) -> int:
    """The LoRA rank (`r`, or the largest of `rank_pattern`) of a resolved adapter folder."""
    config = json.loads((Path(folder) / CONFIG).read_text())
    ranks = [int(config.get("r") or 8), *(int(v) for v in (config.get("rank_pattern") or {}).values())]
    return max(ranks)


def max_rank(adapters: Mapping[str, str]) -> int:
    """The rank vLLM's max_lora_rank must allow: the largest adapter's, rounded up to a size vLLM supports."""
    need = max((rank(folder) for folder in adapters.values()), default=8)
    for size in (8, 16, 32, 64, 128, 256, 320, 512):
        if need <= size:
            return size
    return need
