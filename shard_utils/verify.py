"""Check a dataset against its manifest: presence, sizes, checksums, framing, and (deep) every record.

Returns problems as lines naming the shard and record, so a user can act on each.
"""
from __future__ import annotations

import io
from typing import Iterator

from . import schema, storage
from .manifest import Manifest, ManifestError, Shard, load
from .tfrecord import FramingError, iter_records


def verify(dataset: str, deep: bool = False) -> list[str]:
    """All problems found in a dataset (empty when it is intact)."""
    try:
        m = load(dataset)
    except ManifestError as exc:
        return [str(exc)]
    problems: list[str] = []
    for split_name, split in m.splits.items():
        for shard in split.shards:
            problems.extend(check_shard(m, shard, deep))
    return problems


def check_shard(m: Manifest, shard: Shard, deep: bool) -> list[str]:
    """Problems with one shard."""
    path = storage.join(m.location, shard.path)
    if not deep and storage.stores_checksums(path):
        return _check_stored_checksums(path, shard)  # no download: size and crc32c are metadata
    try:
        data = storage.read_bytes(path)
    except storage.NotFoundError:
        return [f"{shard.path}: missing"]
    except storage.StorageError as exc:
        return [f"{shard.path}: cannot read: {storage.problem(exc, path)}"]
    problems = []
    if len(data) != shard.num_bytes:
        problems.append(f"{shard.path}: size {len(data)} bytes, manifest says {shard.num_bytes}")
    digest = storage.Digest()
    digest.update(data)
    if digest.crc32c != shard.crc32c:
        problems.append(f"{shard.path}: crc32c {digest.crc32c}, manifest says {shard.crc32c}")
    if digest.sha256 != shard.sha256:
        problems.append(f"{shard.path}: sha256 differs from the manifest")
    count = 0
    try:
        for count, record in enumerate(iter_records(io.BytesIO(data)), start=1):
            if deep:
                problems.extend(f"{shard.path}: record {count - 1}: {p}" for p in check_record(m, record))
    except FramingError as exc:
        problems.append(f"{shard.path}: {exc}")
        return problems
    if count != shard.num_records:
        problems.append(f"{shard.path}: {count} records, manifest says {shard.num_records}")
    return problems


def check_record(m: Manifest, record: bytes) -> Iterator[str]:
    """Problems with one serialized record: schema, JPEG decoding, label range."""
    try:
        fields = schema.decode_example(record)
    except ValueError as exc:
        yield str(exc)
        return
    for key, spec in m.features.items():
        if key not in fields:
            yield f"feature {key!r} is missing"
            continue
        value = fields[key]
        if spec["dtype"] == "int64" and not isinstance(value, int) or spec["dtype"] == "string" and not isinstance(value, bytes):
            yield f"feature {key!r} is not a {spec['dtype']} scalar"
    label = fields.get(schema.LABEL)
    if isinstance(label, int) and not 0 <= label < len(m.labels):
        yield f"label {label} is outside 0..{len(m.labels) - 1}"
    encoded = fields.get(schema.IMAGE_ENCODED)
    if isinstance(encoded, bytes):
        from PIL import Image

        try:
            with Image.open(io.BytesIO(encoded)) as image:
                if image.format != "JPEG":
                    yield f"image is {image.format}, not JPEG"
                image.load()
        except Exception as exc:
            yield f"image does not decode: {storage.problem(exc)}"


def _check_stored_checksums(path: str, shard: Shard) -> list[str]:
    try:
        found = storage.checksum(path)
    except storage.StorageError as exc:
        return [f"{shard.path}: cannot read object metadata: {storage.problem(exc, path)}"]
    if found is None:
        return [f"{shard.path}: missing"]
    size, crc = found
    problems = []
    if size != shard.num_bytes:
        problems.append(f"{shard.path}: size {size} bytes, manifest says {shard.num_bytes}")
    if crc != shard.crc32c:
        problems.append(f"{shard.path}: crc32c {crc}, manifest says {shard.crc32c}")
    return problems
