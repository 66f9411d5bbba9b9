"""Failure modes of the capacity test server (`fleetllm.testing.capacity_server`): an endpoint that lies
or fails, switchable at run time (`srv.options.fault = "html"`, healed with `None`).

Modes (ServerOptions.fault), applied to the requests whose prompt holds `fault_marker` (every request
when it is None) that come after the server's first `fault_after` requests (an outage mid-run):

- "html": 200 with a proxy's HTML maintenance page (text/html);
- "truncated": 200 application/json, the body cut in half;
- "no_choices": 200 with `choices: []`;
- "fewer_choices": 200 with one choice fewer than the `n` asked;
- "no_message": 200 whose choice has neither message nor text;
- "status": `fault_status` (e.g. 429 with Retry-After `fault_retry_after_s`, 500, 503);
- "hang": the answer comes after `fault_hang_s` seconds;
- "huge": 200 with a JSON body of `fault_body_mb` MiB (a completion whose text is that long).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable

MODES = ("html", "truncated", "no_choices", "fewer_choices", "no_message", "status", "hang", "huge")
MAINTENANCE_PAGE = "<html><head><title>502 Bad Gateway</title></head><body><h1>Down for maintenance</h1></body></html>"


def applies(options: Any, prompt: str, request_number: int) -> bool:
    """True when the fault is on and hits this request (its prompt, its number from 1 on the server)."""
    return (options.fault is not None and request_number > options.fault_after
            and (options.fault_marker is None or options.fault_marker in prompt))


async def fault_reply(options: Any, body: dict[str, Any], answer: Callable[[], dict[str, Any]],
                      error: Callable[..., Any]) -> Any:
    """The faulty reply to one request, or None to answer normally ("hang": after the wait).
    `answer()` builds the normal reply body; `error(status, message, kind, headers)` an error reply."""
    from starlette.responses import HTMLResponse, Response

    mode = options.fault
    if mode not in MODES:
        raise ValueError(f"fault {mode!r} is not one of {MODES}")
    if mode == "html":
        return HTMLResponse(MAINTENANCE_PAGE, status_code=200)
    if mode == "status":
        headers = {"retry-after": f"{options.fault_retry_after_s:g}"} if options.fault_retry_after_s else None
        return error(options.fault_status, "injected endpoint failure", "ServerError", headers)
    if mode == "hang":
        await asyncio.sleep(options.fault_hang_s)
        return None
    reply = answer()
    if mode == "truncated":
        raw = json.dumps(reply).encode()
        return Response(raw[: len(raw) // 2], status_code=200, media_type="application/json")
    if mode == "no_choices":
        reply["choices"] = []
    elif mode == "fewer_choices":
        reply["choices"] = reply["choices"][: max(0, int(body.get("n") or 1) - 1)]
    elif mode == "no_message":
        reply["choices"] = [{"index": 0, "finish_reason": "stop"}]
    elif mode == "huge":
        size = int(options.fault_body_mb * 2 ** 20)
        choice = reply["choices"][0]
        if "message" in choice:
            choice["message"]["content"] = "x" * size
        else:
            choice["text"] = "x" * size
    return Response(json.dumps(reply).encode(), status_code=200, media_type="application/json")
