"""--stratify: each class cut into the splits at their fractions, within one record, the same on every runner."""
from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that
from conftest import run_job, write_images
from test_options import one_line_error

from beam_jobs.pipeline.stratify import Stratify
from shard_utils.format import index
from shard_utils.format.manifest import load
from shard_utils.format.order import split_hash
from shard_utils.inputs import MediaItem
from shard_utils.sharding.stratify import HASH_END, class_cuts, cumulative_counts, split_of

SPLITS = (("train", 0.7), ("validation", 0.2), ("test", 0.1))
CLASSES = {("cat",): 101, ("dog",): 7, ("fish",): 1, ("cat", "dog"): 33, (): 12}  # () : unlabeled media


def within_one(counts: Counter, sizes: dict, splits=SPLITS) -> list[str]:
    """Every (class, split) count that is more than one away from the split's fraction of the class."""
    return [f"{c} {name}: {counts[c, name]} for {f * n:g}" for c, n in sizes.items() for name, f in splits
            if abs(counts[c, name] - f * n) > 1]


def test_cumulative_rounding_keeps_every_split_within_one_of_its_fraction():
    rng = random.Random(7)
    for _ in range(2000):
        k = rng.randint(2, 5)
        fractions = [rng.random() + 0.01 for _ in range(k)]
        fractions = [f / sum(fractions) for f in fractions]
        n = rng.randint(0, 500)
        ends = cumulative_counts(n, fractions)
        sizes = [b - a for a, b in zip([0] + ends, ends, strict=False)]
        assert ends[-1] == n and min(sizes) >= 0
        assert all(abs(size - f * n) <= 1 for size, f in zip(sizes, fractions, strict=True)), (n, fractions, sizes)


def test_cuts_give_the_rounded_counts_whatever_order_the_hashes_come_in():
    hashes = np.array([split_hash(3, f"x/{i}.jpg") for i in range(57)], dtype=np.uint64)
    cuts = class_cuts(hashes, [f for _, f in SPLITS])
    assert cuts == class_cuts(hashes[::-1].copy(), [f for _, f in SPLITS])
    names = [name for name, _ in SPLITS]
    got = Counter(split_of(names, cuts, int(h)) for h in hashes)
    assert [got[n] for n in names] == [40, 11, 6]  # round(39.9), round(51.3) - 40, the rest
    assert class_cuts(np.array([5], dtype=np.uint64), [0.5, 0.5]) == (HASH_END,)  # 1 item: round(0.5) = 1 in train


def items() -> list[MediaItem]:
    return [MediaItem(source_id=f"{'-'.join(labels) or 'none'}/{i}.jpg", uri="", size=1, labels=labels)
            for labels, n in CLASSES.items() for i in range(n)]


def expected(listed: list[MediaItem], seed: int) -> dict[str, str]:
    """{source id: split} from the pure functions: each class's cuts from its items' hashes."""
    names, fractions = [n for n, _ in SPLITS], [f for _, f in SPLITS]
    by_class: dict = {}
    for item in listed:
        by_class.setdefault(item.labels, []).append(split_hash(seed, item.source_id))
    cuts = {c: class_cuts(np.array(h, dtype=np.uint64), fractions) for c, h in by_class.items()}
    return {item.source_id: split_of(names, cuts[item.labels], split_hash(seed, item.source_id)) for item in listed}


@pytest.mark.slow
def test_stratify_cuts_each_class_within_one_and_does_not_depend_on_chunks_or_order():
    """One pipeline, the same items chunked and ordered two ways: both get the splits of the pure cut."""
    import apache_beam as beam
    from apache_beam.testing.util import equal_to

    listed = items()
    want = expected(listed, seed=11)
    counts = Counter((item.labels, want[item.source_id]) for item in listed)
    assert within_one(counts, CLASSES) == [] and counts[("fish",), "train"] == 1
    shuffled = listed[:]
    random.Random(1).shuffle(shuffled)
    with TestPipeline(runner="FnApiRunner") as p:
        for name, order, size in (("Tens", listed, 10), ("Threes", shuffled, 3)):
            chunks = [order[i:i + size] for i in range(0, len(order), size)]
            out = (p | f"{name}Create" >> beam.Create(chunks, reshuffle=False)
                   | f"{name}Stratify" >> Stratify(SPLITS, seed=11)
                   | f"{name}Splits" >> beam.FlatMap(lambda chunk: ((i.source_id, i.split) for i in chunk)))
            assert_that(out, equal_to(sorted(want.items())), label=f"{name}Check")


@pytest.mark.parametrize("argv,fragment", [
    (["--split-column", "fold", "--listing", "x.csv"], "--split-column fold already give every split"),
    (["--splits", "train=1"], "--stratify needs --splits with two or more splits"),
    ([], "--stratify needs --splits with two or more splits"),
])
def test_stratify_where_it_cannot_apply_is_one_line(capsys, images, tmp_path, argv, fragment):
    if "--listing" in argv:
        (tmp_path / "x.csv").write_text("path,label,fold\na.jpg,cat,0\n")
        argv = [a if a != "x.csv" else str(tmp_path / "x.csv") for a in argv]
    one_line_error(capsys, ["build", "--input", str(images), "--output", str(tmp_path / "out"), "--stratify", *argv],
                   fragment)
    assert not (tmp_path / "out").exists()


def test_stratify_with_split_folders_is_one_line(capsys, tmp_path):
    write_images(tmp_path / "in" / "train", {"cat": 1}, size=(8, 8))
    one_line_error(capsys, ["build", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--stratify",
                            "--splits", "train=0.5,test=0.5"], "drop --splits")
    one_line_error(capsys, ["build", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
                            "--stratify"], "--stratify cuts classes at the --splits fractions; the input's "
                                           "train/validation/test folders already give every split")


def split_labels(out) -> Counter:
    """(label id, split) counts of a dataset, from its index."""
    m = load(str(out))
    found: Counter = Counter()
    for name, split in m.splits.items():
        with open(out / split.index.path, "rb") as f:
            found.update((row.label, name) for row in index.read_index(f, max_rows=split.index.num_rows))
    return found


@pytest.mark.slow
def test_a_stratified_build_has_every_class_within_one_and_the_same_bytes_with_other_workers(tmp_path, capsys):
    """(With a split named `valid`: kept, with a note in the summary.)"""
    sizes = {"a": 23, "b": 9, "c": 14}
    write_images(tmp_path / "in", sizes, size=(16, 12))
    opts = ("--num-cores", "1", "--splits", "train=0.7,valid=0.2,test=0.1", "--stratify")
    m = run_job(tmp_path / "in", tmp_path / "one", *opts)
    assert m.options["stratify"] is True and sorted(m.splits) == ["test", "train", "valid"]
    assert "  note: split 'valid' is not 'validation'; loaders asking for 'validation' will not find it" in \
        capsys.readouterr().out.splitlines()
    counts = split_labels(tmp_path / "one")
    splits = (("train", 0.7), ("valid", 0.2), ("test", 0.1))
    assert within_one(counts, {m.labels.index(k): n for k, n in sizes.items()}, splits) == []
    assert sum(counts.values()) == 46
    run_job(tmp_path / "in", tmp_path / "two", *opts, "--workers", "1")  # other bundles, one encode process
    shards = sorted(p.name for p in (tmp_path / "one").glob("*.tfrecord"))
    assert len(shards) == 3 and all((tmp_path / "one" / s).read_bytes() == (tmp_path / "two" / s).read_bytes()
                                    for s in shards)
