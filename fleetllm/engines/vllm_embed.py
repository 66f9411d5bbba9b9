"""The vLLM engine for the embed task: vLLM's pooling runner (`runner="pooling"`) in the same
`AsyncLLM`-on-a-private-loop shape as the generating engine (fleetllm.engines.vllm_engine), and
`AsyncLLM.encode` with `PoolingParams(task="embed")` per row.

vLLM reads the pooling and normalization from the model folder (sentence-transformers modules.json,
1_Pooling) and its longest input from sentence_bert_config.json. Texts are tokenized here with the
model's tokenizer, so an input past max_model_len fails its row alone (never truncated silently), and
the `dimensions` rule is fleetllm's (fleetllm.engines.embedding), the same as the transformers engine.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fleetllm.engines.base import EmbeddingRequest, EmbeddingResult, GenerationRequest, GenerationResult
from fleetllm.engines.embedding import EmbeddingModelInfo, check_dimensions, read_model_info
from fleetllm.engines.vllm_engine import VLLMEngine
from fleetllm.errors import EngineError, RowError


class VLLMEmbedEngine(VLLMEngine):
    name = "vllm"
    tasks = ("embed",)
    takes_token_ids = False  # no chat template to render ahead: texts are tokenized in the replica

    def vllm_kwargs(self, on_cpu: bool) -> dict[str, Any]:
        kwargs = super().vllm_kwargs(on_cpu)
        runner = kwargs.setdefault("runner", "pooling")
        if runner != "pooling":
            raise EngineError(f"engine_kwargs.runner is {runner!r}; the embed task runs vLLM's pooling runner "
                              "(leave runner out)")
        return kwargs

    def start(self) -> None:
        super().start()
        from vllm import PoolingParams

        self._pooling_cls = PoolingParams
        info = read_model_info(self.model_path)
        config = self._llm.model_config
        dims = int(getattr(config, "embedding_size", 0) or 0) or info.dimensions
        self.info = EmbeddingModelInfo(dims, self._max_model_len, info.normalize, info.pooling,
                                       bool(getattr(config, "is_matryoshka", info.matryoshka)),
                                       info.matryoshka_dimensions)

    @property
    def embedding_dimensions(self) -> int | None:
        info = getattr(self, "info", None)
        return info.dimensions if info else None

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        raise EngineError("this engine was started for the embed task; it does not generate text")

    async def generate_stream(self, request: GenerationRequest):
        raise EngineError("this engine was started for the embed task; it does not generate text")
        yield  # pragma: no cover

    def _embed_prepare(self, request: EmbeddingRequest) -> tuple[list[int], Any]:
        if request.token_ids is not None:
            ids = [int(t) for t in request.token_ids]
        else:
            if not request.text or not request.text.strip():
                raise RowError("the input is empty; give some text to embed")
            ids = self.tokenizer(request.text, add_special_tokens=True)["input_ids"]
        if not ids:
            raise RowError("the input is empty; give some text to embed")
        if len(ids) > self._max_model_len:
            raise RowError(f"the input is {len(ids)} tokens; this embedding model takes at most "
                           f"{self._max_model_len} (max_model_len): shorten or split it")
        dims = check_dimensions(request.dimensions, self.info)
        return ids, self._pooling_cls(task="embed", dimensions=dims)

    async def _embed_one(self, ids: list[int], params: Any, request_id: str) -> EmbeddingResult:
        final = None
        try:
            async for out in self._llm.encode({"prompt_token_ids": ids}, params, request_id):
                final = out
        except Exception as exc:
            if self._llm is None or self._llm.errored:
                raise EngineError(f"the vLLM engine died: {exc}") from exc
            return EmbeddingResult.failed(f"vLLM refused the request: {exc}", num_input_tokens=len(ids))
        if final is None or getattr(final, "error", None) is not None:
            why = getattr(final, "error", None) or "no output"
            return EmbeddingResult.failed(f"vLLM returned no embedding ({why})", num_input_tokens=len(ids))
        return EmbeddingResult(embedding=final.outputs.data.float().tolist(), num_input_tokens=len(ids))

    def _start_embed(self, requests: list[EmbeddingRequest]) -> list[Any]:
        if self._llm is None:
            raise EngineError("the vLLM engine is not started; call start() first")
        started: list[Any] = []
        for req in requests:
            try:
                ids, params = self._embed_prepare(req)
            except RowError as exc:
                started.append(EmbeddingResult.failed(str(exc)))
                continue
            except Exception as exc:  # a row the tokenizer cannot read fails alone
                started.append(EmbeddingResult.failed(f"could not tokenize the input: {exc}"))
                continue
            rid = self._request_id(GenerationRequest(prompt="", request_id=req.request_id))
            started.append(self._submit(self._embed_one(ids, params, rid)))
        return started

    def embed(self, requests: list[EmbeddingRequest]) -> list[EmbeddingResult]:
        """Embed a batch; thread-safe: batches from several threads share vLLM's running batch."""
        return [s if isinstance(s, EmbeddingResult) else s.result() for s in self._start_embed(requests)]

    async def aembed(self, requests: list[EmbeddingRequest]) -> list[EmbeddingResult]:
        started = self._start_embed(requests)
        waiting = [asyncio.wrap_future(s) for s in started if not isinstance(s, EmbeddingResult)]
        done = iter(await asyncio.gather(*waiting))
        return [s if isinstance(s, EmbeddingResult) else next(done) for s in started]
