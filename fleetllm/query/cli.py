"""`fleetllm query SPEC.yaml`: a job spec run against an OpenAI-compatible endpoint.

The same job spec, runner and output folder as `fleetllm run` (shards, atomic commits, resume,
progress, the run record): `query` only defaults `model.engine` to `openai` and refuses other engines.
"""

from __future__ import annotations

import argparse


def add_commands(sub: argparse._SubParsersAction) -> None:
    from fleetllm.batch.cli import add_job_flags

    p = sub.add_parser(
        "query", help="run a dataset through an OpenAI-compatible endpoint (AIMD concurrency, retries, resume)",
        description="Run a job spec against an OpenAI-compatible endpoint (model.engine: openai, "
                    "model.engine_kwargs.base_url): adaptive concurrency, retries with backoff, every row "
                    "written once, resumable. See examples/query.yaml.")
    p.add_argument("spec", help="the job's YAML file (model.engine defaults to openai)")
    add_job_flags(p)
    p.set_defaults(handler=query_command)


def load_query_spec(path: str):
    """The JobSpec of `path`, with model.engine openai unless the file sets another (refused)."""
    from fleetllm.engines.capabilities import declared
    from fleetllm.errors import SpecError
    from fleetllm.spec import JobSpec, load_yaml, parse_spec

    data = load_yaml(path)
    model = data.get("model")
    if model is None:
        model = data["model"] = {}
    if not isinstance(model, dict):
        raise SpecError(f"{path}: model must be a mapping (source, engine, engine_kwargs...); got {model!r}")
    engine = model.setdefault("engine", "openai")
    if not declared(engine).is_endpoint:
        raise SpecError(f"{path} sets model.engine: {engine}; `fleetllm query` sends rows to an OpenAI-compatible "
                        f"endpoint (engine openai). Run this spec with `fleetllm run {path}`, or set "
                        "model.engine: openai and model.engine_kwargs.base_url")
    return parse_spec(JobSpec, data, str(path))


def query_command(args) -> int:
    from fleetllm.batch.cli import execute_job

    return execute_job(load_query_spec(args.spec), args)
