"""`fleetllm models list` and `fleetllm models pull NAME`."""

from __future__ import annotations

import argparse


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list and fetch models")
    msub = p.add_subparsers(dest="models_command", metavar="ACTION")
    p_list = msub.add_parser("list", help="list the embedded models and whether they are cached")
    p_list.set_defaults(handler=_list)
    p_pull = msub.add_parser("pull", help="fetch and convert an embedded model into the cache")
    p_pull.add_argument("name", help="model alias, e.g. smollm2-135m-instruct")
    p_pull.add_argument("--force", action="store_true", help="convert again even when cached")
    p_pull.set_defaults(handler=_pull)
    p.set_defaults(handler=lambda args: (p.print_help(), 2)[1])


def _list(args) -> int:
    from fleetllm import models

    print(f"cache: {models.fleetllm_home() / 'models'}")
    print(f"{'alias':28s} {'state':11s} {'task':9s} description")
    for alias, m in sorted(models.EMBEDDED.items()):
        state = "cached" if models.is_cached(alias) else "not pulled"
        print(f"{alias:28s} {state:11s} {m.task:9s} {m.description}")
    print("Task: the embedding model serves /v1/embeddings and `task: embed` jobs; the others chat and complete.")
    print("Any local model folder or Hugging Face id (org/name) also works as model.source.")
    return 0


def _pull(args) -> int:
    from fleetllm import models

    path = models.pull(args.name, force=args.force)
    print(f"{args.name} is ready at {path}")
    return 0
