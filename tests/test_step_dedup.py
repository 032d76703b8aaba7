"""FindDuplicates on its own: encoded runs in, the records whose source bytes another record has are dropped
(the smallest source id, or the dataset's own record, is kept), each with a `duplicate` reject."""
from __future__ import annotations

import hashlib

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to
from conftest import write_images
from steps import (counters, created, encoded_runs, labels_of, laid_out, media_chunks, outputs, pipeline, run,
                   step_config)

from beam_jobs.pipeline.dedup import FindDuplicates


@pytest.fixture(scope="module")
def encoded(tmp_path_factory):
    """8 JPEGs, two of them copies of cat/img0000.jpg (one under dog/, one under fish/), encoded into runs."""
    tmp_path = tmp_path_factory.mktemp("dedup")
    root = tmp_path / "in"
    write_images(root, {"cat": 3, "dog": 3})
    for copy in ("dog/copy.jpg", "fish/copy.jpg"):
        (root / copy).parent.mkdir(exist_ok=True)
        (root / copy).write_bytes((root / "cat" / "img0000.jpg").read_bytes())
    config = step_config(tmp_path, root, "--splits", "train=0.5,validation=0.5", "--dedup")
    chunks = media_chunks(config)
    laid = laid_out(config, chunks)
    split_of = {item.source_id: split for chunk in laid["keyed"] for split, _, item in chunk}
    return root, encoded_runs(config, laid, labels_of(chunks)), split_of


def where(runs, split: str, run_: int, position: int) -> str:
    """The source id of the record at a run's position."""
    found = next(r for r in runs if (r.split, r.run) == (split, run_))
    return found.file.entries()[position].meta.source_id


def test_copies_are_dropped_and_the_smallest_source_id_is_kept(encoded):
    root, runs, split_of = encoded
    out, result = outputs(lambda p: dict(zip(("dropped", "rejected", "cross_split"),
                                             created(p, "Runs", runs) | FindDuplicates())))
    assert sorted(where(runs, *d) for d in out["dropped"]) == ["dog/copy.jpg", "fish/copy.jpg"]
    kept = f"same bytes as cat/img0000.jpg (kept, in split {split_of['cat/img0000.jpg']})"
    assert sorted((r["source"], r["reason"], r["message"]) for r in out["rejected"]) == [
        ("dog/copy.jpg", "duplicate", kept), ("fish/copy.jpg", "duplicate", kept)]
    kept_split = split_of["cat/img0000.jpg"]
    crossing = sorted("|".join(sorted((split_of[c], kept_split))) for c in ("dog/copy.jpg", "fish/copy.jpg")
                      if split_of[c] != kept_split)
    assert crossing and sorted(out["cross_split"]) == crossing  # this seed puts a copy in the other split
    assert counters(result)["rejected_duplicate"] == 2


def test_the_decision_does_not_depend_on_the_order_of_the_runs(encoded):
    _, runs, _ = encoded
    forward, _ = outputs(lambda p: {"dropped": (created(p, "Runs", runs) | FindDuplicates()).dropped})
    p = pipeline()
    backward = created(p, "Runs", list(reversed(runs))) | FindDuplicates()
    assert_that(backward.dropped, equal_to(forward["dropped"]), label="SameDropped")
    assert_that(backward.rejected | beam.Map(lambda r: r["source"]), equal_to(["dog/copy.jpg", "fish/copy.jpg"]),
                label="SameRejected")
    run(p)


def test_a_file_the_dataset_already_holds_is_dropped_and_its_record_kept(encoded):
    """An append: the dataset's own record wins over every new file with its bytes."""
    root, runs, _ = encoded
    old = [(hashlib.sha256((root / "dog" / "img0001.jpg").read_bytes()).hexdigest(), ("old/photo.jpg", "train"))]
    p = pipeline()
    found = created(p, "Runs", runs) | FindDuplicates(created(p, "Existing", old))
    assert_that(found.rejected | beam.Map(lambda r: (r["source"], r["message"])), equal_to([
        ("dog/copy.jpg", "same bytes as cat/img0000.jpg (kept, in split " + _split(runs, "cat/img0000.jpg") + ")"),
        ("fish/copy.jpg", "same bytes as cat/img0000.jpg (kept, in split " + _split(runs, "cat/img0000.jpg") + ")"),
        ("dog/img0001.jpg", "same bytes as old/photo.jpg (already in the dataset, in split train)")]))
    assert_that(found.dropped | beam.Map(lambda d: where(runs, *d)),
                equal_to(["dog/copy.jpg", "fish/copy.jpg", "dog/img0001.jpg"]), label="Dropped")
    run(p)


def _split(runs, source_id: str) -> str:
    return next(r.split for r in runs if r.file and any(e.meta.source_id == source_id for e in r.file.entries()))
