"""--near-dups in real builds and appends: planted copies (resized, re-compressed) of generated photos kept in one
split (group) or rejected naming the kept photo (drop), and an append whose near-duplicate of a validation photo
goes to validation or is rejected. Each builds small datasets (a few seconds each)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import photo
from PIL import Image
from readers import by_source

import beam_jobs
from shard_utils.format.order import choose_split
from shard_utils.quality.signature import NEAR_DISTANCE, hamming, signature
from shard_utils.read.verify import verify

pytestmark = pytest.mark.slow

SIZE = (96, 72)
HALVES = [("train", 0.5), ("validation", 0.5)]


def seeded(root, name: str, seed: int, scale: float = 1.0, quality: int = 90) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    image = photo(*SIZE, seed=seed)
    if scale != 1.0:
        image = image.resize((int(SIZE[0] * scale), int(SIZE[1] * scale)))
    image.save(path, "JPEG", quality=quality)


def across(name: str, other: str) -> bool:
    return choose_split(HALVES, 0, name) != choose_split(HALVES, 0, other)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """12 photos, a 75 % copy at quality 60 of cat/img0001 filed as fish (a label conflict) and a 150 % copy of
    dog/img0002 under cat, each named so that its own hash puts it in the other split than its original."""
    root = tmp_path_factory.mktemp("near") / "in"
    for label, base in (("cat", 0), ("dog", 1000)):
        for i in range(6):
            seeded(root, f"{label}/img{i:04d}.jpg", base + i)
    small = next(f"fish/small{i}.jpg" for i in range(50) if across(f"fish/small{i}.jpg", "cat/img0001.jpg"))
    big = next(f"cat/big{i}.jpg" for i in range(50) if across(f"cat/big{i}.jpg", "dog/img0002.jpg"))
    seeded(root, small, 1, scale=0.75, quality=60)
    seeded(root, big, 1002, scale=1.5)
    return root, {small: "cat/img0001.jpg", big: "dog/img0002.jpg"}


def pixels_signature(path) -> int:
    return signature(np.asarray(Image.open(path).convert("RGB")))


def quality_lines(out) -> list[dict]:
    return [json.loads(line) for line in (out / "quality.jsonl").read_text().splitlines()]


def where(out) -> dict[str, str]:
    return {source: split for split in ("train", "validation") for source in by_source(out, split)}


def total(m, split=("train", "validation")) -> int:
    return m.num_records(split)


def build(root, out, *args: str, **options):
    return beam_jobs.build(root, out, splits="train=0.5,validation=0.5", num_cores=1, workers=1, **options)


def test_report_lists_leaks_and_conflicts_and_group_keeps_each_cluster_in_one_split(images, tmp_path):
    root, copies = images
    reported = build(root, tmp_path / "report")
    near = [f for f in quality_lines(tmp_path / "report") if f["kind"] == "near_duplicate"]
    assert sorted(sorted(f["sources"]) for f in near) == sorted(sorted(pair) for pair in copies.items())
    assert all(len(set(f["splits"])) == 2 for f in near)  # planted across the splits: both leak
    assert reported.quality["by_kind"]["label_conflict"] == 2  # fish vs cat, cat vs dog
    grouped = build(root, tmp_path / "group", near_dups="group")
    placed = where(tmp_path / "group")
    for copy, original in copies.items():
        kept = min(copy, original)
        assert placed[copy] == placed[original] == choose_split(HALVES, 0, kept)
    assert {f["kind"] for f in quality_lines(tmp_path / "group")} >= {"near_duplicate", "label_conflict"}
    assert not any(len(set(f["splits"])) > 1 for f in quality_lines(tmp_path / "group")
                   if f["kind"] == "near_duplicate")
    assert total(grouped) == total(reported) == 14 and grouped.files_seen == 14
    was = where(tmp_path / "report")
    movers = [max(pair) for pair in copies.items()]  # the smallest source id stays, the other joins it
    for s in ("train", "validation"):
        assert total(grouped, s) == total(reported, s) + sum((placed[m] == s) - (was[m] == s) for m in movers)
    assert verify(str(tmp_path / "group"), deep=True) == []
    before = {**by_source(tmp_path / "report", "train"), **by_source(tmp_path / "report", "validation")}
    for m in movers:  # a moved record is the record its own split would have held, byte for byte
        assert by_source(tmp_path / "group", placed[m])[m] == before[m]


def test_drop_keeps_one_per_cluster_and_the_accounting_closes(images, tmp_path):
    root, copies = images
    dropped = build(root, tmp_path / "drop", near_dups="drop")
    rejected = [json.loads(line) for line in (tmp_path / "drop" / "rejected.jsonl").read_text().splitlines()]
    expected = {max(pair): ("near_duplicate", f"a near-duplicate of {min(pair)}") for pair in copies.items()}
    assert {r["source"]: (r["reason"], r["message"].split(" (")[0]) for r in rejected} == expected
    assert total(dropped) == 12 and dropped.files_seen == 14 == total(dropped) + len(rejected)
    assert not set(expected) & set(where(tmp_path / "drop"))
    assert verify(str(tmp_path / "drop"), deep=True) == []


@pytest.mark.parametrize("mode", ["group", "drop"])
def test_an_append_brings_a_near_duplicate_of_a_validation_photo(images, tmp_path, mode):
    root, _ = images
    src = tmp_path / "in"
    shutil.copytree(root, src)
    out = tmp_path / "out"
    build(src, out, near_dups=mode)
    name = next(f"new/copy{i}.jpg" for i in range(50) if choose_split(HALVES, 0, f"new/copy{i}.jpg") == "train")
    for original in sorted(by_source(out, "validation")):  # a validation photo whose 75 % copy the signature finds
        if original.startswith("dog/img"):
            seeded(src, name, 1000 + int(original[len("dog/img"):-4]), scale=0.75, quality=60)
            if hamming(pixels_signature(src / name), pixels_signature(src / original)) <= NEAR_DISTANCE:
                break
    grown = beam_jobs.build(src, out, append=True, num_cores=1, workers=1,  # no new file lands in validation
                            max_rejected="100%")
    if mode == "group":
        assert name in by_source(out, "validation") and name not in by_source(out, "train")
    else:
        rejected = [json.loads(line) for line in (out / grown.rejected["path"]).read_text().splitlines()]
        assert [(r["source"], r["reason"]) for r in rejected if r["source"].startswith("new/")] == [
            (name, "near_duplicate")]
        assert f"{original} (already in the dataset, in split validation)" in rejected[-1]["message"]
    assert verify(str(out), deep=True) == []
