"""One rule for request fields: every OpenAI chat/completions field and vLLM extra field x the engines.

A field is honoured by the engines listed in its `honoured` map (engine -> how it maps onto that
engine) or refused with a message that names it and the engines that honour it. Serving (400),
batch (YAML `sampling` at plan time, per-row `sampling_params` and OpenAI Batch bodies as a row
`error`) and `ai_query` options all go through `check_sampling`; nothing is dropped silently.

Fields reach the engines in a request's `sampling` dict under their sampling key (`max_completion_tokens`
and `max_tokens` are both `max_tokens`; chat `logprobs`+`top_logprobs` and completions `logprobs`
are `logprobs`, the number of top logprobs). To honour a field on one more engine, add the engine to its
`honoured` map (one line) and implement it in that engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from fleetllm.errors import RowError

ENGINES = ("transformers", "vllm", "openai")
INT64 = (-(1 << 63), (1 << 63) - 1)  # torch.long: what vLLM's seed (and torch.manual_seed) can hold
DEFAULT_MAX_TOKENS = 256  # max_tokens left out: this, capped to what the context leaves (vLLM's own is 16)
MAX_N = 128  # OpenAI's limit on n
MAX_LOGPROBS = 20  # OpenAI's limit on top_logprobs
T, V, O = "transformers", "vllm", "openai"
SENT = "sent to the endpoint"  # how the openai engine honours a field: the endpoint applies it (or answers 4xx)


class FieldError(RowError):
    """A request field is refused or its value is out of range; `param` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


# --- value checks: return the normalised value or raise ValueError naming what is allowed ------------

def _int(lo: int | None = None, hi: int | None = None) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            else:
                raise ValueError(f"must be a whole number, got {v!r}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise ValueError(f"must be between {lo} and {hi}, got {v}" if hi is not None
                             else f"must be >= {lo}, got {v}")
        return v
    return check


def _num(lo: float, hi: float, lo_open: bool = False) -> Callable[[Any], float]:
    def check(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"must be a finite number, got {v!r}")
        if v < lo or v > hi or (lo_open and v == lo):
            raise ValueError(f"must be in {'(' if lo_open else '['}{lo}, {hi}], got {v}")
        return float(v)
    return check


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"must be true or false, got {v!r}")
    return v


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"must be a string, got {v!r}")
    return v


def _dict(v: Any) -> dict:
    if not isinstance(v, dict):
        raise ValueError(f"must be an object, got {v!r}")
    return v


def _stop(v: Any) -> list[str]:
    stops = [v] if isinstance(v, str) else v
    if hasattr(stops, "tolist"):
        stops = stops.tolist()
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise ValueError(f"must be a non-empty string or a list of them, got {v!r}")
    return stops


def _token_ids(v: Any) -> list[int]:
    if hasattr(v, "tolist"):
        v = v.tolist()
    if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in v):
        raise ValueError(f"must be a list of token ids (whole numbers >= 0), got {v!r}")
    return v


def _top_k(v: Any) -> int:
    return _int(-1)(v)  # -1 and 0 disable top-k (vLLM's convention); the vocabulary bounds it (engine check)


def _logit_bias(v: Any) -> dict[int, float]:
    if not isinstance(v, dict):
        raise ValueError(f"must be an object of token id -> bias, got {v!r}")
    out: dict[int, float] = {}
    for key, bias in v.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"keys must be token ids, got {key!r}") from None
        if token < 0:
            raise ValueError(f"token id {token} is negative")
        out[token] = _num(-100.0, 100.0)(bias)
    return out


def _words(v: Any) -> list[str]:
    if hasattr(v, "tolist"):
        v = v.tolist()
    if not isinstance(v, list) or not all(isinstance(w, str) for w in v):
        raise ValueError(f"must be a list of strings, got {v!r}")
    return v


@dataclass(frozen=True)
class RequestField:
    name: str
    origin: str  # "openai" (the OpenAI API) or "vllm" (vLLM's extra request fields)
    honoured: dict[str, str]  # engine -> how the engine applies it; an engine left out refuses it
    check: Callable[[Any], Any] | None = None
    note: str = ""
    aliases: tuple[str, ...] = field(default_factory=tuple)


ALL = {T: "yes", V: "SamplingParams", O: SENT}
_FIELDS = [
    RequestField("max_tokens", "openai", {T: "max_new_tokens", V: "SamplingParams.max_tokens", O: SENT}, _int(1),
                 f"prompt + max_tokens must fit the model's context; unset: {DEFAULT_MAX_TOKENS}, capped to what the "
                 "context leaves",
                 aliases=("max_completion_tokens",)),
    RequestField("temperature", "openai", {T: "generate temperature (0: greedy)", V: "SamplingParams", O: SENT},
                 _num(0.0, 2.0)),
    RequestField("top_p", "openai", {T: "generate top_p", V: "SamplingParams", O: SENT}, _num(0.0, 1.0, lo_open=True)),
    RequestField("n", "openai", {T: "num_return_sequences", V: "SamplingParams", O: SENT}, _int(1, MAX_N)),
    RequestField("stop", "openai", {T: "stop strings", V: "SamplingParams", O: SENT}, _stop),
    RequestField("seed", "openai", {T: "torch.manual_seed per batch", V: "SamplingParams", O: SENT}, _int(*INT64)),
    RequestField("logprobs", "openai", {T: "from the scores", V: "SamplingParams"}, _int(0, MAX_LOGPROBS),
                 "chat: logprobs + top_logprobs; completions: logprobs (an int)", aliases=("top_logprobs",)),
    RequestField("presence_penalty", "openai", {T: "LogitsProcessor over the generated tokens", V: "SamplingParams",
                                                O: SENT}, _num(-2.0, 2.0)),
    RequestField("frequency_penalty", "openai", {T: "LogitsProcessor over the generated tokens", V: "SamplingParams",
                                                 O: SENT}, _num(-2.0, 2.0)),
    RequestField("logit_bias", "openai", {T: "generate sequence_bias", V: "SamplingParams", O: SENT}, _logit_bias,
                 "token ids within the model's vocabulary, biases in [-100, 100]"),
    RequestField("user", "openai", {T: "accepted, no effect", V: "accepted, no effect", O: SENT}, _str),
    RequestField("response_format", "openai", {T: "xgrammar logits processor (fleetllm.structured)",
                                               V: "StructuredOutputsParams", O: SENT}, _dict),
    RequestField("tools", "openai", {}, None, "tool calls are not parsed by fleetllm"),
    RequestField("tool_choice", "openai", {}),
    RequestField("parallel_tool_calls", "openai", {}),
    RequestField("functions", "openai", {}),
    RequestField("function_call", "openai", {}),
    RequestField("best_of", "openai", {}),
    RequestField("suffix", "openai", {}),
    RequestField("modalities", "openai", {}, None, "text only"),
    RequestField("audio", "openai", {}, None, "text only"),
    RequestField("prediction", "openai", {}),
    RequestField("web_search_options", "openai", {}),
    RequestField("reasoning_effort", "openai", {O: SENT}),
    RequestField("service_tier", "openai", {O: SENT}),
    RequestField("store", "openai", {O: SENT}),
    RequestField("metadata", "openai", {O: SENT}),
    RequestField("top_k", "vllm", {T: "generate top_k", V: "SamplingParams", O: "extra_body"}, _top_k,
                 "-1 or 0: off; at most the vocabulary size"),
    RequestField("min_p", "vllm", {T: "generate min_p", V: "SamplingParams", O: "extra_body"}, _num(0.0, 1.0)),
    RequestField("repetition_penalty", "vllm", {T: "generate repetition_penalty", V: "SamplingParams",
                                                O: "extra_body"}, _num(0.0, 1e4, lo_open=True)),
    RequestField("min_tokens", "vllm", {T: "generate min_new_tokens", V: "SamplingParams", O: "extra_body"}, _int(0)),
    RequestField("ignore_eos", "vllm", {T: "eos_token_id=None", V: "SamplingParams", O: "extra_body"}, _bool),
    RequestField("stop_token_ids", "vllm", {V: "SamplingParams", O: "extra_body"}, _token_ids),
    RequestField("include_stop_str_in_output", "vllm", {V: "SamplingParams", O: "extra_body"}, _bool),
    RequestField("skip_special_tokens", "vllm", {V: "SamplingParams", O: "extra_body"}, _bool),
    RequestField("spaces_between_special_tokens", "vllm", {V: "SamplingParams", O: "extra_body"}, _bool),
    RequestField("bad_words", "vllm", {V: "SamplingParams", O: "extra_body"}, _words),
    RequestField("allowed_token_ids", "vllm", {V: "SamplingParams", O: "extra_body"}, _token_ids),
    RequestField("structured_outputs", "vllm", {T: "xgrammar logits processor (fleetllm.structured)",
                                             V: "StructuredOutputsParams", O: "extra_body"}, _dict),
    RequestField("detokenize", "vllm", {T: "accepted: the text is always returned", V: "accepted: the text is always "
                                        "returned"}, _bool, "Ray Data LLM's examples set it; fleetllm always decodes"),
    RequestField("prompt_logprobs", "vllm", {}, None, "fleetllm returns no prompt logprobs"),
    RequestField("use_beam_search", "vllm", {}),
    RequestField("length_penalty", "vllm", {}),
    RequestField("truncate_prompt_tokens", "vllm", {}),
    RequestField("extra_body", "openai client", {O: "merged into the request body"}, _dict,
                 "engine openai only: fields the endpoint reads as they are"),
]
FIELDS: dict[str, RequestField] = {f.name: f for f in _FIELDS}
ALIASES = {a: f.name for f in _FIELDS for a in f.aliases}  # OpenAI spellings (ai_query options use them)
# Fields a path handles itself (never reach an engine's sampling dict): serve and OpenAI Batch bodies.
REQUEST_FIELDS = {
    "model": "picks the served model (batch: echoed in the output line)",
    "messages": "the chat prompt (text content parts only)",
    "prompt": "the completions prompt (one string)",
    "stream": "serve: server-sent events; batch: false only",
    "stream_options": "serve: include_usage (with stream: true only)",
    "echo": "serve /v1/completions: the prompt is prepended",
    "chat_template_kwargs": "serve: variables for the chat template (batch: model.chat_template_kwargs)",
}


def honouring(name: str) -> list[str]:
    f = FIELDS.get(name)
    return [e for e in ENGINES if f is not None and e in f.honoured]


def refusal(name: str, engine: str) -> str:
    """The message for a field `engine` does not honour."""
    f = FIELDS.get(name)
    if f is None:
        return (f"`{name}` is not a request field fleetllm knows; remove it or check its spelling "
                f"(known: {', '.join(sorted([*FIELDS, *REQUEST_FIELDS]))})")
    others = honouring(name)
    where = f"engines that honour it: {', '.join(others)}" if others else "no fleetllm engine honours it"
    note = f" ({f.note})" if f.note and not others else ""
    return f"`{name}` is not supported by the {engine} engine{note}; {where}"


def check_value(name: str, value: Any) -> Any:
    f = FIELDS.get(name)
    if f is None or f.check is None:
        return value
    try:
        return f.check(value)
    except ValueError as exc:
        raise FieldError(f"`{name}` {exc}", param=name) from None


LOCAL_ENGINES = ("transformers", "vllm")  # they decode greedily at temperature 0 (an endpoint samples as it likes)


def check_sampling(sampling: dict[str, Any] | None, engine: str | None) -> dict[str, Any]:
    """Validate a sampling dict (unset values dropped): types and ranges, and, for an `engine`, that it
    honours every field. Returns the normalised dict; raises FieldError naming the field."""
    out: dict[str, Any] = {}
    refused = [name for name, value in (sampling or {}).items() if value is not None and (
        ALIASES.get(name, name) not in FIELDS or engine is not None and engine not in FIELDS[ALIASES.get(
            name, name)].honoured)]
    if refused:  # every refused field named, not only the first
        raise FieldError("; ".join(refusal(ALIASES.get(n, n) if ALIASES.get(n, n) in FIELDS else n, engine or "any")
                                   for n in refused), param=refused[0])
    for name, value in (sampling or {}).items():
        if hasattr(value, "tolist"):  # numpy values (Arrow hands rows over that way)
            value = value.tolist()
        if value is None:
            continue
        canon = ALIASES.get(name, name)
        value = check_value(canon, value) if canon == name or canon != "logprobs" else value
        if (name == "top_k" and value <= 0) or name == "detokenize":
            continue  # top_k off; detokenize: the text is always returned
        out[name] = value
    if out.get("min_tokens", 0) > out.get("max_tokens", 1 << 62):
        raise FieldError(f"`min_tokens` ({out['min_tokens']}) is larger than `max_tokens` ({out['max_tokens']})",
                         param="min_tokens")
    if engine in LOCAL_ENGINES and out.get("n", 1) > 1 and not out.get("temperature"):
        # greedy decoding gives one answer (vLLM's SamplingParams refuses it too; transformers' generate fails)
        unset = "" if "temperature" in out else ", fleetllm's default when unset"
        raise FieldError(f"`n` is {out['n']} but temperature is {out.get('temperature', 0)}{unset}: greedy decoding "
                         f"gives one answer, not {out['n']}; set temperature above 0 (e.g. 1.0) or n: 1", param="n")
    return out


def check_model_limits(sampling: dict[str, Any], vocab_size: int | None) -> None:
    """Checks that need the model: token ids within the vocabulary, top_k at most its size."""
    if vocab_size is None:
        return
    for token in sampling.get("logit_bias") or {}:
        if int(token) >= vocab_size:
            raise FieldError(f"`logit_bias` token id {token} is outside the model's vocabulary of {vocab_size} "
                             f"tokens (ids 0 to {vocab_size - 1})", param="logit_bias")
    for name in ("stop_token_ids", "allowed_token_ids"):
        bad = [t for t in sampling.get(name) or [] if int(t) >= vocab_size]
        if bad:
            raise FieldError(f"`{name}` token id(s) {bad} are outside the model's vocabulary of {vocab_size} "
                             f"tokens (ids 0 to {vocab_size - 1})", param=name)
    if sampling.get("top_k", 0) > vocab_size:
        raise FieldError(f"`top_k` {sampling['top_k']} is larger than the model's vocabulary ({vocab_size})",
                         param="top_k")


def check_prompt_ids(ids: list[int], vocab_size: int | None) -> None:
    """A token-id prompt's ids within the model's vocabulary (vLLM's check, with the size)."""
    bad = [t for t in ids if vocab_size is not None and not 0 <= t < vocab_size]
    if bad:
        raise FieldError(f"`prompt` token id(s) {bad[:8]} are out of vocabulary: the model's vocabulary has "
                         f"{vocab_size} tokens (ids 0 to {vocab_size - 1})", param="prompt")


def output_budget(sampling: dict[str, Any], prompt_tokens: int, context: int,
                  default: int = DEFAULT_MAX_TOKENS) -> int:
    """max_tokens for a prompt: an explicit value that does not fit the context is an error (as OpenAI and
    vLLM answer); unset, the default capped to what the context leaves."""
    room = context - prompt_tokens
    if prompt_tokens + 1 > context:
        raise FieldError(f"prompt is {prompt_tokens} tokens; the model's context is {context} tokens "
                         "(max_model_len): shorten the prompt", param="messages")
    if sampling.get("max_tokens") is None:
        return min(default, room)
    want = int(sampling["max_tokens"])
    if want > room:
        raise FieldError(f"the model's context is {context} tokens; the request asks for {prompt_tokens + want} "
                         f"({prompt_tokens} in the prompt, {want} in max_tokens): lower max_tokens to {room} or less",
                         param="max_tokens")
    return want


def markdown_table() -> str:
    """The field table of docs/request-fields.md."""
    lines = ["| field | from | transformers | vllm | openai (endpoint) |", "|---|---|---|---|---|"]
    for f in _FIELDS:
        cells = [f.honoured.get(e, "refused") for e in ENGINES]
        name = f"`{f.name}`" + "".join(f" / `{a}`" for a in f.aliases)
        lines.append(f"| {name} | {f.origin} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
