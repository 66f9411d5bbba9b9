"""Throughput profiles and output lengths under $FLEETLLM_HOME, reused by later jobs.

    $FLEETLLM_HOME/profiles/<key>.json   one per model x engine x engine version x accelerator x
                                         parallelism: the observed engine calls, start-up times,
                                         per-run overheads, and the fit (fleetllm.estimate.model)
    $FLEETLLM_HOME/lengths/<job>.json    the output tokens per completion seen for a job (by its key:
                                         the same model, engine, prompt and sampling)

A probe (`fleetllm calibrate`) and every run add to them; files are replaced atomically (write, then
rename), so a reader never sees half a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetllm.estimate.model import Call, Rates, fit

COMPILED_S = 1.0  # a start whose compile-cache writes span less wrote metadata, not a compiled model: warm
# How far one engine start may sit from another of the same configuration on the same machine, until three or more
# were measured: two warm vLLM starts of one 8B configuration on one H100, minutes apart, took 35.6 and 49.9 s
# (GPU lease 18, docs/estimates.md); an estimate's range carries the start-up within x / (1 + s) .. x * (1 + s).
STARTUP_SPREAD = 0.4
STARTUP_SPREAD_FLOOR = 0.1

MAX_CALLS = 400  # observations kept per profile (the newest)
MAX_LENGTHS = 2000  # output lengths kept per job


def home() -> Path:
    from fleetllm.models import fleetllm_home

    return fleetllm_home()


def accelerator(gpus_per_replica: float, cpus_per_replica: float) -> str:
    """What a replica computes on: the GPU's name (from the NVIDIA driver's files, no torch) or the CPU
    model with the replica's CPUs."""
    if gpus_per_replica > 0:
        for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
            for line in info.read_text().splitlines():
                if line.startswith("Model:"):
                    return line.split(":", 1)[1].strip()
        return "gpu"
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name} x{cpus_per_replica:g} cpu"


@dataclass
class Profile:
    key: dict[str, Any]
    batching: str
    calls: list[Call] = field(default_factory=list)
    startup_s: list[float] = field(default_factory=list)
    overhead_s: list[float] = field(default_factory=list)
    sources: list[dict[str, Any]] = field(default_factory=list)
    max_model_len: int | None = None
    max_num_seqs: int | None = None  # the engine's default sequences at once on this accelerator (layout)
    # starts that compiled the model (vLLM, a configuration new to the machine), and how long the compiling took;
    # startup_s holds the others (warm, eager, or not known)
    startup_cold_s: list[float] = field(default_factory=list)
    compile_s: list[float] = field(default_factory=list)
    prefix_block: int | None = None  # the engine's prefix-cache block on this accelerator (cached tokens: whole blocks)
    # runs on Ray: from the driver's start of the replicas to the first one's engine ready (the actors' start and
    # imports included, which an in-process probe never sees), and their overhead; kept apart from the in-process ones
    startup_ray_s: list[float] = field(default_factory=list)
    overhead_ray_s: list[float] = field(default_factory=list)

    @property
    def name(self) -> str:
        return profile_name(self.key)

    def rates(self) -> Rates:
        return fit(self.calls)

    def startup(self, executor: str = "local") -> float:
        """A start that does not compile: the warm starts measured, else the cold ones less their compiling (a
        probe compiles what the run after it then loads). `executor` "ray": a Ray run's start where one was
        measured (else the in-process one: `measured_on`)."""
        if executor == "ray" and self.startup_ray_s:
            return _median(self.startup_ray_s) or 0.0
        if self.startup_s:
            return _median(self.startup_s) or 0.0
        if self.startup_cold_s:
            return max(0.0, (_median(self.startup_cold_s) or 0.0) - (_median(self.compile_s) or 0.0))
        return 0.0

    def startup_spread(self, executor: str = "local") -> float:
        """The start-up's relative spread for the estimate's range: from the starts measured where three or more
        were (the farthest from their median, at least STARTUP_SPREAD_FLOOR), else STARTUP_SPREAD."""
        starts = (self.startup_ray_s if executor == "ray" and self.startup_ray_s
                  else self.startup_s or self.startup_cold_s)
        mid = _median(starts)
        if len(starts) < 3 or not mid or min(starts) <= 0:
            return STARTUP_SPREAD
        return round(max(STARTUP_SPREAD_FLOOR, max(starts) / mid - 1, mid / min(starts) - 1), 3)

    def startup_cold(self) -> float | None:
        """A start that compiles (the first of a configuration on a machine), where one was measured."""
        return _median(self.startup_cold_s)

    def overhead(self, executor: str = "local") -> float | None:
        if executor == "ray" and self.overhead_ray_s:
            return _median(self.overhead_ray_s)
        return _median(self.overhead_s)

    def measured_on(self, executor: str) -> str:
        """Where the start-up an estimate for `executor` takes was measured: "ray" or "local" (in process)."""
        return "ray" if executor == "ray" and self.startup_ray_s else "local"

    def add(self, calls: list[Call], source: dict[str, Any], startup_s: float | None = None,
            overhead_s: float | None = None, compile_s: float | None = None, executor: str = "local") -> None:
        """`compile_s`: what the start spent compiling (Engine.start_compile_s; None: not known). `executor`
        "ray": the start-up and overhead of a run on Ray (kept apart)."""
        self.calls = (self.calls + list(calls))[-MAX_CALLS:]
        if executor == "ray":
            if startup_s is not None and startup_s > 0:
                self.startup_ray_s = (self.startup_ray_s + [round(startup_s, 3)])[-20:]
            if overhead_s is not None and overhead_s >= 0:
                self.overhead_ray_s = (self.overhead_ray_s + [round(overhead_s, 3)])[-20:]
            startup_s = overhead_s = None
        if startup_s is not None and startup_s > 0:
            if compile_s is not None and compile_s >= COMPILED_S:
                self.startup_cold_s = (self.startup_cold_s + [round(startup_s, 3)])[-20:]
                self.compile_s = (self.compile_s + [round(compile_s, 3)])[-20:]
            else:
                self.startup_s = (self.startup_s + [round(startup_s, 3)])[-20:]
        if overhead_s is not None and overhead_s >= 0:
            self.overhead_s = (self.overhead_s + [round(overhead_s, 3)])[-20:]
        self.sources = (self.sources + [{**source, "at": round(time.time(), 3), "calls": len(calls)}])[-50:]

    def to_dict(self) -> dict[str, Any]:
        out = {"key": self.key, "batching": self.batching, "max_model_len": self.max_model_len,
               "max_num_seqs": self.max_num_seqs, "prefix_block": self.prefix_block,
               "startup_cold_s": self.startup_cold_s, "compile_s": self.compile_s,
               "startup_s": self.startup_s, "overhead_s": self.overhead_s, "startup_ray_s": self.startup_ray_s,
               "overhead_ray_s": self.overhead_ray_s, "sources": self.sources,
               "calls": [c.to_dict() for c in self.calls]}
        if self.calls:
            out["fit"] = self.rates().as_dict()
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Profile:
        return cls(d["key"], d["batching"], [Call(**c) for c in d.get("calls", [])], list(d.get("startup_s", [])),
                   list(d.get("overhead_s", [])), list(d.get("sources", [])), d.get("max_model_len"),
                   d.get("max_num_seqs"), list(d.get("startup_cold_s", [])), list(d.get("compile_s", [])),
                   d.get("prefix_block"), list(d.get("startup_ray_s", [])), list(d.get("overhead_ray_s", [])))


def _median(xs: list[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def profile_name(key: dict[str, Any]) -> str:
    text = "-".join(str(key[k]) for k in ("model", "engine", "engine_version", "parallelism"))
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:100] + "-" + digest


def profile_path(key: dict[str, Any]) -> Path:
    return home() / "profiles" / f"{profile_name(key)}.json"


def load_profile(key: dict[str, Any]) -> Profile | None:
    path = profile_path(key)
    if not path.exists():
        return None
    return Profile.from_dict(json.loads(path.read_text()))


def save_profile(profile: Profile) -> Path:
    path = profile_path(profile.key)
    _write_json(path, profile.to_dict())
    return path


def lengths_path(job_key: str) -> Path:
    return home() / "lengths" / f"{job_key}.json"


def load_lengths(job_key: str) -> dict[str, Any] | None:
    """{"lengths": [...], "source": "probe"|"run", ...} seen for this job, or None."""
    path = lengths_path(job_key)
    return json.loads(path.read_text()) if path.exists() else None


def save_lengths(job_key: str, lengths: list[int], source: str, job: str) -> None:
    if not lengths:
        return
    _write_json(lengths_path(job_key), {"job": job, "source": source, "at": round(time.time(), 3),
                                        "lengths": [int(x) for x in lengths[-MAX_LENGTHS:]]})


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)
