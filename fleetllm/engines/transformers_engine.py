"""The Hugging Face transformers engine: runs anywhere torch runs (laptop CPU, CI, a GPU without vLLM).

Batches use padded `generate` (left padding, rows sorted by length, rows with equal sampling
settings generated together): measured faster than transformers' continuous batching on an H200
(3,498 vs 982 output tokens/s, Llama-3-8B shape) and on this CPU.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any, AsyncIterator

from fleetllm.engines.base import (
    Completion,
    Engine,
    EngineProgress,
    GenerationRequest,
    GenerationResult,
    StreamDelta,
)
from fleetllm.engines import transformers_vision, vllm_kwargs
from fleetllm.engines.chat import max_chars_per_token, prompt_ids, render_prompt
from fleetllm.engines.fields import output_budget
from fleetllm.engines.transformers_adapters import adapter_names, check_adapter
from fleetllm.engines.transformers_clock import step_clock
from fleetllm.errors import EngineError, RowError

# engine_kwargs this engine reads itself; the rest go to from_pretrained.
OWN_KWARGS = ("dtype", "device", "max_model_len", "num_threads", "max_batch_tokens", "max_batch_size", "batch_wait_s",
              "load_format", "lora_adapters")
LOAD_FORMATS = ("auto", "dummy")  # dummy: random weights of the config's shape, as vLLM's load_format dummy
# sampling keys mapped onto generate() arguments as they are (the fields this engine honours:
# fleetllm.engines.fields; the others are mapped in `generate_kwargs`).
SAMPLING_MAP = {"min_tokens": "min_new_tokens", "repetition_penalty": "repetition_penalty", "min_p": "min_p"}


class TransformersEngine(Engine):
    name = "transformers"
    _finished: list[int] | None = None  # requests generate() finished and their output tokens, once started

    def start(self) -> None:
        from fleetllm.engines.threads import load_on_compute_thread

        self.compute = load_on_compute_thread(self._load)  # every torch call on one thread (ComputeThread says why)

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        kwargs = vllm_kwargs.for_transformers(self.engine_kwargs)
        own = {k: kwargs.pop(k) for k in OWN_KWARGS if k in kwargs}
        device = own.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
        from fleetllm.engines.threads import apply_cpu_threads

        apply_cpu_threads(torch, device, own.get("num_threads"))
        dtype_name = own.get("dtype") or ("bfloat16" if device.startswith("cuda") else "float32")
        dtype = getattr(torch, str(dtype_name).replace("torch.", ""), None)
        if not isinstance(dtype, torch.dtype):
            raise EngineError(f"engine_kwargs.dtype {dtype_name!r} is not a torch dtype; use float32, bfloat16 "
                              "or float16")
        load_format = own.get("load_format", "auto")
        if load_format not in LOAD_FORMATS:
            raise EngineError(f"engine_kwargs.load_format {load_format!r} is not one of {LOAD_FORMATS}")
        from transformers import AutoConfig

        from fleetllm.engines import transformers_vision as vision
        from fleetllm.engines.transformers_adapters import load_adapters

        hub = {k: kwargs[k] for k in ("trust_remote_code", "revision") if k in kwargs}  # a hub model's commit
        try:
            config = AutoConfig.from_pretrained(self.model_path, **hub)
            self.processor = vision.load_processor(self.model_path, hub) if vision.is_vision_config(config) else None
            if self.processor is not None:  # a vision-language model: its processor and image-text-to-text class
                from transformers import AutoModelForImageTextToText as model_class
            else:
                model_class = AutoModelForCausalLM
            self.tokenizer = (self.processor.tokenizer if self.processor is not None
                              else AutoTokenizer.from_pretrained(self.model_path, **hub))
            if load_format == "dummy":  # a folder with config.json only: real shapes, random weights (benchmarks)
                with torch.device(device):
                    self.model = model_class.from_config(config, dtype=dtype)
            else:
                self.model = model_class.from_pretrained(self.model_path, dtype=dtype, **kwargs).to(device)
        except (OSError, ValueError) as exc:
            raise EngineError(f"transformers could not load {self.model_path!r}: {exc}") from exc
        self.adapters = dict(own.get("lora_adapters") or {})
        self.model = load_adapters(self.model, self.adapters)
        self.model.eval()
        self.device = device
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        context = getattr(text_config, "max_position_embeddings", None) or 2048
        self._max_model_len = int(own.get("max_model_len") or context)
        self.torch = torch  # the torch module (imported here, not at import time)
        self.generate_lock = threading.Lock()  # one generate() on the model at a time
        self._finished = [0, 0]  # requests generate() finished, their output tokens (progress)
        self._timings = collections.deque(maxlen=256)
        self._vocab_size = int(getattr(text_config, "vocab_size", 0) or len(self.tokenizer))
        self.chars_per_token = max_chars_per_token(self.tokenizer)

    @property
    def version(self) -> str:
        import transformers

        return transformers.__version__

    @property
    def max_model_len(self) -> int | None:
        return self._max_model_len

    @property
    def reads_images(self) -> bool:
        return getattr(self, "processor", None) is not None

    @property
    def vocab_size(self) -> int | None:
        return getattr(self, "_vocab_size", None)

    def streaming_failure(self) -> str | None:
        if getattr(self, "_batcher", None) is not None and not self._batcher.alive:
            return f"the streaming loop stopped: {self._batcher.error!r}"
        return None

    def streaming_stats(self) -> dict[str, Any]:
        batcher = getattr(self, "_batcher", None)
        return {} if batcher is None else dataclasses.asdict(batcher.stats)

    def stop(self) -> None:
        if getattr(self, "_batcher", None) is not None:
            self._batcher.close()
            self._batcher = None
        self._grammars = None
        self.model = None
        self.tokenizer = None
        if getattr(self, "compute", None) is not None:
            self.compute.close()

    # --- streaming (serving): concurrent requests batched together, see transformers_stream.py ---

    @property
    def batcher(self):
        """The background batching loop behind generate_stream (started on first use)."""
        if getattr(self, "_batcher", None) is None:
            from fleetllm.engines.transformers_stream import StreamBatcher

            self._batcher = StreamBatcher(self, int(self.engine_kwargs.get("max_batch_size", 32)),
                                          float(self.engine_kwargs.get("batch_wait_s", 0.05)))
        return self._batcher

    async def generate_stream(self, request: GenerationRequest) -> AsyncIterator[StreamDelta]:
        # images (processor inputs) and models with adapters (peft's adapter_names, also __base__ for the base
        # model: peft applies its active adapter otherwise) take the batch path, streamed whole
        if request.images or self.adapters:
            import asyncio

            result = (await asyncio.to_thread(self.generate, [request]))[0]
            if result.error:
                raise RowError(result.error)
            for c in result.completions:
                yield StreamDelta(index=c.index, text=c.text, num_generated_tokens=c.num_generated_tokens,
                                  finish_reason=c.finish_reason, num_input_tokens=result.num_input_tokens,
                                  logprobs=c.logprobs)
            return
        async for delta in self.batcher.stream(request):
            yield delta

    # --- structured outputs (xgrammar, fleetllm.engines.grammar) --------------------------------

    @property
    def grammars(self):
        """Compiled grammars of this engine's tokenizer, by constraint (built on first use)."""
        if getattr(self, "_grammars", None) is None:
            from fleetllm.engines.grammar import GrammarCache

            vocab = self.model.get_output_embeddings().weight.shape[0]
            self._grammars = GrammarCache(self.tokenizer, int(vocab), sorted(self.eos_ids()))
        return self._grammars

    def compiled_grammar(self, request: GenerationRequest):
        """The request's compiled grammar, or None when it has no constraint; RowError when it cannot compile."""
        return None if request.structured is None else self.grammars.get(request.structured)

    # --- batch generation -------------------------------------------------------------------

    def tokenize(self, request: GenerationRequest) -> list[int]:
        check_adapter(request.adapter, self.adapters)
        if request.prompt_token_ids is not None:  # a token-id prompt (serve /v1/completions), used as it is
            return [int(t) for t in request.prompt_token_ids]
        if request.images:
            if self.processor is None:
                raise RowError(f"the prompt has {len(request.images)} image(s) but {self.model_path!r} reads text only "
                               "(no vision tower in its config); use a vision-language model or remove the images")
            return transformers_vision.prompt_ids(self.processor, request, self.chat_template_kwargs)[1]
        text = render_prompt(self.tokenizer, request, self.chat_template_kwargs)
        return self.tokenizer(text, add_special_tokens=request.messages is None)["input_ids"]

    def prepare(self, request: GenerationRequest) -> tuple[list[int], dict[str, Any]]:
        """(prompt ids, checked sampling with max_tokens) for a request; RowError when it cannot be served
        (a refused or out-of-range field, a bad message, a prompt or max_tokens past the context)."""
        sampling = self.check_sampling(request.sampling)
        ids = prompt_ids(request, self.tokenize, self._max_model_len, self.chars_per_token)
        sampling["max_tokens"] = output_budget(sampling, len(ids), self._max_model_len)
        return ids, sampling

    def generate_kwargs(self, sampling: dict[str, Any], prompt_len: int) -> dict[str, Any]:
        """generate() arguments for the fields beyond temperature/top_p/top_k/stop (one batch's settings)."""
        kwargs: dict[str, Any] = {k2: sampling[k] for k, k2 in SAMPLING_MAP.items() if k in sampling}
        if not float(sampling.get("temperature") or 0.0) > 0:
            kwargs.pop("min_p", None)  # a sampling filter: greedy decoding ignores it (as vLLM does)
        if sampling.get("logit_bias"):
            kwargs["sequence_bias"] = {(int(t),): float(b) for t, b in sampling["logit_bias"].items()}
        processors = []
        if sampling.get("presence_penalty") or sampling.get("frequency_penalty"):
            from fleetllm.engines.transformers_logits import penalty_processor

            processors.append(penalty_processor(float(sampling.get("presence_penalty") or 0.0),
                                                float(sampling.get("frequency_penalty") or 0.0), prompt_len))
        if processors:
            from transformers import LogitsProcessorList

            kwargs["logits_processor"] = LogitsProcessorList(processors)
        return kwargs

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        results: list[GenerationResult | None] = [None] * len(requests)
        groups: dict[tuple, list[tuple[int, list[int], dict[str, Any]]]] = {}
        for i, req in enumerate(requests):
            try:
                ids, sampling = self.prepare(req)
            except RowError as exc:
                results[i] = GenerationResult.failed(str(exc))
                continue
            try:
                grammar = self.compiled_grammar(req)
            except RowError as exc:
                results[i] = GenerationResult.failed(str(exc), num_input_tokens=len(ids))
                continue
            key = tuple(sorted((k, repr(v)) for k, v in sampling.items() if k != "max_tokens"))
            # rows with different constraints (or adapters) share a batch: each row follows its own;
            # rows with images are batched apart (the processor builds their inputs)
            groups.setdefault((*key, bool(req.images)), []).append((i, ids, sampling, grammar, req))
        self.compute.run(self._generate_groups, groups, results)
        return [r if r is not None else GenerationResult.failed("internal: no result") for r in results]

    def _generate_groups(self, groups: dict, results: list) -> None:
        """The groups' batches, one after another, into `results` (on the compute thread)."""
        with self.generate_lock:
            for members in groups.values():
                members.sort(key=lambda m: len(m[1]))
                for chunk in self._chunks(members):
                    for (i, *_), res in zip(chunk, self._generate_group(chunk)):
                        results[i] = res
                        self._finished[0] += 1
                        self._finished[1] += res.num_generated_tokens

    def progress(self) -> EngineProgress | None:
        """Requests finished so far (each static batch counts once generate() has it; nothing runs between)."""
        f = self._finished
        return None if f is None else EngineProgress(f[0], f[1], ())

    def _chunks(self, members):
        """Split a group so that padded prompt+generation tokens stay under max_batch_tokens."""
        budget = int(self.engine_kwargs.get("max_batch_tokens", 1 << 62))
        chunk: list = []
        for m in members:
            longest = max([len(x[1]) + x[2]["max_tokens"] for x in chunk + [m]])
            if chunk and longest * (len(chunk) + 1) > budget:
                yield chunk
                chunk = []
            chunk.append(m)
        if chunk:
            yield chunk

    def _generate_group(self, chunk) -> list[GenerationResult]:
        from transformers import LogitsProcessorList

        torch = self.torch
        tok = self.tokenizer
        sampling = chunk[0][2]
        n = int(sampling.get("n", 1))
        # each row keeps its own max_tokens, capped so prompt+output fits the context
        limits = [min(s["max_tokens"], self._max_model_len - len(ids)) for _, ids, s, *_ in chunk]
        max_new = max(limits)
        batch = self._batch_inputs(chunk)
        temperature = float(sampling.get("temperature", 0.0))
        gen_kwargs: dict[str, Any] = dict(
            max_new_tokens=max_new,
            pad_token_id=tok.pad_token_id,
            num_return_sequences=n,
            return_dict_in_generate=True,
            output_logits=sampling.get("logprobs") is not None,  # raw: before penalties, temperature, top-k
        )
        if temperature > 0:
            gen_kwargs.update(do_sample=True, temperature=temperature,
                              top_p=float(sampling.get("top_p", 1.0)), top_k=int(sampling.get("top_k") or 0))
        else:
            gen_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if sampling.get("stop"):
            gen_kwargs.update(stop_strings=list(sampling["stop"]), tokenizer=tok)
        gen_kwargs.update(self.generate_kwargs(sampling, batch["input_ids"].shape[1]))
        grammars = [m[3] for m in chunk for _ in range(n)]  # generate repeats each row n times, in place
        if self.adapters:  # peft's mixed-adapter batch: one adapter name per output row
            gen_kwargs["adapter_names"] = adapter_names([m[4].adapter for m in chunk], n)
        if any(g is not None for g in grammars):
            from fleetllm.engines.grammar import GrammarLogitsProcessor

            processors = LogitsProcessorList(gen_kwargs.get("logits_processor") or [])
            processors.append(GrammarLogitsProcessor(grammars))  # last: it masks what the others scored
            gen_kwargs["logits_processor"] = processors
        eos_ids = self.eos_ids()
        if sampling.get("ignore_eos"):
            gen_kwargs["eos_token_id"] = None
            eos_ids = set()
        if sampling.get("seed") is not None:
            torch.manual_seed(int(sampling["seed"]))
        from transformers import StoppingCriteriaList

        clock = step_clock()  # the prefill told from the decode steps (the calibration probe's fit)
        with torch.inference_mode():
            out = self.model.generate(**batch, **gen_kwargs, stopping_criteria=StoppingCriteriaList([clock]))
        timing = clock.timing(int(out.sequences.shape[0]), int(batch["input_ids"].shape[1]))
        if timing is not None:
            self._timings.append(timing)
        sequences = out.sequences[:, batch["input_ids"].shape[1]:].tolist()
        results = []
        for row, (_, ids, row_sampling, *_) in enumerate(chunk):
            completions = []
            for j in range(n):
                tokens = sequences[row * n + j]
                completions.append(self._completion(tokens, limits[row], eos_ids, row_sampling, j,
                                                    out.logits if gen_kwargs["output_logits"] else None,
                                                    row * n + j))
            results.append(GenerationResult(completions=completions, num_input_tokens=len(ids)))
        return results

    def _batch_inputs(self, chunk):
        """The padded model inputs of a chunk: token ids, or for rows with images the processor's batch."""
        if not chunk[0][4].images:
            return self.tokenizer.pad({"input_ids": [m[1] for m in chunk]}, return_tensors="pt").to(self.device)
        texts = [transformers_vision.render(self.processor, m[4], self.chat_template_kwargs) for m in chunk]
        return transformers_vision.inputs(self.processor, texts, [m[4].images for m in chunk]).to(self.device)

    def eos_ids(self) -> set[int]:
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return set(eos if isinstance(eos, list) else [eos])

    def _completion(self, tokens, limit, eos_ids, sampling, index, logits, seq_row) -> Completion:
        pad = self.tokenizer.pad_token_id
        finish = "length"
        kept: list[int] = []
        for t in tokens[:limit]:
            if t in eos_ids:
                finish = "stop"
                break
            kept.append(t)
        if finish == "length" and len(kept) < limit and kept[-1:] == [pad]:
            finish = "stop"  # stopped by a stop string, then padded
        while kept and kept[-1] == pad and pad not in eos_ids and finish == "stop":
            kept.pop()
        text = self.tokenizer.decode(kept, skip_special_tokens=True)
        for s in sampling.get("stop") or []:
            cut = text.find(s)
            if cut >= 0:
                text, finish = text[:cut], "stop"
        logprobs = None
        if logits is not None:
            logprobs = self._logprobs(logits, seq_row, kept, int(sampling["logprobs"]))
        return Completion(text=text, num_generated_tokens=len(kept), finish_reason=finish,
                          index=index, logprobs=logprobs)

    def _logprobs(self, logits, seq_row, kept, top) -> list[dict[str, Any]]:
        from fleetllm.engines.transformers_logits import logprob_entry

        torch = self.torch
        return [logprob_entry(self.tokenizer, torch, torch.log_softmax(logits[step][seq_row].float(), dim=-1),
                              token, top) for step, token in enumerate(kept)]
