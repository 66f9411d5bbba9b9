"""Prefix grouping (fleetllm.batch.planning.prefix): the key, the auto decision, and the grouped plan (each row
exactly once, rows of one prefix in one shard and next to each other, the same input -> the same shards),
on real files, without Ray or a model."""

from __future__ import annotations

import json
import random
from collections import defaultdict

import pytest

from fleetllm.batch.planning import prefix
from fleetllm.batch.inputs.input_files import GROUPED_FORMAT, describe_files
from fleetllm.batch.planning.shards import plan_shards
from fleetllm.batch.execution.stages import TemplatePreprocessor
from fleetllm.batch.inputs.shard_rows import read_shard_rows
from fleetllm.testing.batch_client import document_lines

TEMPLATE = "Read the document and answer.\n\nDocument:\n{doc}\n\nQuestion: {question}"


def docs_questions(docs: int, questions: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    texts = [f"Document {d}. " + " ".join(rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(80))
             for d in range(docs)]
    rows = [{"doc_id": d, "question_id": q, "doc": texts[d], "question": f"What is word {q} of document {d}?"}
            for d in range(docs) for q in range(questions)]
    rng.shuffle(rows)
    return rows


def write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def grouped(tmp_path, rows, shard_rows: int, mode: str = "on", out: str = "out"):
    if not (tmp_path / "in.jsonl").exists():  # written once: the grouped files are reused
        write_jsonl(tmp_path / "in.jsonl", rows)
    files = describe_files(str(tmp_path / "in.jsonl"), "jsonl", shard_rows)
    shards = plan_shards(files, shard_rows)
    pre = TemplatePreprocessor(None, TEMPLATE)

    def read(shard):
        return read_shard_rows(shard.to_dict(), "jsonl")

    sample = [prefix.prompt_text(pre(r)) for s in prefix.sample_shards(shards) for r in read(s)]
    decision = prefix.decide(mode, sample, len(rows))
    gid = prefix.grouping_id(shards, shard_rows, decision, {"template": TEMPLATE})
    gfiles = prefix.group_input(shards, read, pre, decision, shard_rows, str(tmp_path / out), gid)
    gshards = plan_shards(gfiles, shard_rows)
    by_shard = {s.shard_id: [pre(r) for r in read_shard_rows(s.to_dict(), GROUPED_FORMAT)] for s in gshards}
    return decision, gshards, by_shard


def test_grouped_plan_holds_each_row_once_with_its_own_id_and_a_prefix_in_one_shard(tmp_path):
    rows = docs_questions(docs=40, questions=4)
    decision, shards, by_shard = grouped(tmp_path, rows, shard_rows=16)
    assert decision.on
    seen = [r for rs in by_shard.values() for r in rs]
    # each row once, with the row id the ungrouped job gives it (file:line of the input)
    assert sorted(r["row_id"] for r in seen) == sorted(f"in.jsonl:{k}" for k in range(len(rows)))
    for r in seen:
        assert rows[int(r["row_id"].split(":")[1])] == {k: r[k] for k in ("doc_id", "question_id", "doc", "question")}
    where = defaultdict(set)
    for sid, rs in by_shard.items():
        for r in rs:
            where[r["doc_id"]].add(sid)
    # a document's rows in one shard, or in two adjacent shards of one bucket file where the bucket
    # (whole keys) holds more than shard_rows rows and the cut falls inside the group
    rel = {s.shard_id: s.rel for s in shards}
    for d, sids in where.items():
        assert len(sids) == 1 or (len(sids) == 2 and max(sids) - min(sids) == 1 and len({rel[s] for s in sids}) == 1)
    assert sum(len(sids) == 1 for sids in where.values()) >= 0.75 * len(where)
    for rs in by_shard.values():  # adjacent within the shard: each document one run of rows
        runs = [r["doc_id"] for k, r in enumerate(rs) if k == 0 or rs[k - 1]["doc_id"] != r["doc_id"]]
        assert len(runs) == len(set(runs))


def test_the_same_input_gives_the_same_shards_and_bytes(tmp_path):
    rows = docs_questions(docs=30, questions=3)
    _, a, rows_a = grouped(tmp_path, rows, shard_rows=10, out="a")
    _, b, rows_b = grouped(tmp_path, rows, shard_rows=10, out="b")
    assert [s.identity() for s in a] == [s.identity() for s in b]
    assert rows_a == rows_b
    files_a = sorted((tmp_path / "a" / "_fleetllm" / "grouped").rglob("*.jsonl"))
    files_b = sorted((tmp_path / "b" / "_fleetllm" / "grouped").rglob("*.jsonl"))
    assert [f.read_bytes() for f in files_a] == [f.read_bytes() for f in files_b]


def test_a_second_plan_reuses_the_grouped_files(tmp_path):
    rows = docs_questions(docs=20, questions=3)
    _, first, _ = grouped(tmp_path, rows, shard_rows=10)
    marker = next((tmp_path / "out" / "_fleetllm" / "grouped").rglob(prefix.MARKER))
    written = {p: p.stat().st_mtime_ns for p in marker.parent.iterdir()}
    _, again, _ = grouped(tmp_path, rows, shard_rows=10)
    assert [s.identity() for s in again] == [s.identity() for s in first]
    assert {p: p.stat().st_mtime_ns for p in marker.parent.iterdir()} == written


def test_grouped_files_of_an_earlier_version_read_the_same(tmp_path):
    """The grouped rows carry their own file and line as `_file` / `_source_line`, the names they have in
    memory; a folder grouped by an earlier version (`_src_file` / `_src_line` on disk) resumes with the same rows."""
    rows = docs_questions(docs=10, questions=3)
    _, shards, by_shard = grouped(tmp_path, rows, shard_rows=10)
    files = sorted((tmp_path / "out" / "_fleetllm" / "grouped").rglob("*.jsonl"))
    on_disk = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    assert all({"_file", "_source_line"} <= set(r) and not {"_src_file", "_src_line", "_line"} & set(r)
               for r in on_disk)
    for f in files:  # rewritten as an earlier version wrote them (read whole below: offsets are not reused)
        old = []
        for line in f.read_text().splitlines():
            r = json.loads(line)
            r["_src_file"], r["_src_line"] = r.pop("_file"), r.pop("_source_line")
            old.append(json.dumps(r) + "\n")
        f.write_text("".join(old))
    pre = TemplatePreprocessor(None, TEMPLATE)
    again, before = {}, {}
    for f in files:
        for s in plan_shards(describe_files(str(f), GROUPED_FORMAT, 10), 10):
            rows_read = [pre(r) for r in read_shard_rows(s.to_dict(), GROUPED_FORMAT)]
            again.setdefault(f.name, []).extend({k: v for k, v in r.items() if k != "_shard"} for r in rows_read)
    for s in shards:
        before.setdefault(s.rel.split("/")[-1], []).extend(
            {k: v for k, v in r.items() if k != "_shard"} for r in by_shard[s.shard_id])
    assert again == before and sum(map(len, again.values())) == len(rows)
    assert all(r["_source_line"] == int(r["row_id"].split(":")[1]) for rs in again.values() for r in rs)


@pytest.mark.parametrize("questions, on", [(1, False), (4, True)])
def test_auto_groups_only_when_the_sample_shows_shared_prefixes(tmp_path, questions, on):
    rows = docs_questions(docs=2048 // questions, questions=questions)
    pre = TemplatePreprocessor(None, TEMPLATE)
    texts = [prefix.prompt_text(pre({**r, "_line": k})) for k, r in enumerate(rows)]
    sample = texts[:512]  # the rows are shuffled: the first ones are a uniform sample
    decision = prefix.decide("auto", sample, len(rows))
    assert decision.on is on, decision.reason
    # the key: what every prompt shares (the template's head) plus KEY_EXTRA characters of the document
    assert decision.key_chars == prefix.common_prefix_len(sample) + prefix.KEY_EXTRA


def test_one_shared_few_shot_prefix_is_not_grouped_by_auto():
    shots = "Examples:\n" + "\n".join(f"Q: {i}+{i}? A: {2 * i}" for i in range(50))
    texts = [f"{shots}\nQ: {i} times {i + 7}, spelled out in words?" for i in range(1000)]
    assert not prefix.decide("auto", texts, 10_000).on
    assert not prefix.decide("auto", texts[:10], 100).on  # small jobs: never
    assert prefix.decide("on", texts, 100).on and not prefix.decide("off", texts, 10_000).on


def test_error_rows_and_prompt_rows_have_keys():
    assert prefix.prompt_text({"error": "bad line", "prompt": "x"}) == ""
    assert prefix.prompt_text({"prompt": "hello"}) == "hello"
    assert prefix.prompt_text({"_messages": '[{"role": "user"}]', "prompt": "x"}) == '[{"role": "user"}]'
    assert prefix.key_of("abcdef", 3) == prefix.key_of("abcxyz", 3) != prefix.key_of("abd", 3)
    assert all(0 <= prefix.bucket_of(prefix.key_of(str(i), 5), 7) < 7 for i in range(100))


def test_progress_shows_the_hit_rate_only_where_the_engine_says(tmp_path):
    from rich.console import Console

    from fleetllm.batch.reports.progress import JobProgress

    progress = JobProgress(10, console=Console(file=open(tmp_path / "log", "w"), force_terminal=False))
    progress.advance(5, 20, 0, 1000, None)  # transformers: no cache figure
    assert "prefix cache" not in progress.line()
    progress.advance(5, 20, 0, 1000, 750)
    assert "prefix cache 75%" in progress.line()


def test_commit_objects_without_cache_figures_stay_as_they_were():
    from fleetllm.batch.output.commit import ManifestEntry

    entry = ManifestEntry(3, "part-000003.parquet", 5, 0, 100, 20, "ab", [])
    assert "cached_tokens" not in json.loads(entry.to_json())
    assert json.loads(ManifestEntry(**{**json.loads(entry.to_json()), "cached_tokens": 64}).to_json())["cached_tokens"] == 64


def test_the_openai_engine_reads_cached_tokens_where_the_server_reports_them():
    from openai.types.chat import ChatCompletion

    from fleetllm.engines.openai.client import _parse
    from fleetllm.engines.openai.engine import to_result

    body = {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}],
            "usage": {"prompt_tokens": 300, "completion_tokens": 2, "total_tokens": 302}}
    assert to_result(_parse(ChatCompletion.model_validate(body)), 1).num_cached_tokens is None
    body["usage"]["prompt_tokens_details"] = {"cached_tokens": 256}
    assert to_result(_parse(ChatCompletion.model_validate(body)), 1).num_cached_tokens == 256


def test_columns_json_would_not_give_back_keep_a_job_ungrouped():
    import datetime
    import decimal

    import pyarrow as pa

    assert prefix.json_unsafe_column(pa.schema([("doc", pa.string()), ("n", pa.int64())]), []) is None
    assert prefix.json_unsafe_column(pa.schema([("doc", pa.string()), ("at", pa.timestamp("us"))]), []) == (
        "at", "timestamp[us]")
    assert prefix.json_unsafe_column(pa.schema([("tags", pa.list_(pa.binary()))]), [])[0] == "tags"
    # typed inputs without a column plan (Hugging Face datasets): the sampled values decide
    assert prefix.json_unsafe_column(None, [{"doc": "x", "price": decimal.Decimal("1.10")}]) == ("price", "Decimal")
    assert prefix.json_unsafe_column(None, [{"doc": "x", "meta": {"day": datetime.date(2026, 1, 2)}}])[0] == "meta"
    assert prefix.json_unsafe_column(None, [{"doc": "x", "_file": b"internal"}]) is None


def test_replica_lanes_keep_each_grouped_file_on_one_lane_balanced_and_deterministic(tmp_path):
    rows = docs_questions(40, 4)
    _, shards, _ = grouped(tmp_path, rows, shard_rows=12)
    assert len({s.rel for s in shards}) >= 3 and len(shards) > len({s.rel for s in shards})  # files of 2+ shards
    for replicas in (1, 2, 3):
        lanes = prefix.replica_lanes(shards, replicas)
        again = prefix.replica_lanes(list(reversed(shards)), replicas)  # the same lanes, whatever the order
        assert [sorted(s.shard_id for s in lane) for lane in lanes] == [sorted(s.shard_id for s in lane) for lane in again]
        flat = [s.shard_id for lane in lanes for s in lane]
        assert sorted(flat) == sorted(s.shard_id for s in shards)  # each shard once
        lane_of = {s.rel: k for k, lane in enumerate(lanes) for s in lane}
        for k, lane in enumerate(lanes):  # every shard of a grouped file in that file's one lane
            assert all(lane_of[s.rel] == k for s in lane)
        assert len(lanes) == min(replicas, len({s.rel for s in shards}))
        loads = [sum(s.rows for s in lane) for lane in lanes]
        biggest = max(sum(s.rows for s in shards if s.rel == rel) for rel in lane_of)
        assert max(loads) - min(loads) <= biggest  # balanced to within one file
    one_file = [s for s in shards if s.rel == shards[0].rel]
    assert prefix.replica_lanes(one_file, 4) == [one_file]  # no empty lanes


def test_openai_batch_lines_key_on_their_messages_in_order_or_their_prompt():
    from fleetllm.batch.inputs.openai_batch import OpenAIBatchPreprocessor

    pre = OpenAIBatchPreprocessor({})

    def key_text(line: dict) -> str:
        row = {**line, "body": json.dumps(line["body"]), "_file": "b.jsonl", "_line": 0}
        return prefix.prompt_text(pre(row))

    system = {"role": "system", "content": "Be brief."}
    chat = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [system, {"role": "user", "content": "Doc one. Question 1?"}]}}
    assert key_text(chat) == "system\nBe brief.\nuser\nDoc one. Question 1?\n"
    parts = {**chat, "body": {"messages": [system, {"content": [{"type": "text", "text": "Doc one. "},
                                                                 {"type": "text", "text": "Question 2?"}],
                                                     "role": "user"}]}}
    assert key_text(parts) == "system\nBe brief.\nuser\nDoc one. Question 2?\n"  # parts joined, key order moot
    completion = {"custom_id": "b", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Once upon"}}
    assert key_text(completion) == "Once upon"
    assert key_text({**completion, "body": {"prompt": ["Once", " upon"]}}) == "Once upon"
    assert key_text({**chat, "url": "/v1/images/generations"}) == ""  # an error line: no key of its own
    assert prefix.prompt_text({"_input_error": None, "error": "line 3 is not a JSON object"}) == ""


def test_openai_batch_input_is_grouped_keeping_every_field_of_each_line(tmp_path):
    from fleetllm.batch.planning.job_plan import decide_grouping
    from fleetllm.batch.planning.job_prepare import grouped_shards
    from fleetllm.batch.inputs.openai_batch import OpenAIBatchPreprocessor
    from fleetllm.spec import JobSpec

    lines = document_lines(docs=70, questions=4)
    text = [json.dumps(x) for x in lines]
    text.insert(57, "{not json")
    (tmp_path / "batch.jsonl").write_text("\n".join(text) + "\n")
    spec = JobSpec.model_validate({
        "model": {"source": "m", "engine": "openai", "engine_kwargs": {"base_url": "http://127.0.0.1:9/v1"}},
        "input": {"path": str(tmp_path / "batch.jsonl"), "format": "openai_batch"},
        "output": {"path": str(tmp_path / "out"), "format": "openai_batch", "shard_rows": 16}})
    assert spec.compute.prefix_grouping == "auto"
    shards = plan_shards(describe_files(spec.input.path, "openai_batch", 16), 16)
    decision = decide_grouping(spec, "generate", None, shards)
    assert decision.on, decision.reason  # 281 lines, each document's prompt 4 times: auto groups them
    gshards = grouped_shards(spec, shards, decision, {"input_format": "openai_batch"})
    pre = OpenAIBatchPreprocessor({})
    by_shard = {s.shard_id: [pre(r) for r in read_shard_rows(s.to_dict(), GROUPED_FORMAT)] for s in gshards}
    seen = [r for rs in by_shard.values() for r in rs]
    assert sorted(r["row_id"] for r in seen) == sorted([x["custom_id"] for x in lines] + ["batch.jsonl:57"])
    original = {x["custom_id"]: x for x in lines}
    for r in seen:  # every field of the line, as it was
        if r["row_id"] == "batch.jsonl:57":
            assert "is not a JSON object" in r["error"] and "custom_id" not in r
            continue
        assert r["error"] is None
        assert {k: r[k] for k in ("custom_id", "method", "url")} == {k: original[r["custom_id"]][k]
                                                                       for k in ("custom_id", "method", "url")}
        assert json.loads(r["body"]) == original[r["custom_id"]]["body"]
    for rs in by_shard.values():  # a document's lines next to each other within a shard
        docs = [r["custom_id"].split("q")[0] for r in rs if "custom_id" in r]
        runs = [d for k, d in enumerate(docs) if k == 0 or docs[k - 1] != d]
        assert len(runs) == len(set(runs))
    where = defaultdict(set)
    for sid, rs in by_shard.items():
        for r in rs:
            if "custom_id" in r:
                where[r["custom_id"].split("q")[0]].add(sid)
    assert sum(len(s) == 1 for s in where.values()) >= 0.75 * len(where)

    embed = JobSpec.model_validate({**spec.model_dump(exclude_defaults=True), "task": "embed"})
    refused = decide_grouping(embed, "embed", None, shards)
    assert not refused.on and "embed jobs (OpenAI Batch /v1/embeddings lines)" in refused.reason
