"""Streamed text token by token (fleetllm.engines.stream_text): incremental detokenization with tokenizers'
DecodeStream gives the text the whole-output decode gives, stop strings and incomplete UTF-8 held back,
without decoding the output again at each token."""

import pytest

from fleetllm.engines.stream_text import RowText

TEXT = "Grüße, 世界! Emoji 🎉🚀 and code: `x = [1, 2]` → done.\nZweite Zeile — fin."


class Counting:
    """The real tokenizer, counting decode calls of more than one token."""

    def __init__(self, tok):
        self.tok, self.backend_tokenizer, self.long_decodes = tok, tok.backend_tokenizer, 0

    def decode(self, ids, **kw):
        self.long_decodes += len(ids) > 1
        return self.tok.decode(ids, **kw)


@pytest.fixture(scope="module")
def tok(embedded_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_model)


def stream(tok, ids, stops, incremental, limit=None):
    row, deltas, stopped = RowText(tok, stops, incremental), [], False
    for i, t in enumerate(ids):
        delta, stopped = row.add(t, last=limit is not None and i + 1 >= limit)
        deltas.append(delta)
        if stopped:
            break
    if not stopped:
        deltas.append(row.finish())
    return deltas


@pytest.mark.parametrize("stops", [[], ["世界"], ["done.\n"], ["🚀"]])
def test_incremental_text_is_the_full_decode_and_never_decodes_the_output_again(tok, stops):
    ids = tok.encode(TEXT, add_special_tokens=False)
    counting = Counting(tok)
    new = stream(counting, ids, stops, incremental=True)
    if not stops:  # the whole-output decode streams the same text (with a stop string, see the next test)
        assert "".join(new) == "".join(stream(tok, ids, stops, incremental=False))
    full = tok.decode(ids, skip_special_tokens=True)
    assert "".join(new) == (full[:full.find(stops[0])] if stops else full)
    assert counting.long_decodes == 0
    assert all("\ufffd" not in d for d in new)  # a character split across tokens is sent whole


def test_a_stop_string_split_across_tokens_is_held_back_then_cut(tok):
    ids = tok.encode("alpha beta STOP gamma", add_special_tokens=False)
    deltas = stream(tok, ids, ["STOP"], incremental=True)
    assert "".join(deltas) == "alpha beta " and not any("ST" in d for d in deltas)


def test_the_start_of_a_stop_string_inside_a_split_character_is_not_sent(tok):
    """The whole-output decode held back only the incomplete character, so '世' of the stop string '世界' went out
    before '界' completed it; incremental decoding holds it."""
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert "".join(stream(tok, ids, ["世界"], incremental=True)) == "Grüße, "
