"""A hostile-dataset generator: a small valid dataset built by the real job, then one named corruption of it.

Each corruption damages exactly one thing and, where the damage is to a file's bytes, rewrites the manifest's
checksums to match, so that only the defence under test can catch it. `outside` is a folder beside the dataset
that a corruption may point into (a symlink's target, a split named by an absolute path); tests check that it
is unchanged afterwards.

    base = build_valid(tmp / "valid")               # once per session: about two seconds
    ds = hostile_copy(base, tmp / "case", "shard_fifo", outside=tmp / "outside")
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

from shard_utils import storage
from shard_utils.format import tfrecord

TWO_TO_40 = 1 << 40
HUGE_BLOCK_ROWS = 20_000_000


def build_valid(folder: Path) -> Path:
    """A valid dataset in folder/ds: labels cat and dog, splits train and validation of two shards each, a
    record index per split and one rejected file. Returns the dataset folder."""
    from conftest import run_job, write_images

    images = folder / "images"
    write_images(images, {"cat": 4, "dog": 4}, size=(40, 30))
    (images / "dog" / "broken.jpg").write_bytes(b"not a JPEG")
    with contextlib.redirect_stdout(io.StringIO()):
        run_job(images, folder / "ds", "--splits", "train=0.5,validation=0.5", "--num-cores", "1",
                "--num-shards", "2")
    return folder / "ds"


def hostile_copy(valid: Path, folder: Path, corruption: str, outside: Path) -> Path:
    """A copy of the valid dataset at folder with the named corruption applied; returns folder."""
    shutil.copytree(valid, folder, symlinks=True)
    outside.mkdir(parents=True, exist_ok=True)
    CORRUPTIONS[corruption](folder, outside)
    return folder


# ---------------------------------------------------------------------------------------------- helpers


def edit_manifest(folder: Path, change: Callable[[dict], None]) -> None:
    """Load manifest.json, let `change` edit the object in place, write it back."""
    path = folder / "manifest.json"
    obj = json.loads(path.read_text(encoding="utf-8"))
    change(obj)
    path.write_text(json.dumps(obj, indent=2), encoding="utf-8")


def _entry(obj: dict, rel: str) -> dict:
    """The manifest entry (shard or index) of the file at rel."""
    for split in obj["splits"].values():
        for entry in [*split["shards"], split.get("index") or {}]:
            if entry.get("path") == rel:
                return entry
    raise KeyError(rel)


def rewrite(folder: Path, rel: str, data: bytes) -> None:
    """Replace a shard's or index's bytes and give the manifest their size and checksums."""
    (folder / rel).write_bytes(data)
    digest = storage.Digest()
    digest.update(data)

    def change(obj: dict) -> None:
        entry = _entry(obj, rel)
        entry.update(num_bytes=digest.size, crc32c=digest.crc32c, sha256=digest.sha256)
        for split in obj["splits"].values():
            split["num_bytes"] = sum(s["num_bytes"] for s in split["shards"])

    edit_manifest(folder, change)


def replace_with_fifo(folder: Path, rel: str) -> None:
    (folder / rel).unlink()
    os.mkfifo(folder / rel)


def replace_with_link(folder: Path, rel: str, target: str | Path) -> None:
    (folder / rel).unlink()
    os.symlink(target, folder / rel)


def first_shard(folder: Path, split: str = "train") -> str:
    obj = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    return obj["splits"][split]["shards"][0]["path"]


def index_of(folder: Path, split: str = "train") -> str:
    obj = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    return obj["splits"][split]["index"]["path"]


def rename_split(folder: Path, old: str, new: str) -> None:
    """Give a split another name in the manifest (its files keep theirs)."""
    def change(obj: dict) -> None:
        obj["splits"] = {(new if k == old else k): v for k, v in obj["splits"].items()}

    edit_manifest(folder, change)


def avro_header(folder: Path, rel: str) -> bytes:
    """The header (magic, metadata, sync marker) of an index file, and the sync marker at its end."""
    import fastavro

    with open(folder / rel, "rb") as f:
        fastavro.block_reader(f)
        return (folder / rel).read_bytes()[:f.tell()]


def huge_block(header: bytes, rows: int) -> bytes:
    """An index of one deflate block declaring `rows` minimal rows (all fields zero or empty): a few hundred
    kilobytes that decode to `rows` Python objects."""
    row = bytes(9)  # source_id "", shard 0, offset 0, length 0, label 0, labels [], sha256 "", height 0, width 0
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk = row * 100_000
    body = b"".join(packer.compress(chunk) for _ in range(rows // 100_000)) + packer.flush()
    return header + _long(rows) + _long(len(body)) + body + header[-16:]


def _long(value: int) -> bytes:
    """Avro's zig-zag varint."""
    value = (value << 1) ^ (value >> 63)
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def framed_with_length(length: int, data: bytes = b"") -> bytes:
    """A record header declaring `length` bytes, with a valid length CRC, followed by data."""
    length_bytes = struct.pack("<Q", length)
    return length_bytes + struct.pack("<I", tfrecord.masked_crc(length_bytes)) + data


def scan_bomb_jpeg(extra_scans: int, size: tuple[int, int] = (48, 32)) -> bytes:
    """A progressive JPEG whose last scan is repeated `extra_scans` times: decoders run each again (with a warning),
    so the decoding cost grows with the scan count while the file stays valid enough to decode."""
    from conftest import photo

    buffer = io.BytesIO()
    photo(*size, seed=3).save(buffer, "JPEG", progressive=True, quality=90)
    data = buffer.getvalue()
    last_scan = data[data.rfind(b"\xff\xda"):-2]  # up to the end-of-image marker
    return data[:-2] + last_scan * extra_scans + data[-2:]


def deep_png(path: Path, side: int = 10_000) -> Path:
    """A side x side 16-bit grayscale PNG of a horizontal ramp: about 200 KB at 10000 that decode to 2 bytes a pixel
    (the float64 conversion this once met took 2.6 GB)."""
    import numpy as np
    from PIL import Image

    ramp = (np.arange(side, dtype=np.uint32) * 6 % 65536).astype(np.uint16)
    Image.fromarray(np.broadcast_to(ramp, (side, side)).copy()).save(path)
    return path


def png_header(width: int, height: int, mode: int = 0, depth: int = 8) -> bytes:
    """A PNG whose header says width x height (colour type `mode`) and whose data is a few bytes of nothing:
    enough to be opened and judged, not decoded."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", width, height, depth, mode, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b"")


# ------------------------------------------------------------------------------------- listing bombs

BOMB_MEMBER = 64 << 20  # bytes of 'a' one compressed member holds


def compressed_line_bomb(head: bytes, size: int, kind: str) -> bytes:
    """A listing compressed as `kind` (gzip, bz2): `head` (header and rows), then one line of `size` bytes of 'a'
    without a line break, as concatenated members (every reader takes them) of a few kilobytes each."""
    import bz2
    import gzip

    compress = {"gzip": lambda data: gzip.compress(data, 9), "bz2": bz2.compress}[kind]
    member = compress(b"a" * BOMB_MEMBER)
    return compress(head) + member * (size // BOMB_MEMBER)


def avro_block_bomb(schema: dict, rows: list[dict], inflated: int) -> bytes:
    """An Avro listing (deflate) of `rows`, then a block declaring one row whose deflate data inflates to
    `inflated` zero bytes (about a thousandth of that on disk)."""
    import fastavro

    buffer = io.BytesIO()
    fastavro.writer(buffer, schema, rows, codec="deflate")
    data = buffer.getvalue()
    sync = data[-16:]
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk = bytes(BOMB_MEMBER)
    body = b"".join(packer.compress(chunk) for _ in range(inflated // BOMB_MEMBER)) + packer.flush()
    return data + _long(1) + _long(len(body)) + body + sync


# ---------------------------------------------------------------------------------------------- corruptions


def _split_absolute(folder: Path, outside: Path) -> None:
    rename_split(folder, "train", str(outside / "victim"))


def _split_climbing(folder: Path, outside: Path) -> None:
    rename_split(folder, "train", "../../victim")


def _split_control(folder: Path, outside: Path) -> None:
    rename_split(folder, "train", "tra\nin\x00")


def _split_long(folder: Path, outside: Path) -> None:
    rename_split(folder, "train", "t" * 300)


def _fifo(kind: str) -> Callable[[Path, Path], None]:
    def corrupt(folder: Path, outside: Path) -> None:
        rel = {"shard": first_shard, "index": index_of}[kind](folder) if kind in ("shard", "index") else {
            "manifest": "manifest.json", "rejected": "rejected.jsonl"}[kind]
        replace_with_fifo(folder, rel)
    return corrupt


def _dev_zero(kind: str) -> Callable[[Path, Path], None]:
    def corrupt(folder: Path, outside: Path) -> None:
        rel = {"shard": first_shard, "index": index_of}[kind](folder) if kind in ("shard", "index") else "manifest.json"
        replace_with_link(folder, rel, "/dev/zero")
    return corrupt


def _index_huge_block(folder: Path, outside: Path) -> None:
    rel = index_of(folder)
    rewrite(folder, rel, huge_block(avro_header(folder, rel), HUGE_BLOCK_ROWS))


def _index_not_avro(folder: Path, outside: Path) -> None:
    rewrite(folder, index_of(folder), b"this is not an Avro file\n" * 40)


def _record_length_2_40(folder: Path, outside: Path) -> None:
    rel = first_shard(folder)
    data = (folder / rel).read_bytes()
    rewrite(folder, rel, framed_with_length(TWO_TO_40, data[tfrecord.HEADER:]))


def _image_size_huge(folder: Path, outside: Path) -> None:
    edit_manifest(folder, lambda obj: obj.update(image_size=[100000, 100000]))


def _image_pixels_huge(folder: Path, outside: Path) -> None:
    edit_manifest(folder, lambda obj: obj.update(image_size=[20000, 20000]))  # each side fine, 400 megapixels


def _shard_listed_twice(folder: Path, outside: Path) -> None:
    edit_manifest(folder, lambda obj: _list_again(obj, "train", "train", 1))


def _shard_shared_between_splits(folder: Path, outside: Path) -> None:
    edit_manifest(folder, lambda obj: _list_again(obj, "train", "validation", 0))


def _list_again(obj: dict, source: str, split: str, place: int) -> None:
    """List shard 0 of split `source` again as shard `place` of `split`, the totals and accounting made to add up
    (the split's index, which would no longer match, is dropped)."""
    target = obj["splits"][split]
    target["shards"][place] = dict(obj["splits"][source]["shards"][0])
    target["num_records"] = sum(s["num_records"] for s in target["shards"])
    target["num_bytes"] = sum(s["num_bytes"] for s in target["shards"])
    target.pop("index")
    _close_accounting(obj)


def _close_accounting(obj: dict) -> None:
    records = sum(s["num_records"] for s in obj["splits"].values())
    obj["files_seen"] = records + obj["rejected"]["count"] + obj["skipped"]["count"]


def _shard_link_outside(folder: Path, outside: Path) -> None:
    rel = first_shard(folder)
    target = outside / "copied.tfrecord"
    shutil.copyfile(folder / rel, target)  # the same bytes: every checksum still matches
    replace_with_link(folder, rel, target)


def _rejected_garbage(folder: Path, outside: Path) -> None:
    (folder / "rejected.jsonl").write_text("garbage that is not JSON\n", encoding="utf-8")


def _class_counts(value: Callable[[int], int]) -> Callable[[Path, Path], None]:
    def corrupt(folder: Path, outside: Path) -> None:
        def change(obj: dict) -> None:
            split = obj["splits"]["train"]
            name = next(iter(split["class_counts"]))
            split["class_counts"][name] = value(split["num_records"])

        edit_manifest(folder, change)
    return corrupt


def _feature_shape_huge(folder: Path, outside: Path) -> None:
    huge = {"dtype": "float32", "shape": [100000, 100000]}
    edit_manifest(folder, lambda obj: obj["features"].update({"extra/x": huge}))


def _shard_wrong_size(folder: Path, outside: Path) -> None:
    rel = first_shard(folder)
    with open(folder / rel, "ab") as f:
        f.write(b"\0" * 7)  # the manifest still says the old size


def _shard_swapped(folder: Path, outside: Path) -> None:
    """Other bytes of the same size in place of the first shard (one byte of its first record's data changed),
    the manifest unchanged: only a check that reads the shard (or a stored CRC32C) can tell."""
    rel = first_shard(folder)
    data = bytearray((folder / rel).read_bytes())
    data[tfrecord.HEADER + 4] ^= 0xFF
    (folder / rel).write_bytes(bytes(data))


def _records_beyond_bytes(folder: Path, outside: Path) -> None:
    def change(obj: dict) -> None:
        split = obj["splits"]["train"]
        split["shards"][0]["num_records"] = 20_000_000
        split["num_records"] = sum(s["num_records"] for s in split["shards"])
        split["index"]["num_rows"] = split["num_records"]
        _close_accounting(obj)

    edit_manifest(folder, change)


MILLION = 1_000_000


def _labels_million(folder: Path, outside: Path) -> None:
    """A million more labels (no record has them): a 17 MB manifest, under the 64 MB a manifest may be."""
    edit_manifest(folder, lambda obj: obj["labels"].extend(f"zz{i:07d}" for i in range(MILLION)))


def _split_generation_name(folder: Path, outside: Path) -> None:
    """The validation split named as generation 1 of train is stored (`train-g001`): an append would collide."""
    rename_split(folder, "validation", "train-g001")


def _options_nested(folder: Path, outside: Path) -> None:
    deep: dict = {}
    for _ in range(900):
        deep = {"a": deep}
    edit_manifest(folder, lambda obj: obj["options"].update(deep=deep))


def _options_shard_mb_list(folder: Path, outside: Path) -> None:
    edit_manifest(folder, lambda obj: obj["options"].update(target_shard_mb=[1]))


def _index_rows_disagree(folder: Path, outside: Path) -> None:
    """Every train row's label moved on by one and its source id prefixed; the index's size and checksums in the
    manifest made to match, so only comparing rows with records can tell."""
    import dataclasses

    from index_helpers import rewrite_index

    labels = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))["labels"]

    def shifted(rows: list) -> list:
        moved = []
        for row in rows:
            ids = tuple((i + 1) % len(labels) for i in row.labels)
            moved.append(dataclasses.replace(row, source_id="x/" + row.source_id, labels=ids, label=ids[0]))
        return moved

    rewrite_index(folder, "train", shifted)


ROW_PAST_END = 10 * 10**6  # bytes past its shard's end an index row points at


def _index_row_past_end(folder: Path, outside: Path) -> None:
    import dataclasses

    from index_helpers import rewrite_index

    def past(rows: list) -> list:
        last = max(i for i, row in enumerate(rows) if row.shard == 0)
        rows[last] = dataclasses.replace(rows[last], offset=rows[last].offset + ROW_PAST_END)
        return rows

    rewrite_index(folder, "train", past)


SPARSE_SHARD = 6 << 30
SPARSE_INDEX = 2 << 30


def _sparse(kind: str, size: int) -> Callable[[Path, Path], None]:
    """The file grown to `size` bytes of holes (nothing written): the manifest still says its own size."""
    def corrupt(folder: Path, outside: Path) -> None:
        os.truncate(folder / {"shard": first_shard, "index": index_of}[kind](folder), size)
    return corrupt


CORRUPTIONS: dict[str, Callable[[Path, Path], None]] = {
    "split_absolute": _split_absolute,
    "split_climbing": _split_climbing,
    "split_control": _split_control,
    "split_long": _split_long,
    "shard_fifo": _fifo("shard"),
    "index_fifo": _fifo("index"),
    "manifest_fifo": _fifo("manifest"),
    "rejected_fifo": _fifo("rejected"),
    "shard_dev_zero": _dev_zero("shard"),
    "index_dev_zero": _dev_zero("index"),
    "manifest_dev_zero": _dev_zero("manifest"),
    "index_huge_block": _index_huge_block,
    "index_not_avro": _index_not_avro,
    "record_length_2_40": _record_length_2_40,
    "image_size_huge": _image_size_huge,
    "image_pixels_huge": _image_pixels_huge,
    "feature_shape_huge": _feature_shape_huge,
    "shard_listed_twice": _shard_listed_twice,
    "shard_shared_between_splits": _shard_shared_between_splits,
    "shard_link_outside": _shard_link_outside,
    "rejected_garbage": _rejected_garbage,
    "class_counts_negative": _class_counts(lambda n: -5),
    "class_counts_impossible": _class_counts(lambda n: n + 7),
    "records_beyond_bytes": _records_beyond_bytes,
    "shard_wrong_size": _shard_wrong_size,
    "shard_swapped": _shard_swapped,
    "labels_million": _labels_million,
    "split_generation_name": _split_generation_name,


    "options_nested": _options_nested,
    "options_shard_mb_list": _options_shard_mb_list,
    "index_rows_disagree": _index_rows_disagree,
    "index_row_past_end": _index_row_past_end,
    "shard_sparse_6g": _sparse("shard", SPARSE_SHARD),
    "index_sparse_2g": _sparse("index", SPARSE_INDEX),
}
