"""The one table of request fields (fleetllm.engines.fields): checks, refusals, and the copy in docs/request-fields.md."""

from pathlib import Path

import pytest

from fleetllm.engines.fields import FIELDS, FieldError, check_model_limits, check_sampling, markdown_table, output_budget

FIELDS_DOC = Path(__file__).resolve().parents[2] / "docs" / "request-fields.md"


def test_docs_hold_the_table():
    text = FIELDS_DOC.read_text()
    start = text.index("<!-- fields-table")
    table = text[text.index("\n", start) + 1:text.index("<!-- /fields-table -->")].strip()
    assert table == markdown_table()


@pytest.mark.parametrize("sampling, engine, message", [
    ({"seed": 1 << 64}, None, f"`seed` must be between {-(1 << 63)} and {(1 << 63) - 1}, got {1 << 64}"),
    ({"seed": True}, None, "`seed` must be a whole number, got True"),
    ({"temperature": float("nan")}, None, "`temperature` must be a finite number, got nan"),
    ({"n": 0}, None, "`n` must be between 1 and 128, got 0"),
    ({"stop": ["ok", ""]}, None, "`stop` must be a non-empty string or a list of them, got ['ok', '']"),
    ({"logit_bias": {"5": "x"}}, None, "`logit_bias` must be a finite number, got 'x'"),
    ({"frequency_penalty": -3}, None, "`frequency_penalty` must be in [-2.0, 2.0], got -3"),
    ({"stop_token_ids": [1]}, "transformers",
     "`stop_token_ids` is not supported by the transformers engine; engines that honour it: vllm, openai"),
    ({"logprobs": 2}, "openai", "`logprobs` is not supported by the openai engine; engines that honour it: "
                                "transformers, vllm"),
    ({"use_beam_search": True}, "vllm", "`use_beam_search` is not supported by the vllm engine; no fleetllm "
                                        "engine honours it"),
    ({"min_tokens": 5, "max_tokens": 2}, None, "`min_tokens` (5) is larger than `max_tokens` (2)"),
])
def test_refusals_name_the_field(sampling, engine, message):
    with pytest.raises(FieldError) as caught:
        check_sampling(sampling, engine)
    assert str(caught.value) == message and caught.value.param == next(iter(sampling))


def test_normalised_values():
    out = check_sampling({"stop": "x", "top_k": -1, "logit_bias": {"7": 1}, "seed": None, "n": 2.0,
                          "max_completion_tokens": 5}, "openai")
    assert out == {"stop": ["x"], "logit_bias": {7: 1.0}, "n": 2, "max_completion_tokens": 5}
    assert all(e in ("transformers", "vllm", "openai") for f in FIELDS.values() for e in f.honoured)


def test_model_limits_and_output_budget():
    with pytest.raises(FieldError, match=r"token id 100 is outside the model's vocabulary of 100 tokens \(ids 0 to 99\)"):
        check_model_limits({"logit_bias": {100: 1.0}}, 100)
    with pytest.raises(FieldError, match=r"`allowed_token_ids` token id\(s\) \[100\]"):
        check_model_limits({"allowed_token_ids": [1, 100]}, 100)
    assert output_budget({}, 100, 200) == 100  # unset: 256 capped to the room left
    assert output_budget({"max_tokens": 100}, 100, 200) == 100
    with pytest.raises(FieldError) as caught:
        output_budget({"max_tokens": 101}, 100, 200)
    assert str(caught.value) == ("the model's context is 200 tokens; the request asks for 201 (100 in the prompt, "
                                 "101 in max_tokens): lower max_tokens to 100 or less")
    assert caught.value.param == "max_tokens"


def test_n_above_one_needs_sampling_on_the_local_engines_only():
    for engine in ("transformers", "vllm"):
        with pytest.raises(FieldError, match=r"^`n` is 3 but temperature is 0\.0: greedy decoding gives one answer") as exc:
            check_sampling({"n": 3, "temperature": 0.0}, engine)
        assert exc.value.param == "n"
        assert check_sampling({"n": 3, "temperature": 0.5}, engine) == {"n": 3, "temperature": 0.5}
    assert check_sampling({"n": 3}, "openai") == {"n": 3}  # an endpoint samples at its own default
    assert check_sampling({"n": 3}, None) == {"n": 3}  # no engine yet (the API's first check)
