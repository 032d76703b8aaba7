"""ListMedia and ListListedMedia on their own: a real folder (or listing) in, media chunks, rejects, skipped
files, the tally and the labels out, with the counters the job reports."""
from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to
from conftest import write_images
from steps import counters, pipeline, run, step_config

from beam_jobs.pipeline.listing import ListListedMedia, ListMedia
from beam_jobs.run.tally import sum_tallies


def folder(tmp_path):
    """cat/ (3 JPEGs), dog/ (2 JPEGs, a text file, a hidden JPEG), a JPEG at the top (no label)."""
    root = tmp_path / "in"
    write_images(root, {"cat": 3, "dog": 2})
    (root / "dog" / "notes.txt").write_text("not an image")
    (root / "dog" / ".hidden.jpg").write_bytes((root / "dog" / "img0000.jpg").read_bytes())
    (root / "loose.jpg").write_bytes((root / "cat" / "img0000.jpg").read_bytes())
    return root


def source_ids(out):
    return out["media"] | "Ids" >> beam.FlatMap(lambda chunk: [item.source_id for item in chunk])


def tally_of(out):
    return (out["tally"] | "AllTallies" >> beam.combiners.ToList()
            | "Sum" >> beam.Map(lambda ts: (lambda t: (t.seen, dict(t.skipped)))(sum_tallies(ts))))


@pytest.mark.slow
def test_list_media_sorts_a_folder_into_media_rejects_and_skipped_files(tmp_path):
    config = step_config(tmp_path, folder(tmp_path))
    p = pipeline()
    out = p | ListMedia(config)
    # loose.jpg has no label: an item still (encoding rejects it `no_label` in a build that has labels)
    assert_that(source_ids(out), equal_to(["cat/img0000.jpg", "cat/img0001.jpg", "cat/img0002.jpg",
                                           "dog/img0000.jpg", "dog/img0001.jpg", "loose.jpg"]), label="Media")
    assert_that(out["rejected"], equal_to([]), label="Rejected")
    assert_that(out["skipped_files"], equal_to([{"source": "dog/notes.txt", "reason": "not_media"}]), label="Skipped")
    assert_that(tally_of(out), equal_to([(8, {"not_media": 1, "hidden": 1})]), label="Tally")
    assert_that(out["labels"], equal_to(["cat", "dog"]), label="Labels")
    found = counters(run(p))
    assert (found["files_matched"], found["skipped_not_media"], found["skipped_hidden"]) == (8, 1, 1)


def test_list_media_finds_folders_below_the_stages_it_fans_out(tmp_path):
    """Three stages list level by level; what lies deeper is walked by the last one, and nothing is listed twice."""
    root = tmp_path / "in"
    write_images(root / "a" / "b" / "c" / "d", {"deep": 3})
    write_images(root / "a", {"mid": 2})
    write_images(root, {"top": 4})
    config = step_config(tmp_path, root)
    p = pipeline()
    out = p | ListMedia(config)
    assert_that(source_ids(out), equal_to([f"a/b/c/d/deep/img{i:04d}.jpg" for i in range(3)]
                                          + [f"a/mid/img{i:04d}.jpg" for i in range(2)]
                                          + [f"top/img{i:04d}.jpg" for i in range(4)]), label="Media")
    assert_that(out["labels"], equal_to(["a", "top"]), label="Labels")
    assert counters(run(p))["files_matched"] == 9


@pytest.mark.slow
def test_list_listed_media_rejects_a_row_naming_a_file_again(tmp_path):
    root = tmp_path / "in"
    write_images(root, {"cat": 2})
    rows = ["path,label", "cat/img0000.jpg,cat", "cat/img0001.jpg,dog", "cat/img0000.jpg,cat", "cat/none.jpg,cat"]
    (tmp_path / "list.csv").write_text("\n".join(rows) + "\n")
    config = step_config(tmp_path, root, "--listing", str(tmp_path / "list.csv"))
    p = pipeline()
    out = p | ListListedMedia(config)
    assert_that(source_ids(out), equal_to(["cat/img0000.jpg", "cat/img0001.jpg", "cat/none.jpg"]), label="Media")
    assert_that(out["rejected"] | beam.Map(lambda r: (r["source"], r["reason"])),
                equal_to([("cat/img0000.jpg", "duplicate_row")]), label="Rejected")
    assert_that(out["skipped_files"], equal_to([]), label="Skipped")
    assert_that(tally_of(out), equal_to([(4, {})]), label="Tally")
    assert_that(out["labels"], equal_to(["cat", "dog"]), label="Labels")
    found = counters(run(p))
    assert (found["files_matched"], found["rejected_duplicate_row"]) == (3, 1)
