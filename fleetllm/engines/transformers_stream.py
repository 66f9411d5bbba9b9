"""Streaming with batching for the transformers engine (serving).

Concurrent `generate_stream` calls do not run one at a time: each call tokenizes its request and drops it into
an inbox; one background thread gathers what is waiting (up to `max_batch_size` rows, waiting `batch_wait_s`
for stragglers), groups rows with equal sampling settings and runs one padded `model.generate` per group. A
per-step hook (a `StoppingCriteria`, which transformers calls once per decoding step with the whole `(batch,
seq)` tensor) decodes each row's new token incrementally (fleetllm.engines.stream_text: tokenizers'
DecodeStream), applies stop strings and per-row `max_tokens`, and marks finished rows done; the step's text
deltas are handed to the requests' asyncio queues together (one wake-up per event loop and step, not one per
row). A request whose consumer went away (client disconnect: the async generator is closed or cancelled) is
flagged; its rows are marked done at the next step, so the engine stops generating for it, and the whole
`generate` call ends as soon as every row is done.

Static batches: a request arriving while a batch runs waits for the next batch. Gathering waits
`batch_wait_s` after each arrival (at most 10x that) so that a burst of clients lands in one batch.
The per-step Python work (hook, decode, hand-over) measured under 1% of a step at 32 rows
(benchmarks/NOTES-serve.md); the model's forward is the rest.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Protocol

from fleetllm.engines.base import GenerationRequest, StreamDelta
from fleetllm.engines.chat import prompt_chars
from fleetllm.engines.stream_text import RowText
from fleetllm.engines.transformers_logits import logprob_entry
from fleetllm.errors import EngineError, RequestFailed, RowError


class StreamModel(Protocol):
    """What the batcher needs of its engine (TransformersEngine provides it): the loaded model and
    tokenizer, the torch module, the lock around generate(), and the engine's own request checks."""

    model: Any
    tokenizer: Any
    device: str
    torch: Any
    generate_lock: threading.Lock
    compute: Any  # fleetllm.engines.threads.ComputeThread: the one thread the model runs on

    @property
    def max_model_len(self) -> int | None: ...

    def prepare(self, request: GenerationRequest) -> tuple[list[int], dict[str, Any]]: ...

    def compiled_grammar(self, request: GenerationRequest) -> Any: ...

    def generate_kwargs(self, sampling: dict[str, Any], prompt_len: int) -> dict[str, Any]: ...

    def eos_ids(self) -> set[int]: ...

# sampling keys that must be equal for rows to share one generate() call (stop and max_tokens are per row)
BATCH_KEYS = ("temperature", "top_p", "top_k", "n", "seed", "logprobs", "ignore_eos", "min_tokens",
              "repetition_penalty", "min_p", "presence_penalty", "frequency_penalty", "logit_bias")
# Prompts longer than this (characters) are templated and tokenized in a worker thread, not on the
# caller's event loop (a 5 MB prompt took seconds there, stalling every other request of the replica).
OFFLOAD_CHARS = 32_768
_END = object()


@dataclass
class StreamRequest:
    """One request waiting in or running through the batcher."""

    request_id: str
    ids: list[int]
    sampling: dict[str, Any]
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    cancelled: threading.Event = field(default_factory=threading.Event)
    generated: int = 0  # tokens generated for this request so far (all of its n rows)
    grammar: Any = None  # the compiled xgrammar grammar of its structured-output constraint, if any
    priority: int = 0  # lower is gathered first (GenerationRequest.priority)

    @property
    def key(self) -> tuple:
        return tuple(repr(self.sampling.get(k)) for k in BATCH_KEYS)

    def push(self, item: Any) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


def _deliver(items: list[tuple[asyncio.Queue, Any]]) -> None:
    for q, item in items:
        q.put_nowait(item)


@dataclass
class _Row:
    req: StreamRequest
    index: int
    limit: int
    text: RowText
    done: bool = False


@dataclass
class BatcherStats:
    """Counters read by tests and /metrics."""

    generated_tokens: int = 0
    finished_requests: int = 0
    cancelled_requests: int = 0
    batches: int = 0
    max_batch_rows: int = 0
    running: int = 0
    queued: int = 0


class StreamBatcher:
    """Gathers concurrent streaming requests into batched `generate` calls on a background thread."""

    def __init__(self, engine: StreamModel, max_batch_size: int = 32, batch_wait_s: float = 0.05) -> None:
        self.engine = engine
        self.max_batch_size = max(1, int(max_batch_size))
        self.batch_wait_s = float(batch_wait_s)
        self.stats = BatcherStats()
        self._stats_lock = threading.Lock()
        # ordered by (priority, arrival): a waiting interactive request is gathered before waiting batch rows
        self._inbox: queue.PriorityQueue[tuple[int, int, StreamRequest | None]] = queue.PriorityQueue()
        self._ids = itertools.count()
        self._outbox: list[tuple[StreamRequest, Any]] = []  # this step's deltas, handed over together
        self._closed = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="fleetllm-stream-batcher", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def close(self) -> None:
        self._closed = True
        self._put(None)
        self._thread.join(timeout=30)

    # --- the caller's side (asyncio) -------------------------------------------------------

    def submit(self, request: GenerationRequest, prepared: tuple[list[int], dict[str, Any]] | None = None,
               grammar: Any = None) -> StreamRequest:
        """Validate and enqueue (with the request's compiled grammar, if it has a constraint); raises
        RowError for a request that cannot be served."""
        if not self.alive:
            raise EngineError(f"the transformers streaming loop is not running ({self.error!r})")
        ids, sampling = prepared or self.engine.prepare(request)
        sampling["n"] = int(sampling.get("n", 1))
        if sampling["n"] > self.max_batch_size:
            raise RowError(f"n={sampling['n']} exceeds the engine's max_batch_size {self.max_batch_size}")
        req = StreamRequest(request.request_id or f"s{next(self._ids)}", ids, sampling,
                            asyncio.get_running_loop(), asyncio.Queue(), grammar=grammar, priority=request.priority)
        with self._stats_lock:
            self.stats.queued += 1
        self._put(req)
        return req

    def _put(self, req: StreamRequest | None, order: int | None = None) -> None:
        """Enqueue by (priority, arrival order); `order` keeps a request's place when it is put back."""
        priority = -1 if req is None else req.priority  # close() wakes the loop first
        self._inbox.put((priority, next(self._ids) if order is None else order, req))

    async def stream(self, request: GenerationRequest) -> AsyncIterator[StreamDelta]:
        prepared = None
        if prompt_chars(request) > OFFLOAD_CHARS:  # tokenize a long prompt off the event loop
            prepared = await asyncio.to_thread(self.engine.prepare, request)
        grammar = None
        if request.structured is not None:  # compiled off the event loop (cached per constraint)
            grammar = await asyncio.get_running_loop().run_in_executor(None, self.engine.compiled_grammar, request)
        req = self.submit(request, prepared, grammar)
        finished = False
        try:
            while True:
                item = await req.queue.get()
                if item is _END:
                    finished = True
                    return
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield item
        finally:
            if not finished:  # the consumer went away: stop generating for this request
                req.cancelled.set()

    # --- the batching thread ----------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._closed:
                batch = self._gather()
                if batch is None:
                    continue
                groups: dict[tuple, list[StreamRequest]] = {}
                for req in batch:
                    groups.setdefault(req.key, []).append(req)
                for members in groups.values():
                    self._run_group(members)
        except BaseException as exc:  # noqa: BLE001 - a dead loop must fail pending requests, not hang them
            self.error = exc
            while not self._inbox.empty():
                req = self._inbox.get_nowait()[2]
                if req is not None:
                    req.push(EngineError(f"the engine failed: {exc}"))

    def _gather(self) -> list[StreamRequest] | None:
        first = self._inbox.get()[2]
        if first is None:
            return None
        batch, rows = [first], first.sampling["n"]
        # wait batch_wait_s after each arrival (requests of a burst trickle in), at most 10x that in all
        cap = time.monotonic() + 10 * self.batch_wait_s
        while rows < self.max_batch_size:
            timeout = min(self.batch_wait_s, cap - time.monotonic())
            try:
                entry = self._inbox.get(timeout=timeout) if timeout > 0 else self._inbox.get_nowait()
            except queue.Empty:
                break
            nxt = entry[2]
            if nxt is None:
                self._inbox.put(entry)  # close(): seen by the next _gather
                break
            if rows + nxt.sampling["n"] > self.max_batch_size:
                self._inbox.put(entry)  # next batch, in its place
                break
            batch.append(nxt)
            rows += nxt.sampling["n"]
        live = []
        with self._stats_lock:
            self.stats.queued -= len(batch)
        for req in batch:
            if req.cancelled.is_set():
                self.stats.cancelled_requests += 1
                req.push(_END)
            else:
                live.append(req)
        return live or None

    def _run_group(self, members: list[StreamRequest]) -> None:
        engine = self.engine
        torch = engine.torch
        tok = engine.tokenizer
        from transformers import StoppingCriteria, StoppingCriteriaList

        members.sort(key=lambda r: len(r.ids))
        sampling = members[0].sampling
        n = sampling["n"]
        context = engine.max_model_len
        rows = [_Row(req, j, min(req.sampling["max_tokens"], context - len(req.ids)),
                     RowText(tok, list(req.sampling.get("stop") or [])))
                for req in members for j in range(n)]
        eos_ids = set() if sampling.get("ignore_eos") else engine.eos_ids()
        want_logprobs = sampling.get("logprobs") is not None
        step_logprobs: list[Any] = []
        batcher = self

        class StepHook(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                new = input_ids[:, -1].tolist()
                logp = step_logprobs.pop() if step_logprobs else None
                for i, (row, token) in enumerate(zip(rows, new)):
                    if not row.done:
                        batcher._advance(row, token, eos_ids, logp[i] if logp is not None else None)
                batcher._flush()
                return torch.tensor([r.done for r in rows], dtype=torch.bool, device=input_ids.device)

        def record_logprobs(module, args, kwargs, output):  # the model's raw logits: before any processor
            step_logprobs.append(torch.log_softmax(output.logits[:, -1].float(), dim=-1))

        batch = tok.pad({"input_ids": [r.ids for r in members]}, return_tensors="pt").to(engine.device)
        gen_kwargs: dict[str, Any] = dict(
            max_new_tokens=max(r.limit for r in rows), pad_token_id=tok.pad_token_id, num_return_sequences=n,
            stopping_criteria=StoppingCriteriaList([StepHook()]),
        )
        # each row follows its own request's grammar (or none)
        gen_kwargs.update(_decoding_kwargs(sampling, [r.req.grammar for r in rows]))
        gen_kwargs.update(engine.generate_kwargs(sampling, batch["input_ids"].shape[1]))
        if sampling.get("ignore_eos"):
            gen_kwargs["eos_token_id"] = None
        self.stats.running += len(members)
        self.stats.batches += 1
        self.stats.max_batch_rows = max(self.stats.max_batch_rows, len(rows))
        hook = None

        def run_model() -> None:  # on the engine's compute thread (fleetllm.engines.threads.ComputeThread)
            nonlocal hook
            with engine.generate_lock, torch.inference_mode():
                if want_logprobs:  # raw logprobs, as vLLM and OpenAI give: before penalties, temperature, top-k
                    hook = engine.model.register_forward_hook(record_logprobs, with_kwargs=True)
                if sampling.get("seed") is not None:
                    torch.manual_seed(int(sampling["seed"]))
                engine.model.generate(**batch, **gen_kwargs)

        try:
            engine.compute.run(run_model)
        except Exception as exc:  # noqa: BLE001 - fail this batch's requests, keep serving the others
            for req in members:
                req.push(RequestFailed(f"generation failed: {type(exc).__name__}: {exc}"))
        finally:
            if hook is not None:
                hook.remove()
            self.stats.running -= len(members)
        for row in rows:  # rows the loop never finished (e.g. generate stopped early)
            if not row.done:
                self._finish(row, "length")
        self._flush()
        for req in members:
            if req.cancelled.is_set():
                self.stats.cancelled_requests += 1
            else:
                self.stats.finished_requests += 1
            req.push(_END)

    # --- one row, one step ------------------------------------------------------------------

    def _advance(self, row: _Row, token: int, eos_ids: set[int], logp: Any) -> None:
        req = row.req
        if req.cancelled.is_set():
            row.done = True
            return
        if token in eos_ids:  # the stop token counts as generated (vLLM's completion_tokens do)
            req.generated += 1
            self.stats.generated_tokens += 1
            self._finish(row, "stop", extra_tokens=1)
            return
        req.generated += 1
        self.stats.generated_tokens += 1
        entry = None
        if logp is not None:
            entry = logprob_entry(self.engine.tokenizer, self.engine.torch, logp, token, int(req.sampling["logprobs"]))
        last = len(row.text.tokens) + 1 >= row.limit
        delta, stopped = row.text.add(token, last)
        finish = "stop" if stopped else "length" if last else None
        if finish is not None:
            row.done = True
        self._outbox.append((req, StreamDelta(index=row.index, text=delta, num_generated_tokens=len(row.text.tokens),
                                              finish_reason=finish, num_input_tokens=len(req.ids),
                                              logprobs=[entry] if entry is not None else None)))

    def _flush(self) -> None:
        """Hand this step's deltas to their event loops: one wake-up per loop, not one per row."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Any]]] = {}
        now = time.monotonic()
        for req, item in self._outbox:
            if isinstance(item, StreamDelta):
                item.emitted_at = now  # when the step's output left the engine (stream traces)
            by_loop.setdefault(req.loop, []).append((req.queue, item))
        self._outbox.clear()
        for loop, items in by_loop.items():
            loop.call_soon_threadsafe(_deliver, items)

    def _finish(self, row: _Row, reason: str, extra_tokens: int = 0) -> None:
        row.done = True
        self._outbox.append((row.req, StreamDelta(
            index=row.index, text=row.text.finish(), num_generated_tokens=len(row.text.tokens) + extra_tokens,
            finish_reason=reason,
            num_input_tokens=len(row.req.ids))))


def _decoding_kwargs(sampling: dict[str, Any], grammars: list) -> dict[str, Any]:
    """generate()'s logits processors (the rows' grammars) and sampling arguments (greedy at temperature 0)."""
    from transformers import LogitsProcessorList

    kwargs: dict[str, Any] = {}
    processors = []
    if any(g is not None for g in grammars):
        from fleetllm.engines.grammar import GrammarLogitsProcessor

        processors.append(GrammarLogitsProcessor(grammars))
    if processors:
        kwargs["logits_processor"] = LogitsProcessorList(processors)
    temperature = float(sampling.get("temperature") or 0.0)
    if temperature > 0:
        kwargs.update(do_sample=True, temperature=temperature, top_p=float(sampling.get("top_p", 1.0)),
                      top_k=int(sampling.get("top_k") or 0))
    else:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    return kwargs
