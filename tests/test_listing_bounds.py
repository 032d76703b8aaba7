"""Listings that would inflate without bound: a compressed line of gigabytes, a CSV row whose quoted fields run
over many lines, an Avro block that inflates a thousandfold. Each stops the build with one line naming the
listing and where, within a memory limit and a time limit (a subprocess under RLIMIT_AS)."""
from __future__ import annotations

import bz2
import gzip
import io
import subprocess
import sys
import zlib

import pytest
from conftest import write_images
from hostile import avro_block_bomb, compressed_line_bomb
from test_hostile_reads import assert_one_line_error, run_limited

from shard_utils.inputs import compressed
from shard_utils.inputs.listing_files import MAX_LINE, ListingError, read_rows

BUILD_LIMIT = 3 << 30  # address space of a build: its runner's threads and workers reserve about 2.2 GB
BOMB = 4 << 30  # inflated bytes of a line bomb: more than the build's memory limit
SCHEMA = {"type": "record", "name": "Row", "fields": [{"name": "path", "type": "string"},
                                                      {"name": "label", "type": "string"}]}


def build(listing, tmp_path) -> subprocess.CompletedProcess:
    (tmp_path / "in" / "cat").mkdir(parents=True)
    write_images(tmp_path / "in", {"cat": 1})
    return run_limited([sys.executable, "-m", "beam_jobs.cli", "build", "--listing", str(listing), "--input",
                        str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--num-cores", "1",
                        "--path-column", "path"], memory=BUILD_LIMIT, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("name, kind, head, where", [
    ("rows.csv.gz", "gzip", b"path,label\ncat/img0000.jpg,cat\n", "line 3"),
    ("rows.jsonl.bz2", "bz2", b'{"path": "cat/img0000.jpg", "label": "cat"}\n', "byte 44"),
])
def test_a_compressed_line_of_gigabytes_is_refused_within_a_memory_limit(tmp_path, name, kind, head, where):
    listing = tmp_path / name
    listing.write_bytes(compressed_line_bomb(head, BOMB, kind))
    proc = build(listing, tmp_path)
    assert_one_line_error(proc, f"listing {listing} {where}: a line longer than {MAX_LINE} bytes")
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.slow
def test_an_avro_block_inflating_a_thousandfold_is_refused_within_a_memory_limit(tmp_path):
    listing = tmp_path / "rows.avro"
    listing.write_bytes(avro_block_bomb(SCHEMA, [{"path": "cat/img0000.jpg", "label": "cat"}], 1 << 30))
    proc = build(listing, tmp_path)
    assert_one_line_error(proc, f"listing {listing}: the Avro block at byte", "inflates to more than 67108864 bytes")


def rows(data: bytes, name: str, fmt: str) -> list:
    with compressed.decompressed(io.BytesIO(data), name) as f:
        return list(read_rows(f, name, fmt))


def test_a_csv_row_whose_quoted_fields_run_over_many_lines_is_bounded():
    """Each field stays under csv's 128 KiB, the row does not: it is refused once past MAX_LINE bytes."""
    field = '"' + "x\n" * 1000 + '"'
    data = ("path,label\ncat/img0000.jpg," + ",".join([field] * (MAX_LINE // 2000 + 10)) + "\n").encode()
    with pytest.raises(ListingError, match=f"listing rows.csv line [0-9]+: a row longer than {MAX_LINE} bytes"):
        rows(data, "rows.csv", "csv")
    assert len(rows(b"path,label\n" + b"cat/img0000.jpg,cat\n" * 3, "rows.csv", "csv")) == 3


@pytest.mark.parametrize("name, data", [
    ("rows.csv.gz", gzip.compress(b"path,label\ncat/img0000.jpg,cat\n", mtime=0)[:-12] + b"\xff" * 12),
    ("rows.csv.bz2", bz2.compress(b"path,label\ncat/img0000.jpg,cat\n")[:20] + b"\x00" * 30),
    ("rows.csv.deflate", zlib.compress(b"path,label\ncat/img0000.jpg,cat\n")[:-6]),
], ids=["gz", "bz2", "deflate"])
def test_a_damaged_compressed_listing_is_an_error_naming_it(name, data):
    with pytest.raises(ListingError, match=f"listing {name}: its compressed bytes are damaged"):
        rows(data, name, "csv")


@pytest.mark.parametrize("name, pack", [
    ("rows.csv.gz", gzip.compress), ("rows.csv.bz2", bz2.compress), ("rows.csv.deflate", zlib.compress),
    ("rows.csv.xz", lambda d: __import__("lzma").compress(d)),
    ("rows.csv.zst", lambda d: __import__("zstandard").ZstdCompressor().compress(d)),
])
def test_every_compression_reads_as_before(name, pack):
    found = rows(pack(b"path,label\ncat/img0000.jpg,cat\n\ncat/2.jpg,cat\n"), name, "csv")
    assert [(r.origin, r.fields["path"]) for r in found] == [(f"{name} line 2", "cat/img0000.jpg"),
                                                             (f"{name} line 4", "cat/2.jpg")]
