"""gs:// listings paged as Cloud Storage pages them: a proxy in front of the emulator re-pages its answers with
the stand-in (benchmarks/scale_sim/stand_in.py), which is first checked against the emulator where the
emulator is faithful. Levels of only sub-folders and of numbered names, more pages than one task lists, are
built whole."""
from __future__ import annotations

import contextlib
import io
import re
import urllib.parse
from types import SimpleNamespace

import pytest
import readers
from conftest import photo, run_job
from gcs_fixtures import FaultProxy, storage_host

from beam_jobs.pipeline.listing import PAGES_PER_TASK
from benchmarks.scale_sim import stand_in
from shard_utils import storage
from shard_utils.format import schema
from shard_utils.storage import base as storage_base

NAMES = sorted([f"in/{c}.jpg" for c in "aceg"] + [f"in/{c}/{i}.jpg" for c in "bdf" for i in range(3)]
               + ["in/d/deeper/x.jpg", "in0.jpg", "other/y.jpg"])


@pytest.fixture(scope="module")
def named(gcs):
    bucket = gcs.new_bucket("named")
    for name in NAMES:
        gcs.client.bucket(bucket).blob(name).upload_from_string(b"x")
    return bucket


def test_the_stand_in_answers_as_the_emulator_where_the_emulator_is_faithful(gcs, named):
    everything = [b.name for b in gcs.client.list_blobs(named)]
    assert everything == stand_in.page(NAMES).items == NAMES  # objects without a delimiter
    level = gcs.client.list_blobs(named, prefix="in/", delimiter="/")
    items = [b.name for b in level]
    found = stand_in.page(NAMES, "in/", "/")
    assert (items, sorted(level.prefixes)) == (found.items, found.prefixes)  # a level of few prefixes, one page
    assert found.prefixes == ["in/b/", "in/d/", "in/f/"] and found.token is None


def test_the_paging_proxy_pages_items_and_prefixes_together_with_offsets(gcs, named):
    with FaultProxy(gcs.url, paginate=True) as proxy, storage_host(proxy.url):
        listing = storage_base.gcs_client().list_blobs(named, prefix="in/", delimiter="/", page_size=2)
        pages = [([b.name for b in page], list(page.prefixes)) for page in listing.pages]
        ranged = storage_base.gcs_client().list_blobs(named, prefix="in/", delimiter="/", start_offset="in/d/1",
                                                      end_offset="in/f")
        in_range = ([b.name for b in ranged], sorted(ranged.prefixes))
    assert pages == [(["in/a.jpg"], ["in/b/"]), (["in/c.jpg"], ["in/d/"]), (["in/e.jpg"], ["in/f/"]),
                     (["in/g.jpg"], [])]
    # Offsets apply to object names: in/d/ is returned because in/d/1.jpg lies in the range.
    assert in_range == (["in/e.jpg"], ["in/d/"])


def test_a_page_of_sub_folders_alone_goes_on_from_its_last(gcs, monkeypatch):
    bucket = gcs.new_bucket("folders")
    for i in range(12):
        gcs.client.bucket(bucket).blob(f"in/f{i:02d}/img.jpg").upload_from_string(b"x")
    monkeypatch.setattr(storage_base, "LIST_PAGE_SIZE", 5)
    root = f"gs://{bucket}/in"
    with FaultProxy(gcs.url, paginate=True) as proxy, storage_host(proxy.url):
        first = storage.list_level(root, "", max_pages=1)
        second = storage.list_level(root, "", after=(first[2], False), max_pages=1)
        rest = [e.rel_path for e in storage.walk(root, after=(second[2], False))]
    assert first == ([], [f"f{i:02d}/" for i in range(5)], "f04/")
    assert second == ([], [f"f{i:02d}/" for i in range(5, 10)], "f09/")
    assert rest == ["f10/img.jpg", "f11/img.jpg"]  # after a sub-folder: after everything it holds


@pytest.mark.slow
def test_levels_of_only_sub_folders_and_of_numbered_names_are_built_whole(gcs, tmp_path, monkeypatch):
    """cat/ holds 60 one-image folders and 5 files, dog/ 60 numbered files: with 5 entries a page, each level
    has more pages than one task lists (10), so both are cut into ranges; every image becomes a record."""
    per_task = 5 * PAGES_PER_TASK
    bucket = gcs.new_bucket("wide")
    names = ([f"in/cat/{i * 7919 % 1000:03x}{i:02d}/img.jpg" for i in range(per_task + 10)]
             + [f"in/cat/loose_{i}.jpg" for i in range(5)] + [f"in/dog/IMG_{i:08d}.jpg" for i in range(per_task + 10)])
    for k, name in enumerate(names):
        buffer = io.BytesIO()
        photo(32, 24, seed=k).save(buffer, "JPEG", quality=90)
        gcs.client.bucket(bucket).blob(name).upload_from_string(buffer.getvalue())
    monkeypatch.setattr(storage_base, "LIST_PAGE_SIZE", 5)
    out = f"gs://{gcs.new_bucket('wide-out')}/ds"
    with FaultProxy(gcs.url, paginate=True) as proxy, storage_host(proxy.url), \
            contextlib.redirect_stdout(io.StringIO()):
        m = run_job(f"gs://{bucket}/in", out, "--num-cores", "1", "--image-size", "16", "--workers", "1")
    assert m.num_records("train") == len(names) and m.files_seen == len(names)
    assert m.rejected["count"] == 0 and sorted(m.labels) == ["cat", "dog"]
    listed = [urllib.parse.unquote(p) for method, p in proxy.requests if method == "GET" and re.search(r"/o\?", p)]
    for level in ("in/cat/", "in/dog/"):  # each level was listed in ranges, from more than one task
        assert sum(f"prefix={level}" in p and "startOffset" in p for p in listed) >= 2, level


def _jpeg(seed: int) -> bytes:
    buffer = io.BytesIO()
    photo(32, 24, seed=seed).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


# Objects whose names differ only by an empty part ('//'): Cloud Storage keeps both names and both contents. The
# emulator keeps both names, sizes and checksums but stores one content for both, the last uploaded: each plain name
# is uploaded last, so its bytes are its own (a read of its '//' twin would fail the twin's checksum).
TWINS = [("in//cat/0.jpg", "in/cat/0.jpg"), ("in/dog//1.jpg", "in/dog/1.jpg")]


@pytest.fixture(scope="module")
def twins(gcs):
    bucket = gcs.new_bucket("twins")
    uploads = [name for pair in TWINS for name in pair] + ["in/cat/1.jpg", "in/dog/0.jpg"]
    contents = {name: _jpeg(k) for k, name in enumerate(uploads)}
    for name in uploads:
        gcs.client.bucket(bucket).blob(name).upload_from_string(contents[name])
    return SimpleNamespace(root=f"gs://{bucket}/in", contents=contents)


@pytest.mark.parametrize("paged", [False, True])
def test_a_name_with_an_empty_part_is_refused_by_the_walk_and_each_level(gcs, twins, paged, monkeypatch):
    """The flat walk refuses each such object, a level listing the sub-folder holding them ('' under 'in/' is '/',
    under 'in/dog/' 'dog//'): neither is listed as the object or folder its name gives without the '//'. Paged as
    Cloud Storage pages (two entries a page, items and prefixes together) or all at once, as the emulator answers."""
    monkeypatch.setattr(storage_base, "LIST_PAGE_SIZE", 2)
    with FaultProxy(gcs.url, paginate=paged) as proxy, storage_host(proxy.url):
        walked = {e.rel_path: e.reason for e in storage.walk(twins.root)}
        top = storage.list_level(twins.root, "")
        dog = storage.list_level(twins.root, "dog/")
    assert walked == {"/cat/0.jpg": "bad_name", "cat/0.jpg": None, "cat/1.jpg": None, "dog/0.jpg": None,
                      "dog//1.jpg": "bad_name", "dog/1.jpg": None}
    assert ([(e.rel_path, e.reason) for e in top[0]], top[1]) == ([("/", "bad_name")], ["cat/", "dog/"])
    assert (sorted((e.rel_path, e.reason) for e in dog[0]), dog[1]) == (
        [("dog//", "bad_name"), ("dog/0.jpg", None), ("dog/1.jpg", None)], [])
    refused = next(e for e in dog[0] if e.reason)
    assert "has an empty part ('//')" in refused.message and "no object under it is read" in refused.message


def test_a_build_reads_each_object_its_own_bytes_and_rejects_a_name_with_an_empty_part(gcs, twins, tmp_path):
    """Each record holds its own object's bytes (passed through unchanged); the '//' twins are rejected, never read
    in a twin's place (before, in//cat/0.jpg was read as in/cat/0.jpg, under the empty label of its first part)."""
    with contextlib.redirect_stdout(io.StringIO()):
        m = run_job(twins.root, tmp_path / "ds", "--num-cores", "1", "--workers", "1")
    records = readers.by_source(tmp_path / "ds")
    assert {source: r[schema.IMAGE_ENCODED] for source, r in records.items()} == {
        rel: twins.contents[f"in/{rel}"] for rel in ("cat/0.jpg", "cat/1.jpg", "dog/0.jpg", "dog/1.jpg")}
    assert readers.rejected(tmp_path / "ds") == {"/": "bad_name", "dog//": "bad_name"}
    assert sorted(m.labels) == ["cat", "dog"]  # no empty label from the name under '//'
