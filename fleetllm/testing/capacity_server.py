"""A capacity-limited OpenAI-compatible HTTP server: a test tool for clients, AIMD and benchmarks.

It behaves like an inference server under load, without a model:

- it serves `capacity` requests at a time (hidden from clients); each takes `latency_s`
  (times `1 + batch_slowdown * active / capacity`, as a vLLM decode step slows with batch size);
  requests past `capacity` wait in a FIFO queue, so latency grows with load, the way vLLM signals
  overload;
- past `hard_limit` requests in the system (serving + queued) it answers 429 with Retry-After;
- `failure_rate` of requests fail at once with `failure_status` (503 by default);
- `capacity=None` means no limit: every request takes exactly `latency_s` (fixed latency).

POST /v1/chat/completions and /v1/completions return proper OpenAI bodies with usage. The reply
echoes the prompt (the last user message), so a test can check each row got its own answer:
content = "echo: " + prompt, cut to `max_tokens` words (finish_reason "length") when shorter.
GET /v1/models lists `model`; GET /stats returns the counters. With `api_key` set, /v1/* answers
401 (OpenAI's body) to a request without `Authorization: Bearer <api_key>`; a prompt that contains
`bad_request_marker` answers 400, a failure of that row alone. `fault` makes it an endpoint that lies
or fails (an HTML page, a body cut short, no choices, 429/5xx, a hang, a huge body...), switchable
while it runs: `fleetllm.testing.faults`. A request with `n` gets n choices.

Use it from Python (`with CapacityServer(capacity=8) as srv: srv.base_url`; the server runs in a
thread of this process by default, or in a subprocess with `subprocess=True`, which keeps the
client's CPU work apart from the server's in benchmarks) or as a program:
`python -m fleetllm.testing.capacity_server --capacity 16 --latency-s 0.05`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from fleetllm.testing import faults

DEFAULT_MODEL = "capacity-test"


@dataclass
class ServerOptions:
    capacity: int | None = 8
    latency_s: float = 0.005
    batch_slowdown: float = 0.0
    hard_limit: int | None = None  # default: 4 x capacity (no limit when capacity is None)
    retry_after_s: float = 1.0
    failure_rate: float = 0.0
    failure_status: int = 503
    model: str = DEFAULT_MODEL
    seed: int | None = None
    api_key: str | None = None  # when set, /v1/* answers 401 to requests without this bearer key
    bad_request_marker: str | None = None  # a prompt holding it answers 400 (a row-level failure)
    fault: str | None = None  # a failure mode of fleetllm.testing.faults (None: healthy)
    fault_marker: str | None = None  # the fault hits only prompts holding it (None: every request)
    fault_after: int = 0  # the fault hits only requests after the server's first fault_after
    fault_status: int = 503  # fault "status": the HTTP status
    fault_retry_after_s: float | None = None  # fault "status": its Retry-After header
    fault_hang_s: float = 30.0  # fault "hang": seconds before the answer
    fault_body_mb: float = 4.0  # fault "huge": size of the body

    def __post_init__(self) -> None:
        if self.capacity is not None and self.capacity < 1:
            raise ValueError(f"capacity is {self.capacity}; use a whole number >= 1, or None for no limit")
        if not 0.0 <= self.failure_rate <= 1.0:
            raise ValueError(f"failure_rate is {self.failure_rate}; use a fraction between 0 and 1")
        if self.hard_limit is None and self.capacity is not None:
            self.hard_limit = 4 * self.capacity


@dataclass
class ServerStats:
    requests: int = 0
    ok: int = 0
    rate_limited: int = 0
    failed: int = 0
    faults: int = 0  # requests answered with the fault mode
    unauthorized: int = 0
    max_in_system: int = 0
    max_active: int = 0
    in_system_s: float = 0.0  # integral of requests in the system over time
    span_s: float = 0.0  # from the first request in to the last reply out: in_system_s / span_s = mean in flight
    prompts: dict[str, int] = field(default_factory=dict)  # prompt -> attempts seen


def build_app(options: ServerOptions):
    """The Starlette (ASGI) app; its simulated server (counters and requests in the system) on `app.state.server`."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    server = _Simulated(options)

    async def chat_completions(request):
        return await server.reply(request, chat=True)

    async def completions(request):
        return await server.reply(request, chat=False)

    async def models(request):
        if (no := server.refused(request)) is not None:
            return no
        return JSONResponse({"object": "list",
                             "data": [{"id": options.model, "object": "model", "owned_by": "fleetllm"}]})

    async def get_stats(request):
        return JSONResponse(counters(server))

    app = Starlette(routes=[
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/stats", get_stats, methods=["GET"]),
    ])
    app.state.server = server
    return app


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None):
    from starlette.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": kind, "code": status}},
                        status_code=status, headers=headers)


def _prompt_of(body: dict[str, Any], chat: bool) -> str:
    """The prompt a reply echoes: the last user message (chat), else `prompt`; JSON when not a string."""
    if chat:
        messages = body.get("messages") or []
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        content = users[-1].get("content") if users else ""
        return content if isinstance(content, str) else json.dumps(content)
    prompt = body.get("prompt", "")
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


class _Simulated:
    """The simulated inference server behind the routes: its counters (`stats`), the requests in the
    system and being served, the capacity semaphore."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.stats = ServerStats()
        self.rng = random.Random(options.seed)
        self.state: dict[str, Any] = {"in_system": 0, "active": 0, "sem": None, "changed_at": None, "first_at": None}

    def in_system(self, delta: int) -> None:
        state, stats = self.state, self.stats
        now = time.monotonic()
        if state["first_at"] is None:
            state["first_at"] = state["changed_at"] = now
        stats.in_system_s += state["in_system"] * (now - state["changed_at"])
        state["in_system"] += delta
        state["changed_at"] = now
        stats.span_s = now - state["first_at"]

    async def serve(self, body: dict[str, Any], chat: bool):
        options, stats = self.options, self.stats
        prompt = _prompt_of(body, chat)
        stats.requests += 1
        stats.prompts[prompt] = stats.prompts.get(prompt, 0) + 1
        turned_away = await self.turned_away(body, prompt, chat)
        if turned_away is not None:
            return turned_away
        self.in_system(+1)
        stats.max_in_system = max(stats.max_in_system, self.state["in_system"])
        try:
            if options.capacity is None:
                await asyncio.sleep(options.latency_s)
            else:
                await self.take_a_slot()
        finally:
            self.in_system(-1)
        stats.ok += 1
        return self.answer(body, prompt, chat)

    async def turned_away(self, body: dict[str, Any], prompt: str, chat: bool):
        """The reply of a request not served: a bad request, an unknown model, a fault, an injected failure,
        a 429 past the hard limit; None to serve it."""
        options, stats = self.options, self.stats
        if options.bad_request_marker and options.bad_request_marker in prompt:
            return _error(400, "this prompt is invalid (it holds the bad-request marker)", "BadRequestError")
        if body.get("model") != options.model:
            return _error(404, f"model {body.get('model')!r} does not exist; this server serves {options.model!r}",
                          "NotFoundError")
        if faults.applies(options, prompt, stats.requests):
            stats.faults += 1
            faulty = await faults.fault_reply(options, body, lambda: self.answer(body, prompt, chat), _error)
            if faulty is not None:
                return faulty
        if options.failure_rate and self.rng.random() < options.failure_rate:
            stats.failed += 1
            return _error(options.failure_status, "injected failure", "ServiceUnavailable")
        if options.hard_limit is not None and self.state["in_system"] >= options.hard_limit:
            stats.rate_limited += 1
            ra = options.retry_after_s
            return _error(429, "too many requests", "RateLimitError",
                          {"retry-after": str(max(1, round(ra))), "retry-after-ms": str(int(ra * 1000))})
        return None

    async def take_a_slot(self) -> None:
        """Wait for one of `capacity` slots (FIFO), then take `latency_s`, slowed by the batch in service."""
        options, state, stats = self.options, self.state, self.stats
        if state["sem"] is None:
            state["sem"] = asyncio.Semaphore(options.capacity)
        async with state["sem"]:
            state["active"] += 1
            stats.max_active = max(stats.max_active, state["active"])
            try:
                slow = 1.0 + options.batch_slowdown * state["active"] / options.capacity
                await asyncio.sleep(options.latency_s * slow)
            finally:
                state["active"] -= 1

    def answer(self, body: dict[str, Any], prompt: str, chat: bool) -> dict[str, Any]:
        options, stats = self.options, self.stats
        words = ("echo: " + prompt).split(" ")
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 10**9
        finish = "length" if len(words) > int(max_tokens) else "stop"
        words = words[: int(max_tokens)]
        text = " ".join(words)
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(words),
                 "total_tokens": len(prompt.split()) + len(words)}
        created = int(time.time())
        n = int(body.get("n") or 1)
        if chat:
            choices = [{"index": i, "message": {"role": "assistant", "content": text},
                        "finish_reason": finish, "logprobs": None} for i in range(n)]
            return {"id": f"chatcmpl-{stats.requests}", "object": "chat.completion", "created": created,
                    "model": options.model, "choices": choices, "usage": usage}
        choices = [{"index": i, "text": text, "finish_reason": finish, "logprobs": None} for i in range(n)]
        return {"id": f"cmpl-{stats.requests}", "object": "text_completion", "created": created,
                "model": options.model, "choices": choices, "usage": usage}

    def refused(self, request):
        if self.options.api_key is None or request.headers.get("authorization") == f"Bearer {self.options.api_key}":
            return None
        self.stats.unauthorized += 1
        return _error(401, "Incorrect API key provided", "invalid_request_error")

    async def reply(self, request, chat: bool):
        from starlette.responses import JSONResponse, Response

        if (no := self.refused(request)) is not None:
            return no
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the request body is not JSON", "BadRequestError")
        out = await self.serve(body if isinstance(body, dict) else {}, chat)
        return out if isinstance(out, Response) else JSONResponse(out)


def counters(server: _Simulated) -> dict[str, Any]:
    return {**asdict(server.stats), "in_system": server.state["in_system"]}


class CapacityServer:
    """Context manager running the server on 127.0.0.1 (a free port) in a thread or a subprocess."""

    def __init__(self, *, subprocess: bool = False, **options: Any) -> None:
        self.options = ServerOptions(**options)
        self.use_subprocess = subprocess
        self.port: int | None = None
        self._server = None
        self._thread: threading.Thread | None = None
        self._proc: Any = None
        self._app = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stats(self) -> dict[str, Any]:
        """The server's counters (requests, ok, rate_limited, failed, max_in_system, in_system_s, prompts) and
        `in_system`: the requests it holds now (a client that gave up on one leaves it there until it is served)."""
        if self._app is not None:
            return counters(self._app.state.server)
        import httpx

        return httpx.get(f"http://127.0.0.1:{self.port}/stats", timeout=10).json()

    def __enter__(self) -> "CapacityServer":
        if self.use_subprocess:
            self._start_subprocess()
        else:
            self._start_thread()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _start_thread(self) -> None:
        import uvicorn

        self._app = build_app(self.options)
        config = uvicorn.Config(self._app, host="127.0.0.1", port=0, log_level="warning",
                                access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="capacity-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the capacity test server did not start")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]

    def _start_subprocess(self) -> None:
        o = self.options
        cmd = [sys.executable, "-m", "fleetllm.testing.capacity_server", "--port", "0",
               "--latency-s", str(o.latency_s), "--batch-slowdown", str(o.batch_slowdown),
               "--retry-after-s", str(o.retry_after_s), "--failure-rate", str(o.failure_rate),
               "--failure-status", str(o.failure_status), "--model", o.model]
        if o.capacity is not None:
            cmd += ["--capacity", str(o.capacity)]
        if o.hard_limit is not None:
            cmd += ["--hard-limit", str(o.hard_limit)]
        if o.seed is not None:
            cmd += ["--seed", str(o.seed)]
        if o.api_key is not None:
            cmd += ["--api-key", o.api_key]
        if o.bad_request_marker is not None:
            cmd += ["--bad-request-marker", o.bad_request_marker]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=dict(os.environ))
        line = self._proc.stdout.readline()
        if not line.startswith("PORT "):
            self.close()
            raise RuntimeError(f"the capacity test server did not start (said {line!r})")
        self.port = int(line.split()[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            if self._thread is not None:
                self._thread.join(timeout=10)
            self._server = None
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None


def main(argv: list[str] | None = None) -> int:
    import socket

    import uvicorn

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: a free one, printed as 'PORT n')")
    p.add_argument("--capacity", type=int, default=None, help="requests served at a time (default: no limit)")
    p.add_argument("--latency-s", type=float, default=0.005, help="service time of one request")
    p.add_argument("--batch-slowdown", type=float, default=0.0, help="extra latency fraction at full batch")
    p.add_argument("--hard-limit", type=int, default=None, help="429 past this many requests in the system")
    p.add_argument("--retry-after-s", type=float, default=1.0, help="Retry-After of a 429")
    p.add_argument("--failure-rate", type=float, default=0.0, help="fraction of requests failed at once")
    p.add_argument("--failure-status", type=int, default=503, help="HTTP status of an injected failure")
    p.add_argument("--model", default=DEFAULT_MODEL, help="served model id")
    p.add_argument("--seed", type=int, default=None, help="seed of the failure draws")
    p.add_argument("--api-key", default=None, help="answer 401 to requests without this bearer key")
    p.add_argument("--bad-request-marker", default=None, help="answer 400 to prompts that contain this text")
    a = p.parse_args(argv)
    options = ServerOptions(capacity=a.capacity, latency_s=a.latency_s, batch_slowdown=a.batch_slowdown,
                            hard_limit=a.hard_limit, retry_after_s=a.retry_after_s, failure_rate=a.failure_rate,
                            failure_status=a.failure_status, model=a.model, seed=a.seed, api_key=a.api_key,
                            bad_request_marker=a.bad_request_marker)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", a.port))
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(build_app(options), log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
