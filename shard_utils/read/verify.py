"""Check a dataset against its manifest: presence, sizes, checksums, framing, and (deep) every record.

Returns problems as lines naming the shard and record, so a user can act on each.
"""
from __future__ import annotations

import contextlib
import io
import math
import os
from collections.abc import Iterator

from shard_utils import storage
from shard_utils.format import array_record, croissant, schema
from shard_utils.format.filenames import CROISSANT_NAME
from shard_utils.format.generations import DigestingReader
from shard_utils.format.index import (
    MAX_RECORD_BYTES,
    NO_LABEL,
    IndexFormatError,
    IndexRow,
    check_header,
    check_place,
    field_name,
    read_index,
    record_identity,
    row_disagreement,
    unframe,
)
from shard_utils.format.manifest import (
    MAX_REPORT_LINE,
    IndexFile,
    Manifest,
    ManifestError,
    Shard,
    bounded_lines,
    iter_report_entries,
    load,
)
from shard_utils.format.shard_formats import ARRAY_RECORD, TFRECORD, ShardFormat, get
from shard_utils.format.tfrecord import FramingError, iter_records
from shard_utils.quality import findings
from shard_utils.read.stated import digest_problems, drain, size_problem, stored_problems

__all__ = [
    "verify", "CHEAP_CHECK_THREADS", "check_cheap", "check_reports", "check_quality", "check_croissant",
    "IN_MEMORY_SHARD_BYTES", "check_shard", "check_unindexed_shard", "check_array_record_shard", "check_record",
    "MAX_INDEX_PROBLEMS",
    "check_indexes", "check_index"
]


def verify(dataset: str, deep: bool = False) -> list[str]:
    """All problems found in a dataset (empty when it is intact). With `deep`, a dataset with ArrayRecord shards
    needs the array_record package: MissingExtra before any check when it is not installed."""
    try:
        m = load(dataset)
    except ManifestError as exc:
        return [str(exc)]
    for shard_format in map(get, m.formats) if deep else ():  # before any work: a deep check reads every record
        shard_format.check_installed(f"verify --deep, which reads the {shard_format.title} shards' records (plain "
                                     "verify does not),")
    problems: list[str] = []
    for split_name, split in m.splits.items():
        if not m.first_format.indexed:  # ArrayRecord shards only: no index, no twins
            problems.extend(p for shard in split.shards for p in check_unindexed_shard(m, shard, deep, m.first_format))
            continue
        shard_problems: dict[int, list[str]] = {}

        def read_and_check(i: int, split=split, found=shard_problems) -> bytes | str | None:
            """Read a shard once for both checks: its own, and its index rows against its records (a shard too
            large to hold is streamed for its own, and its records read by range for its rows)."""
            data = _read_shard(m, split.shards[i])
            found[i] = check_shard(m, split.shards[i], deep, data=data)
            return None if isinstance(data, list) else data

        index_problems = check_index(m, split_name, deep, reader=read_and_check)
        for i, shard in enumerate(split.shards):
            problems.extend(shard_problems[i] if i in shard_problems else check_shard(m, shard, deep))
        for shard, twin in zip(split.shards, split.array_record_shards or (), strict=False):
            problems.extend(check_unindexed_shard(m, twin, deep, ARRAY_RECORD, tfrecord=shard))
        problems.extend(index_problems)
    return _links_outside(m) + problems + check_reports(m) + check_quality(m) + check_croissant(m)


CHEAP_CHECK_THREADS = 32  # files looked at once on gs:// (one metadata request each)


def check_cheap(m: Manifest) -> list[str]:
    """The part of verify that reads no shard, for a tool about to build on a dataset: every shard (and
    ArrayRecord twin) and index a regular file of its manifest size (on gs://, with its manifest CRC32C, which
    the object's metadata gives for free), no file linked outside the folder, every index's header that of a
    tpu-shards index. It costs one stat (or metadata request) per file, and one index header per split."""
    from concurrent.futures import ThreadPoolExecutor

    named: list[Shard | IndexFile] = [s for split in m.splits.values()
                                      for s in split.shards + (split.array_record_shards or [])]
    named += [split.index for split in m.splits.values() if split.index is not None]
    threads = CHEAP_CHECK_THREADS if storage.is_gcs(m.location) else 1
    with ThreadPoolExecutor(threads) as pool:
        found = list(pool.map(lambda entry: _stated_file(m, entry), named))
    problems = [p for file_problems in found for p in file_problems] + _links_outside(m)
    for split in m.splits.values():
        if split.index is not None and not any(p.startswith(f"{split.index.path}:") for p in problems):
            problems += _index_header(m, split.index)
    return problems


def _stated_file(m: Manifest, entry: Shard | IndexFile) -> list[str]:
    """A shard or index that is not a regular file of its manifest size (and CRC32C where storage keeps it)."""
    path = storage.join(m.location, entry.path)
    if storage.stores_checksums(path):
        return stored_problems(path, entry)
    problem = size_problem(path, entry)
    return [problem] if problem else []


def _index_header(m: Manifest, entry: IndexFile) -> list[str]:
    path = storage.join(m.location, entry.path)
    try:
        with storage.open_read(path) as f:
            check_header(f)
    except IndexFormatError as exc:
        return [f"{entry.path}: {exc}"]
    except storage.StorageError as exc:
        return [f"{entry.path}: cannot read: {storage.problem(exc, path)}"]
    return []


def _links_outside(m: Manifest) -> list[str]:
    """Files the manifest names that are symbolic links leading out of the dataset folder (local datasets): the
    dataset would not be whole where it is copied, and its content is not where it seems to be."""
    if storage.is_gcs(m.location):
        return []
    root = os.path.realpath(m.location)
    named = [s.path for split in m.splits.values() for s in split.shards]
    named += [s.path for split in m.splits.values() for s in split.array_record_shards or ()]
    named += [split.index.path for split in m.splits.values() if split.index]
    named += [part["path"] for part in (m.rejected, m.skipped, m.quality or {}) if part.get("path")]
    problems = []
    for rel in named:
        target = os.path.realpath(os.path.join(root, rel))
        if os.path.commonpath([root, target]) != root:
            problems.append(f"{rel}: a symbolic link leading outside the dataset folder (to {target})")
    return problems


def check_reports(m: Manifest) -> list[str]:
    """Problems with the rejected and skipped reports: each line an entry, and as many rejected files as the
    manifest counts (the skipped report lists only media-like files, so its count is not compared)."""
    problems = []
    for what, part in (("rejected", m.rejected), ("skipped", m.skipped)):
        if not part.get("path"):
            continue
        path = storage.join(m.location, part["path"])
        try:
            with storage.open_read(path) as f:
                entries = sum(1 for _ in iter_report_entries(f, part["path"]))
        except storage.NotFoundError:
            if part.get("count"):
                problems.append(f"{part['path']}: missing")
            continue
        except storage.StorageError as exc:
            problems.append(f"{part['path']}: cannot read: {storage.problem(exc, path)}")
            continue
        except ManifestError as exc:
            problems.append(str(exc))
            continue
        if what == "rejected" and entries != part.get("count", 0):
            problems.append(f"{part['path']}: {entries} rejected files listed, the manifest says "
                            f"{part.get('count', 0)}")
    return problems


def check_quality(m: Manifest) -> list[str]:
    """Problems with quality.jsonl: each line a finding, and as many of each kind as the manifest counts."""
    part = m.quality or {}
    if not part.get("path"):
        return []
    path = storage.join(m.location, part["path"])
    listed = dict.fromkeys(findings.KINDS, 0)  # findings per kind, counted as read (a report may be large)
    try:
        with storage.open_read(path) as f:
            for number, line in enumerate(bounded_lines(f), start=1):
                if line is None:
                    return [f"{part['path']} line {number} is longer than {MAX_REPORT_LINE} bytes; not a finding"]
                if not line.strip():
                    continue
                try:
                    listed[findings.from_line(line.decode("utf-8", "replace"))["kind"]] += 1
                except findings.BadFinding as exc:
                    return [f"{part['path']} line {number} is not a finding: {exc}"]
    except storage.NotFoundError:
        return [f"{part['path']}: missing"]
    except storage.StorageError as exc:
        return [f"{part['path']}: cannot read: {storage.problem(exc, path)}"]
    problems = []
    if sum(listed.values()) != part.get("count", 0):
        problems.append(f"{part['path']}: {sum(listed.values())} findings listed, the manifest says "
                        f"{part.get('count', 0)}")
    counted = {kind: n for kind, n in listed.items() if n}
    stated = {kind: n for kind, n in part.get("by_kind", {}).items() if n}
    if counted != stated:
        problems.append(f"{part['path']}: findings by kind {counted} differ from the manifest's {stated}")
    return problems


def check_croissant(m: Manifest) -> list[str]:
    """How croissant.json differs from the manifest (its files, checksums and sizes); none when it is absent (a
    dataset built before it existed: `tpu-shards inspect --write-croissant` writes it)."""
    path = storage.join(m.location, CROISSANT_NAME)
    try:
        data = storage.read_bytes(path, limit=croissant.MAX_CROISSANT_BYTES + 1)
    except storage.NotFoundError:
        return []
    except storage.StorageError as exc:
        return [f"{CROISSANT_NAME}: cannot read: {storage.problem(exc, path)}"]
    return croissant.file_problems(data, m)


IN_MEMORY_SHARD_BYTES = 256 * 2**20  # a shard up to this size is read once for its own and its rows' checks


def _read_shard(m: Manifest, shard: Shard) -> bytes | str | list[str]:
    """A shard's bytes; its full path when it is larger than IN_MEMORY_SHARD_BYTES (to be streamed); or the problem
    line saying why it is not read (missing, not a regular file, or another size than the manifest's, which stat
    or the object's metadata tells before any read)."""
    path = storage.join(m.location, shard.path)
    problem = size_problem(path, shard)
    if problem:
        return [problem]
    if shard.num_bytes > IN_MEMORY_SHARD_BYTES:
        return path
    try:
        return storage.read_bytes(path, limit=shard.num_bytes + 1)
    except storage.StorageError as exc:
        return [f"{shard.path}: cannot read: {storage.problem(exc, path)}"]


def check_shard(m: Manifest, shard: Shard, deep: bool, data: bytes | str | list[str] | None = None) -> list[str]:
    """Problems with one shard (its bytes, or its path to stream, may be given, as `_read_shard` gives them)."""
    path = storage.join(m.location, shard.path)
    if not deep and storage.stores_checksums(path):
        return stored_problems(path, shard)  # no download: size and crc32c are metadata
    data = _read_shard(m, shard) if data is None else data
    if isinstance(data, list):
        return data
    try:
        with contextlib.nullcontext(io.BytesIO(data)) if isinstance(data, bytes) else storage.open_read(data) as f:
            reader = DigestingReader(f)
            found = _record_problems(m, shard, deep, reader)
            return digest_problems(drain(reader), shard) + found
    except storage.StorageError as exc:
        return [f"{shard.path}: cannot read: {storage.problem(exc, path)}"]


def _record_problems(m: Manifest, shard: Shard, deep: bool, stream: DigestingReader) -> list[str]:
    """A shard's framing and record count (with `deep`, every record's problems), read one record at a time."""
    problems: list[str] = []
    count = 0
    try:
        limit = min(MAX_RECORD_BYTES, shard.num_bytes)
        for count, record in enumerate(iter_records(stream, max_record_bytes=limit), start=1):  # type: ignore[arg-type]
            if deep:
                problems.extend(f"{shard.path}: record {count - 1}: {p}" for p in check_record(m, record))
    except FramingError as exc:
        return problems + [f"{shard.path}: {exc}"]
    if count != shard.num_records:
        problems.append(f"{shard.path}: {count} records, manifest says {shard.num_records}")
    return problems


def check_unindexed_shard(m: Manifest, shard: Shard, deep: bool, shard_format: ShardFormat,
                          tfrecord: Shard | None = None) -> list[str]:
    """Problems with one shard no index describes (an ArrayRecord shard or twin): size and checksums (object
    metadata on gs:// unless `deep`), read as bytes, so without the format's package; with `deep`, every record
    read with it and checked, its count, and each record equal to its TFRecord twin's when there is one."""
    path = storage.join(m.location, shard.path)
    if not deep and storage.stores_checksums(path):
        return stored_problems(path, shard)
    try:
        if not deep:
            return _check_file(path, shard)
        with array_record.local_copy(path) as local:
            problems = _check_file(local, shard)
            try:
                return problems + _check_records(m, local, shard, shard_format, tfrecord)
            except shard_format.error as exc:
                return problems + [str(exc)]
    except storage.NotFoundError:
        return [f"{shard.path}: missing"]
    except storage.StorageError as exc:
        return [f"{shard.path}: cannot read: {storage.problem(exc, path)}"]
    except shard_format.error as exc:
        return [str(exc)]


def check_array_record_shard(m: Manifest, shard: Shard, deep: bool, tfrecord: Shard | None = None) -> list[str]:
    """`check_unindexed_shard` of an ArrayRecord shard (the name the stable path `shard_utils.verify` exports)."""
    return check_unindexed_shard(m, shard, deep, ARRAY_RECORD, tfrecord)


def _check_file(path: str, shard: Shard) -> list[str]:
    """Size, CRC32C and SHA-256 of a shard's bytes against its manifest entry."""
    digest = storage.Digest()
    with storage.open_read(path) as f:
        while block := f.read(storage.READ_CHUNK_SIZE):
            digest.update(block)
    return digest_problems(digest, shard)


def _check_records(m: Manifest, local: str, shard: Shard, shard_format: ShardFormat,
                   tfrecord: Shard | None) -> list[str]:
    """Every record of a shard checked, and compared with its TFRecord twin's records in order."""
    problems: list[str] = []
    twin = _twin_records(m, tfrecord)
    other = tfrecord.path if tfrecord is not None else ""
    count = 0
    for count, record in enumerate(shard_format.read(local, shard.path), start=1):
        problems.extend(f"{shard.path}: record {count - 1}: {p}" for p in check_record(m, record))
        if twin is not None and next(twin, None) != record:
            problems.append(f"{shard.path}: record {count - 1} differs from record {count - 1} of {other}")
            twin = None  # one line per shard: the twins disagree from here on
    if count != shard.num_records:
        problems.append(f"{shard.path}: {count} records, manifest says {shard.num_records}")
    if twin is not None and next(twin, None) is not None:
        problems.append(f"{shard.path}: {other} holds more records than its {shard_format.title} twin")
    return problems


def _twin_records(m: Manifest, tfrecord: Shard | None) -> Iterator[bytes] | None:
    """The TFRecord twin's records in order (None without a twin, or when it cannot be read: its own check says
    why)."""
    if tfrecord is None:
        return None
    path = storage.join(m.location, tfrecord.path)

    def records() -> Iterator[bytes]:
        try:
            yield from TFRECORD.read(path)
        except (TFRECORD.error, storage.StorageError):
            return

    return records()


_TYPES = {"int64": int, "float32": float, "string": bytes}


def check_record(m: Manifest, record: bytes) -> Iterator[str]:
    """Problems with one serialized record: every declared feature present with its type and count, every
    JPEG (image or clip frame) decoding, labels in range (or NO_LABEL in a dataset with unlabeled records)."""
    try:
        fields = schema.decode_lists(record)
    except ValueError as exc:
        yield str(exc)
        return
    for key, spec in m.features.items():
        if key not in fields:
            yield f"feature {key!r} is missing"
            continue
        values, shape = fields[key], spec["shape"]
        if not all(isinstance(v, _TYPES[spec["dtype"]]) for v in values):
            yield f"feature {key!r} is not {spec['dtype']}"
        if shape == [schema.VARIABLE]:
            if len(values) > spec.get("max_length", 0):
                yield f"feature {key!r} holds {len(values)} values, more than its max_length {spec.get('max_length')}"
        elif len(values) != math.prod(shape):
            yield f"feature {key!r} holds {len(values)} values, its shape {shape} needs {math.prod(shape)}"
    unlabeled = any(s.unlabeled for s in m.splits.values())
    for label in fields.get(schema.LABEL, []):
        if unlabeled and label == schema.NO_LABEL + m.label_offset:
            continue
        if isinstance(label, int) and not 0 <= label - m.label_offset < len(m.labels):
            yield (f"label {label} is outside {m.label_offset}..{m.label_offset + len(m.labels) - 1}"
                   if m.label_offset else f"label {label} is outside 0..{len(m.labels) - 1}")
    for i, encoded in enumerate(fields.get(m.media_key, [])):
        what = "image" if m.media == "image" else f"frame {i}"
        if isinstance(encoded, bytes):
            yield from (f"{what} {p}" for p in _jpeg_problems(encoded))


def _jpeg_problems(encoded: bytes) -> Iterator[str]:
    from PIL import Image

    from shard_utils.format.jpeg import TooManyScans, jpeg_primary_end

    try:
        jpeg_primary_end(encoded)
    except TooManyScans as exc:  # not decoded: that is the cost a reader would pay on every epoch
        yield f"is too complex to decode: JPEG {exc}"
        return
    except ValueError:
        pass  # the decoder says what is wrong
    try:
        with Image.open(io.BytesIO(encoded)) as image:
            if image.format != "JPEG":
                yield f"is {image.format}, not JPEG"
            image.load()
    except Exception as exc:  # noqa: BLE001 - any decoder failure is a finding, not a crash
        yield f"does not decode: {storage.problem(exc)}"


# ----------------------------------------------------------------------------- the record index

MAX_INDEX_PROBLEMS = 20  # per index: a stale index would otherwise give a line per row


def check_indexes(m: Manifest, deep: bool = False) -> list[str]:
    """Problems with every split's index (splits without one have none to check)."""
    return [p for name in m.splits for p in check_index(m, name, deep)]


def check_index(m: Manifest, split_name: str, deep: bool = False, reader=None) -> list[str]:
    """Problems with one split's index: the file against the manifest, then every row against its shard.

    Rows must be in shard order and contiguous (each shard's rows start at 0, each follows the last, the
    last ends at the shard's size), as many per shard as the manifest says, and each must frame a real
    record (both CRCs). That last check reads the shards, except on gs:// without `deep`. With `deep`,
    each row's fields are compared with its record's.
    """
    entry = m.split(split_name).index
    if entry is None:
        return []
    path = storage.join(m.location, entry.path)
    problem = size_problem(path, entry)
    if problem:
        return [problem]
    rows = _IndexRows(m, split_name, read_shards=deep or not storage.stores_checksums(path), deep=deep,
                      reader=reader)
    try:
        with storage.open_read(path) as f:
            stream = DigestingReader(f)
            try:
                for row in read_index(stream, max_rows=entry.num_rows):  # type: ignore[arg-type]
                    rows.check(row)
            except IndexFormatError as exc:
                rows.problem(f"{entry.path}: {exc}")
            problems = digest_problems(drain(stream), entry)
    except storage.StorageError as exc:
        return [f"{entry.path}: cannot read: {storage.problem(exc, path)}"]
    rows.finish()
    problems.extend(rows.problems)
    if rows.found > len(rows.problems):
        problems.append(f"{entry.path}: ... and {rows.found - len(rows.problems)} more problems")
    return problems


class _IndexRows:
    """Checks index rows one at a time in file order, holding one shard's bytes at most."""

    def __init__(self, m: Manifest, split_name: str, read_shards: bool, deep: bool, reader=None):
        self.m, self.split, self.read_shards, self.deep = m, m.split(split_name), read_shards, deep
        self.reader = reader  # shard index -> bytes (or None when unreadable), when the caller reads shards
        assert self.split.index is not None  # a split without an index is not checked row by row
        self.where = self.split.index.path
        self.problems: list[str] = []
        self.found = 0  # problems found, kept or not
        self.row = 0
        self.shard = -1  # the shard of the previous row
        self.end = 0  # where the previous row's record ends
        self.counts = [0] * len(self.split.shards)
        self.unlabeled = 0  # rows without a label
        self.data: bytes | str | None = None  # the current shard's bytes, or its path to read records by range
        self.fields = {field_name(k[len(schema.EXTRA_PREFIX):]): (k, v)
                       for k, v in m.features.items() if k.startswith(schema.EXTRA_PREFIX)}

    def problem(self, text: str) -> None:
        self.found += 1
        if len(self.problems) < MAX_INDEX_PROBLEMS:
            self.problems.append(text)

    def check(self, row: IndexRow) -> None:
        i, self.row = self.row, self.row + 1
        where = f"{self.where}: row {i}"
        shards = self.split.shards
        if not 0 <= row.shard < len(shards):
            return self.problem(f"{where}: shard {row.shard} is not one of the split's {len(shards)} shards")
        if row.shard < self.shard:
            self.counts[row.shard] += 1
            return self.problem(f"{where}: shard {row.shard} after shard {self.shard}; rows are not in shard order")
        if row.shard > self.shard:
            self._close_shard()
            self.shard, self.end = row.shard, 0
            self._load(row.shard)
        shard = shards[row.shard]
        self.counts[row.shard] += 1
        self.unlabeled += not row.labels
        if row.offset != self.end:
            self.problem(f"{where}: offset {row.offset}, but the previous record ends at {self.end} "
                         f"in {shard.path}; rows are not contiguous")
        self.end = row.offset + row.length
        bad = check_place(row.offset, row.length, shard.num_bytes)
        if bad:
            return self.problem(f"{where}: {bad} ({shard.path})")
        if self.data is None:
            return
        try:
            record = unframe(self.data[row.offset:row.offset + row.length] if isinstance(self.data, bytes)
                             else storage.read_range(self.data, row.offset, row.length))
        except storage.StorageError as exc:
            return self.problem(f"{where}: cannot read its record in {shard.path}: {storage.problem(exc)}")
        except FramingError as exc:
            return self.problem(f"{where}: no record at {shard.path} bytes {row.offset}..{self.end}: {exc}")
        if self.deep:
            for p in self._compare(row, record):
                self.problem(f"{where}: {p}")
        else:
            try:
                disagrees = row_disagreement(row, *record_identity(record, self.m.label_offset))
            except ValueError:
                return  # not an Example: --deep says so; the row frames it, which is all plain verify asks
            if disagrees:
                self.problem(f"{where}: {shard.path} record {self.counts[row.shard] - 1}: {disagrees}")

    def _load(self, shard: int) -> None:
        self.data = None
        if self.read_shards and self.reader is not None:
            self.data = self.reader(shard)
            if self.data is None:
                self.problem(f"{self.where}: rows of {self.split.shards[shard].path} not checked against "
                             "records: the shard is not read (its own line says why)")
        elif self.read_shards:
            data = _read_shard(self.m, self.split.shards[shard])
            if isinstance(data, list):
                self.problem(f"{self.where}: rows of {self.split.shards[shard].path} not checked against "
                             f"records: {data[0]}")
            else:
                self.data = data

    def _close_shard(self) -> None:
        if self.shard >= 0 and self.end != self.split.shards[self.shard].num_bytes:
            shard = self.split.shards[self.shard]
            self.problem(f"{self.where}: the rows of {shard.path} end at byte {self.end}, the shard has "
                         f"{shard.num_bytes}")

    def finish(self) -> None:
        self._close_shard()
        if self.unlabeled != self.split.unlabeled:
            self.problem(f"{self.where}: {self.unlabeled} rows have no label, the manifest says {self.split.unlabeled} "
                         "unlabeled records")
        for shard, count in zip(self.split.shards, self.counts, strict=True):
            if count != shard.num_records:
                self.problem(f"{self.where}: {count} rows for {shard.path}, manifest says {shard.num_records} records")

    def _compare(self, row: IndexRow, record: bytes) -> Iterator[str]:
        try:
            f = schema.decode_lists(record)
        except ValueError as exc:
            yield str(exc)
            return
        labels = schema.label_ids_of(f.get(schema.LABEL, []), self.m.label_offset)
        expect = {"source_id": b"".join(f.get(schema.SOURCE_ID, [])).decode("utf-8", "replace"),
                  "sha256": b"".join(f.get(schema.SHA256, [])).decode("utf-8", "replace"),
                  "height": (f.get(schema.IMAGE_HEIGHT) or [None])[0],
                  "width": (f.get(schema.IMAGE_WIDTH) or [None])[0],
                  "labels": labels, "label": labels[0] if labels else NO_LABEL}
        for name, value in expect.items():
            if getattr(row, name) != value:
                yield f"{name} is {getattr(row, name)!r}, the record has {value!r}"
        extra = row.extra or {}
        for fname, (key, spec) in self.fields.items():
            values = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in f.get(key, [])]
            want = values if spec.get("shape") == [schema.VARIABLE] else (values[0] if values else None)
            if extra.get(fname) != want:
                yield f"extra {fname} is {extra.get(fname)!r}, the record's {key} has {want!r}"
