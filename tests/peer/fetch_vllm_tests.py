"""Fetch vLLM's own OpenAI-server tests at a pinned version and adapt them to run against `fleetllm serve`.

Usage: python tests/peer/fetch_vllm_tests.py [DEST]  -> prints the folder holding the adapted tree.

The vllm 0.32.0 sdist (Apache-2.0) is downloaded once from PyPI (checked against its sha256) into
~/.cache/fleetllm/peer/, and only the test files below are unpacked. Two things are adapted, nothing else:
the server helper (`tests/utils.py` becomes shim_utils.py: RemoteOpenAIServer starts `fleetllm serve` instead
of `vllm serve`) and the model names (MODEL_NAME lines point at the embedded models). shim_conftest.py
becomes the tree's root conftest: it skips, by name and with a reason, the cases fleetllm does not claim.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import sys
import tarfile
import urllib.request
from pathlib import Path

VERSION = "0.32.0"
SDIST_URL = ("https://files.pythonhosted.org/packages/d5/df/5471312c76e335eaa2b8333e87ea39f0d37bfe24f10a582620e34ff12e33/"
             f"vllm-{VERSION}.tar.gz")
SDIST_SHA256 = "d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad"
CACHE = Path.home() / ".cache" / "fleetllm" / "peer"
HERE = Path(__file__).resolve().parent

# The test modules the suite runs (issue 39), and the helpers they import (unchanged).
TEST_FILES = [
    "tests/entrypoints/openai/chat_completion/test_chat.py",
    "tests/entrypoints/openai/completion/test_completion.py",
    "tests/entrypoints/openai/models/test_models.py",
    "tests/entrypoints/pooling/embed/test_online.py",
    "tests/entrypoints/serve/instrumentator/test_basic.py",
]
HELPERS = ["tests/models/language/pooling/embed_utils.py", "tests/models/utils.py", "tests/models/registry.py",
           "tests/ci_envs.py", "tests/entrypoints/conftest.py", "LICENSE"]
RENAMED = {"tests/conftest.py": "tests/vllm_conftest.py"}  # vLLM's root conftest, kept for its HF runner
# vLLM's model -> the embedded model fleetllm serves in its place (the served name is the embedded one)
MODEL_NAMES = {
    "HuggingFaceH4/zephyr-7b-beta": "smollm2-135m-instruct",
    "facebook/opt-125m": "smollm2-135m-instruct",
    "Qwen/Qwen3-0.6B": "smollm2-135m-instruct",
    "intfloat/multilingual-e5-small": "all-minilm-l6-v2",
}


def sdist() -> Path:
    """The sdist, downloaded once and checked."""
    path = CACHE / f"vllm-{VERSION}.tar.gz"
    if not path.exists() or hashlib.sha256(path.read_bytes()).hexdigest() != SDIST_SHA256:
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".part")
        with urllib.request.urlopen(SDIST_URL, timeout=300) as resp, open(tmp, "wb") as out:
            shutil.copyfileobj(resp, out)
        digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
        if digest != SDIST_SHA256:
            tmp.unlink()
            raise SystemExit(f"vllm-{VERSION}.tar.gz has sha256 {digest}, expected {SDIST_SHA256}")
        tmp.replace(path)
    return path


def adapt_models(text: str) -> str:
    """Each vLLM model name -> the embedded model's folder (served under that name, as `vllm serve PATH` does,
    and loadable by the tests' own tokenizer calls)."""
    from fleetllm import models

    for theirs, ours in MODEL_NAMES.items():
        text = text.replace(f'"{theirs}"', f'"{models.resolve(ours).path}"')
    return text


def build(dest: Path) -> Path:
    """Unpack and adapt the tree into dest (rebuilt each time: the shim files may have changed)."""
    prefix = f"vllm-{VERSION}/"
    if dest.exists():
        shutil.rmtree(dest)
    with tarfile.open(sdist()) as tar:
        for name in TEST_FILES + HELPERS + list(RENAMED):
            member = tar.getmember(prefix + name)
            data = tar.extractfile(member).read().decode()
            target = dest / RENAMED.get(name, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(adapt_models(data) if name in TEST_FILES else data)
    for folder in {p.parent for p in dest.joinpath("tests").rglob("*.py")} | {dest / "tests"}:
        while folder != dest:
            (folder / "__init__.py").touch()
            folder = folder.parent
    shutil.copy(HERE / "shim_utils.py", dest / "tests" / "utils.py")
    shutil.copy(HERE / "shim_conftest.py", dest / "tests" / "conftest.py")
    (dest / "pytest.ini").write_text("[pytest]\nasyncio_default_fixture_loop_scope = function\n"
                                     "filterwarnings = ignore::DeprecationWarning\n")
    return dest


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else CACHE / f"tree-{VERSION}"))
