"""`tpu-shards extract`: records back to files, byte for byte, so a dataset can be rebuilt from them."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest
from conftest import run_cli, run_job, write_images
from test_cli import assert_one_line_error

from shard_utils.format.manifest import load
from shard_utils.read.extract import MAP_NAME, extract
from shard_utils.read.stored import iter_split


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """JPEGs (kept byte for byte by the build) and PNGs (re-encoded to JPEG) in two splits."""
    base = tmp_path_factory.mktemp("extract")
    write_images(base / "in", {"cat": 9, "dog": 7}, size=(48, 40))
    write_images(base / "in", {"cat": 3, "dog": 2}, size=(40, 36), fmt="PNG", ext="png", seed=500)
    run_job(base / "in", base / "ds", "--splits", "train=0.7,validation=0.3", "--num-cores", "1")
    return base / "ds"


def stored_images(dataset) -> dict[str, list[tuple[str, bytes]]]:
    m = load(str(dataset))
    return {split: sorted((r.label_texts[0], r.media[0]) for r in iter_split(m, split)) for split in m.splits}


@pytest.mark.slow
def test_extract_then_rebuild_gives_the_same_image_bytes(built, tmp_path):
    done = extract(str(built), str(tmp_path / "files"))
    m = load(str(built))
    assert done.count == sum(s.num_records for s in m.splits.values()) == 21 and done.renamed == 0
    for split in m.splits:
        for record in iter_split(m, split):
            path = tmp_path / "files" / split / record.label_texts[0] / record.source_id.split("/")[-1]
            assert path.read_bytes() == record.media[0]
    with open(tmp_path / "files" / MAP_NAME, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 21 and all(r["note"] == "" for r in rows)

    rebuilt = run_job(tmp_path / "files", tmp_path / "again", "--num-cores", "1")
    assert set(rebuilt.splits) == set(m.splits)  # the split folders were recognised
    assert rebuilt.skipped["by_reason"] == {"not_media": 1}  # extract_map.csv, counted, never read as an image
    assert stored_images(tmp_path / "again") == stored_images(built)  # PNG-born JPEGs too: nothing re-encoded


def test_extract_filters(built, tmp_path):
    m = load(str(built))
    done = extract(str(built), str(tmp_path / "a"), split="validation", label="dog", limit=2)
    assert done.count == 2
    files = sorted(p.relative_to(tmp_path / "a").parts[:2] for p in (tmp_path / "a").rglob("*.*")
                   if p.name != MAP_NAME)
    assert files == [("validation", "dog")] * 2
    first = next(iter_split(m, "train"))
    done = extract(str(built), str(tmp_path / "b"), source_id=first.source_id)
    path = tmp_path / "b" / "train" / first.label_texts[0] / first.source_id.split("/")[-1]
    assert done.count == 1 and path.read_bytes() == first.media[0]


def test_extract_command_and_its_errors(built, tmp_path):
    done = run_cli("extract", built, tmp_path / "out", "--split", "train", "--limit", "3")
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out"
    assert done.stdout.strip() == f"tpu-shards: extracted 3 records to {out} (map: {out / MAP_NAME})"
    assert len([p for p in (tmp_path / "out").rglob("*") if p.is_file()]) == 4
    assert_one_line_error(run_cli("extract", built, tmp_path / "out"), "not an empty folder")
    assert_one_line_error(run_cli("extract", built, tmp_path / "x", "--split", "test"), "split 'test' is not in")
    assert_one_line_error(run_cli("extract", built, tmp_path / "x", "--label", "cow"), "label 'cow' is not in")
    assert_one_line_error(run_cli("extract", built, tmp_path / "x", "--limit", "0"), "--limit 0")
    assert_one_line_error(run_cli("extract", tmp_path / "nothing", tmp_path / "x"), "no readable manifest")
    assert not (tmp_path / "x").exists()


def test_extract_names_a_damaged_shard(built, tmp_path):
    damaged = tmp_path / "ds"
    damaged.mkdir()
    for p in built.iterdir():
        (damaged / p.name).write_bytes(p.read_bytes())
    shard = load(str(damaged)).splits["train"].shards[0].path
    data = bytearray((damaged / shard).read_bytes())
    data[40] ^= 0xFF
    (damaged / shard).write_bytes(bytes(data))
    done = run_cli("extract", damaged, tmp_path / "out")
    assert_one_line_error(done, f"{shard}: record 0: data checksum mismatch", "tpu-shards verify")
    assert done.returncode == 1
