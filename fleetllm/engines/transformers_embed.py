"""The transformers engine for the embed task: a sentence-transformers model (pooling and normalization
as its folder declares them: modules.json, 1_Pooling/config.json), through the `sentence-transformers`
package on torch.

Texts are tokenized one by one (so an input longer than the model's max_seq_length fails that row
alone, never truncated silently; token-id inputs are taken as they are), then embedded in padded
batches of `max_batch_size`.
"""

from __future__ import annotations

import threading
from typing import Any

from fleetllm.engines.base import EmbeddingRequest, EmbeddingResult, Engine, GenerationRequest, GenerationResult
from fleetllm.engines.embedding import EmbeddingModelInfo, check_dimensions, cut, read_model_info
from fleetllm.errors import EngineError, RowError

KNOWN_KWARGS = ("device", "dtype", "num_threads", "max_batch_size", "trust_remote_code", "max_model_len",
                "revision")


class TransformersEmbedEngine(Engine):
    name = "transformers"
    tasks = ("embed",)

    def start(self) -> None:
        from fleetllm.engines.threads import load_on_compute_thread

        self.compute = load_on_compute_thread(self._load)  # every torch call on one thread (ComputeThread says why)

    def _load(self) -> None:
        import torch

        from fleetllm.engines.threads import apply_cpu_threads
        from fleetllm.engines.vllm_kwargs import for_transformers

        kw = for_transformers(self.engine_kwargs)
        kw.pop("token", None)  # the model is local
        unknown = sorted(set(kw) - set(KNOWN_KWARGS))
        if unknown:
            raise EngineError(f"engine_kwargs {unknown} are not settings of the transformers embedding engine; "
                              f"known: {list(KNOWN_KWARGS)}")
        device = kw.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
        apply_cpu_threads(torch, device, kw.get("num_threads"))
        try:
            from sentence_transformers import SentenceTransformer

            self.model = SentenceTransformer(self.model_path, device=device, revision=kw.get("revision"),
                                             trust_remote_code=bool(kw.get("trust_remote_code", False)))
        except (OSError, ValueError, ImportError) as exc:
            raise EngineError(f"sentence-transformers could not load {self.model_path!r}: {exc}") from exc
        if kw.get("dtype"):
            dtype = getattr(torch, str(kw["dtype"]).replace("torch.", ""), None)
            if not isinstance(dtype, torch.dtype):
                raise EngineError(f"engine_kwargs.dtype {kw['dtype']!r} is not a torch dtype; use float32 or bfloat16")
            self.model.to(dtype)
        self.model.eval()
        if kw.get("max_model_len"):  # vLLM's name: inputs are cut to it (sentence-transformers' max_seq_length)
            self.model.max_seq_length = min(int(kw["max_model_len"]), self.model.max_seq_length or 1 << 30)
        self.tokenizer = self.model.tokenizer
        info = read_model_info(self.model_path)
        get_dims = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        dims = get_dims() or info.dimensions
        self.info = EmbeddingModelInfo(dims, int(self.model.max_seq_length or info.max_input_tokens or 512),
                                       info.normalize, info.pooling, info.matryoshka, info.matryoshka_dimensions)
        self.max_batch_size = int(kw.get("max_batch_size", 32))
        self._torch = torch
        self._lock = threading.Lock()

    @property
    def version(self) -> str:
        import sentence_transformers
        import transformers

        return f"transformers-{transformers.__version__}+sentence-transformers-{sentence_transformers.__version__}"

    @property
    def max_model_len(self) -> int | None:
        return self.info.max_input_tokens

    @property
    def embedding_dimensions(self) -> int | None:
        return self.info.dimensions

    def stop(self) -> None:
        self.model = None
        self.tokenizer = None
        if getattr(self, "compute", None) is not None:
            self.compute.close()

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        raise EngineError("this engine was started for the embed task; it does not generate text")

    def token_ids(self, request: EmbeddingRequest) -> list[int]:
        if request.token_ids is not None:
            ids = [int(t) for t in request.token_ids]
        else:
            ids = self.tokenizer(request.text, add_special_tokens=True)["input_ids"]
        if not ids or (request.text is not None and not request.text.strip()):
            raise RowError("the input is empty; give some text to embed")
        if len(ids) > self.info.max_input_tokens:
            raise RowError(f"the input is {len(ids)} tokens; this embedding model takes at most "
                           f"{self.info.max_input_tokens} (max_seq_length): shorten or split it")
        vocab = len(self.tokenizer)
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise RowError(f"token ids {bad[:5]} are out of vocabulary: the model's vocabulary has {vocab} tokens "
                           f"(ids 0 to {vocab - 1})")
        return ids

    def embed(self, requests: list[EmbeddingRequest]) -> list[EmbeddingResult]:
        results: list[EmbeddingResult | None] = [None] * len(requests)
        todo: list[tuple[int, list[int], int | None]] = []
        for i, req in enumerate(requests):
            try:
                todo.append((i, self.token_ids(req), check_dimensions(req.dimensions, self.info)))
            except RowError as exc:
                results[i] = EmbeddingResult.failed(str(exc))
            except Exception as exc:  # a row the tokenizer cannot read fails alone
                results[i] = EmbeddingResult.failed(f"could not tokenize the input: {exc}")
        todo.sort(key=lambda t: len(t[1]))  # similar lengths padded together
        with self._lock:
            for start in range(0, len(todo), self.max_batch_size):
                chunk = todo[start:start + self.max_batch_size]
                vectors = self.compute.run(self._forward, [ids for _, ids, _ in chunk])
                for (i, ids, dims), vector in zip(chunk, vectors):
                    results[i] = EmbeddingResult(cut(vector, dims, self.info.normalize), num_input_tokens=len(ids))
        return [r if r is not None else EmbeddingResult.failed("internal: no result") for r in results]

    def _forward(self, batch_ids: list[list[int]]) -> list[list[float]]:
        torch = self._torch
        features: dict[str, Any] = dict(self.tokenizer.pad({"input_ids": batch_ids}, return_tensors="pt"))
        features = {k: v.to(self.model.device) for k, v in features.items()}
        with torch.inference_mode():
            out = self.model(features)["sentence_embedding"]
        return out.float().cpu().tolist()
