"""`fleetllm serve MODEL [--flags]`, as `vllm serve MODEL` is called: the serve spec built from a model and
vLLM's flag names, beside the spec file form (`fleetllm serve serve.yaml`). `--api-key` sets the spec's
api_key in both forms (checked there like one written in the file)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fleetllm import cli_values

# flag -> engine_kwargs key (vLLM's engine arguments; the transformers engine takes max_model_len and dtype)
ENGINE_FLAGS = {"max_model_len": int, "dtype": str, "tensor_parallel_size": int, "gpu_memory_utilization": float,
                "max_num_seqs": int, "quantization": str, "kv_cache_dtype": str}


MODEL_FLAGS = ("served_model_name", "engine", "task", "name", "replicas", "gpus_per_replica", "cpus_per_replica",
               "max_ongoing_requests", "enforce_eager", "trust_remote_code", *ENGINE_FLAGS, "engine_kwargs")


def add_model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api-key", default=None, help="bearer token clients must send (default: the spec's api_key, "
                   "else $FLEETLLM_API_KEY)")
    g = p.add_argument_group("MODEL form (`fleetllm serve MODEL`, as `vllm serve MODEL`)")
    g.add_argument("--served-model-name", default=None, help="the `model` name clients send (default: MODEL)")
    g.add_argument("--engine", choices=["auto", "vllm", "transformers"], default=None, help="default auto")
    g.add_argument("--task", choices=["auto", "generate", "embed"], default=None, help="default auto")
    g.add_argument("--name", default=None, help="Ray Serve application name (default fleetllm)")
    g.add_argument("--replicas", type=cli_values.positive_int, default=None,
                   help="fixed number of replicas (default 1)")
    g.add_argument("--gpus-per-replica", type=cli_values.non_negative_float, default=None)
    g.add_argument("--cpus-per-replica", type=cli_values.non_negative_float, default=None)
    g.add_argument("--max-ongoing-requests", type=cli_values.positive_int, default=None,
                   help="requests a replica serves at once")
    g.add_argument("--enforce-eager", action="store_true", default=None, help="vLLM: no CUDA graphs")
    g.add_argument("--trust-remote-code", action="store_true", default=None)
    for key, kind in ENGINE_FLAGS.items():
        g.add_argument("--" + key.replace("_", "-"), type=kind, default=None, help=f"engine_kwargs.{key}")
    g.add_argument("--engine-kwargs", type=json.loads, default=None, help="more engine arguments, as JSON")


def is_spec_file(target: str) -> bool:
    """A serve YAML/JSON file (else MODEL: an alias, a local model folder or a hub id)."""
    path = Path(target)
    return path.suffix.lower() in (".yaml", ".yml", ".json") or path.is_file()


def spec_data(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """The serve spec's data from the command line, and where it came from (for error messages)."""
    from fleetllm.spec import load_yaml

    if is_spec_file(args.spec):
        data, source = load_yaml(args.spec), args.spec
        model_flags = [f for f in MODEL_FLAGS if getattr(args, f, None) is not None]
        if model_flags:
            from fleetllm.errors import SpecError

            raise SpecError(f"--{model_flags[0].replace('_', '-')} applies to `fleetllm serve MODEL`; with a spec "
                            f"file ({args.spec}), set it in the file's models entry")
    else:
        data, source = {"models": [model_entry(args)]}, "command line"
        if args.name:
            data["name"] = args.name
    if args.api_key is not None:
        data["api_key"] = args.api_key
    return data, source


def model_entry(args: argparse.Namespace) -> dict[str, Any]:
    kwargs = dict(args.engine_kwargs or {})
    for key in list(ENGINE_FLAGS) + ["enforce_eager", "trust_remote_code"]:
        value = getattr(args, key)
        if value is not None:
            kwargs[key] = value
    entry: dict[str, Any] = {"model_id": args.served_model_name or args.spec, "source": args.spec,
                             "engine": args.engine or "auto", "task": args.task or "auto", "engine_kwargs": kwargs}
    for key in ("replicas", "gpus_per_replica", "cpus_per_replica", "max_ongoing_requests"):
        if getattr(args, key) is not None:
            entry[key] = getattr(args, key)
    return entry
