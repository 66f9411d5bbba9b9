"""Hugging Face datasets as input: local save_to_disk folders and dataset repos, planned and read
shard by shard through fleetllm/batch/inputs/hf_input.py (the hub path goes through the same builder code)."""

from __future__ import annotations

import pytest

datasets = pytest.importorskip("datasets")

from fleetllm.batch.inputs import hf_input  # noqa: E402
from fleetllm.errors import InputError  # noqa: E402
from fleetllm.spec import InputSpec  # noqa: E402


def _rows(n: int, tag: str = "q") -> dict:
    return {"instruction": [f"{tag}{i}" for i in range(n)], "n": list(range(n)), "meta": [{"k": i} for i in range(n)]}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    train = datasets.Dataset.from_dict(_rows(70))
    train.save_to_disk(str(root / "saved"), max_shard_size="2KB")  # several Arrow files
    datasets.DatasetDict({"train": train, "test": datasets.Dataset.from_dict(_rows(7, "t"))}).save_to_disk(
        str(root / "saved_dict"))
    (root / "repo" / "data").mkdir(parents=True)
    train.select(range(40)).to_parquet(str(root / "repo" / "data" / "train-00000-of-00002.parquet"))
    train.select(range(40, 70)).to_parquet(str(root / "repo" / "data" / "train-00001-of-00002.parquet"))
    (root / "jrepo").mkdir()
    train.to_json(str(root / "jrepo" / "train.jsonl"))
    return root


def _all_rows(spec: InputSpec, shard_rows: int) -> list[dict]:
    return [r for s in hf_input.plan(spec, shard_rows) for r in hf_input.read_shard(s)]


@pytest.mark.parametrize("folder", ["saved", "saved_dict", "repo", "jrepo"])
def test_every_kind_of_local_dataset_reads_the_split_slice_shard_by_shard(folders, folder):
    spec = InputSpec(path=str(folders / folder), split="train[5:52]")
    assert spec.format == "hf"
    shards = hf_input.plan(spec, 10)
    assert sum(s.rows for s in shards) == 47
    assert all(s.rows <= 10 for s in shards)
    rows = _all_rows(spec, 10)
    assert [r["instruction"] for r in rows] == [f"q{i}" for i in range(5, 52)]
    assert rows[0]["meta"] == {"k": 5}
    assert hf_input.plan(spec, 10) == shards  # deterministic: resume finds the same shards


def test_the_split_is_chosen_by_name_and_percent_slices_work(folders):
    rows = _all_rows(InputSpec(path=str(folders / "saved_dict"), split="test"), 3)
    assert [r["instruction"] for r in rows] == [f"t{i}" for i in range(7)]
    rows = _all_rows(InputSpec(path=str(folders / "repo"), split="train[:10%]"), 100)
    assert len(rows) == 7


def test_limit_and_columns(folders):
    spec = InputSpec(path=str(folders / "saved"), split="train", limit=12, columns=["instruction"])
    rows = _all_rows(spec, 5)
    assert len(rows) == 12
    assert hf_input.keep_columns(rows[0], spec.columns) == {"instruction": "q0", "_line": 0}


def test_bad_split_and_missing_split_name_the_fix(folders):
    with pytest.raises(InputError, match="not 'validation'"):
        hf_input.plan(InputSpec(path=str(folders / "saved_dict"), split="validation"), 10)
    with pytest.raises(InputError, match="not a split spec"):
        hf_input.plan(InputSpec(path=str(folders / "saved"), split="train[::2]"), 10)
    with pytest.raises(InputError, match="does not exist"):
        hf_input.plan(InputSpec(path=str(folders / "nope"), format="hf"), 10)


def test_an_hf_path_implies_the_format_and_split_needs_hf():
    assert InputSpec(path="hf://datasets/tatsu-lab/alpaca").format == "hf"
    with pytest.raises(ValueError, match="input.format: hf"):
        InputSpec(path="x.jsonl", format="jsonl", split="train")
