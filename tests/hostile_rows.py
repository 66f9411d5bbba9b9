"""One JSON-lines file of hostile rows and what each must become, shared by the Ray path's test
(integration/test_messy_rows.py) and the in-process path's (e2e/test_local_run.py)."""

HOSTILE = [  # (line, expected id, expected `instruction` as written, expected error prefix or None)
    ('{"id":"m0","instruction":"Hi"}', "m0", "Hi", None),
    ('{"id":"m1","instruction":7}', "m1", "7", None),
    ('{"id":2,"instruction":{"a":[1,{"b":null}]}}', "2", '{"a": [1, {"b": null}]}', None),
    ('{"id":3,"instruction":[1,"x",true]}', "3", '[1, "x", true]', None),
    ('{"id":"m4","instruction":null,"extra":{"k":1}}', "m4", None, "prompt.template needs column 'instruction'"),
    ('{"id":"m5","instruction":18446744073709551616,"extra":[1]}', "m5", "18446744073709551616", None),
    ('{"id":"m6","instruction":NaN,"extra":-Infinity}', "m6", "NaN", None),
    ('{"id":"m7","instruction":"日本語 🎌 \\u0000 end","extra":"text"}', "m7", "日本語 🎌 \x00 end", None),
    ("", None, None, None),  # blank lines are not rows
    ('{"id":1e400,"instruction":false}', "Infinity", "false", None),
    ("[1, 2]", "in.jsonl:9", None, "line 11 of in.jsonl is not a JSON object"),
    ('{"id":"m10","instruction":"   "}', "m10", "   ", "the prompt is empty after formatting"),
    ('{"id":"m11","instruction":"{instruction}","sampling_params":{"max_tokens":2}}', "m11", "{instruction}", None),
    # a lone UTF-16 surrogate: not text (no tokenizer, Arrow array or Parquet file takes it); the row's error,
    # and at shard_rows 3 and 4 the first row of its shard (the rows after it must keep their prompts)
    ('{"id":"m12","instruction":"lone \\ud800"}', "in.jsonl:12", None,
     "line 14 of in.jsonl is not valid Unicode text: instruction holds a lone UTF-16 surrogate U+D800"),
    ('{"id":"m13","instruction":"pair \\ud83d\\ude00"}', "m13", "pair \U0001F600", None),
]
ROWS = sum(1 for _, rid, *_ in HOSTILE if rid is not None)


def expected_rows() -> dict[str, tuple]:
    """row_id -> (`instruction` as written, error prefix or None)."""
    return {rid: (value, err) for _, rid, value, err in HOSTILE if rid is not None}


def check_rows(rows: dict[str, dict]) -> None:
    """Each row of the output (by row_id) is exactly what HOSTILE says: its value, and a result or its error."""
    expected = expected_rows()
    assert set(rows) == set(expected) and len(rows) == ROWS
    for rid, (value, err) in expected.items():
        assert rows[rid]["instruction"] == value, rid
        if err is None:
            assert rows[rid]["error"] is None and rows[rid]["num_generated_tokens"] > 0, (rid, rows[rid]["error"])
        else:
            assert rows[rid]["error"].startswith(err), (rid, rows[rid]["error"])
