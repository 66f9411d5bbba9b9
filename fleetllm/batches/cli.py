"""`fleetllm batches list|status|cancel`: a thin client of a server's Batch API (the official openai client).

    fleetllm batches list   [--url http://127.0.0.1:8000/v1] [--limit 20]
    fleetllm batches status BATCH_ID
    fleetllm batches cancel BATCH_ID
The key: --api-key, else $FLEETLLM_API_KEY, else $OPENAI_API_KEY.
"""

from __future__ import annotations

import argparse
import json
import os


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("batches", help="list, inspect and cancel the batches of a `fleetllm serve` (OpenAI Batch API)")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb, help_text in (("list", "the batches, newest first"), ("status", "one batch, as JSON"),
                            ("cancel", "cancel a batch (partial output is kept)")):
        v = verbs.add_parser(verb, help=help_text)
        if verb != "list":
            v.add_argument("batch_id")
        else:
            v.add_argument("--limit", type=int, default=20, help="how many (default 20)")
        v.add_argument("--url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"),
                       help="the server's API root (default: $OPENAI_BASE_URL or http://127.0.0.1:8000/v1)")
        v.add_argument("--api-key", default=None, help="the server's key (default: $FLEETLLM_API_KEY)")
        v.set_defaults(handler=batches_command)


def batches_command(args) -> int:
    import openai

    from fleetllm.errors import FleetError

    key = args.api_key or os.environ.get("FLEETLLM_API_KEY") or os.environ.get("OPENAI_API_KEY") or "EMPTY"
    client = openai.OpenAI(base_url=args.url, api_key=key, max_retries=1, timeout=30)
    try:
        if args.verb == "list":
            rows = client.batches.list(limit=args.limit).data
            print(f"{'id':<32} {'status':<11} {'endpoint':<21} {'done/failed/total':>17}  created")
            for b in rows:
                c = b.request_counts
                counts = f"{c.completed}/{c.failed}/{c.total}" if c else "-"
                print(f"{b.id:<32} {b.status:<11} {b.endpoint:<21} {counts:>17}  {b.created_at}")
            return 0
        batch = client.batches.retrieve(args.batch_id) if args.verb == "status" else \
            client.batches.cancel(args.batch_id)
        print(json.dumps(batch.model_dump(), indent=2))
        return 0
    except openai.APIStatusError as exc:
        raise FleetError(f"{args.url}: {exc.status_code} {exc.message}") from None
    except openai.APIConnectionError as exc:
        raise FleetError(f"cannot reach {args.url} ({exc}); is `fleetllm serve` running there? (--url)") from None
