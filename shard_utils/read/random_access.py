"""Random access to a split's records through its index: a Grain `RandomAccessDataSource`, no TensorFlow.

`RandomAccessSource(dataset, split)[i]` is record i of the split in shard order, as serialized
`tf.train.Example` bytes: one ranged read of the framed record (local file or gs:// object), both framing
CRCs checked. Index rows are untrusted: each must lie inside its shard (the manifest's sizes) and have a sane
length, or the index is refused when loaded, before any read. The index lives in memory as three int64
arrays per split (shard start rows, offsets, lengths), never one Python object per row.

    import grain
    src = RandomAccessSource("gs://bucket/ds", "train")
    ds = (grain.MapDataset.source(src)[host_slice(len(src), jax.process_index(), jax.process_count())]
          .seed(0).shuffle().map(Decoder.for_source(src)).batch(256))
"""
from __future__ import annotations

import io
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shard_utils import storage
from shard_utils.errors import TpuShardsError
from shard_utils.extras import require_all
from shard_utils.format import schema
from shard_utils.format.generations import DigestingReader
from shard_utils.format.index import MAX_RECORD_BYTES, MIN_FRAMED, IndexFormatError, check_place, read_places, unframe
from shard_utils.format.jpeg import plain_header
from shard_utils.format.manifest import Manifest, load
from shard_utils.format.tfrecord import FramingError
from shard_utils.read.array_record_source import array_record_source  # noqa: F401 - public from here too
from shard_utils.read.stated import drain, size_problem

__all__ = [
    "array_record_source", "COALESCE_MAX_BYTES", "RecordReadError", "SplitIndex", "load_index", "load_indexes",
    "sources", "RandomAccessSource", "host_slice", "Decoder"
]

# Every read checks both framing CRC32Cs and the index is Avro: after a --no-deps install, say what is missing.
require_all(("google_crc32c", "fastavro"), "shard_utils.random_access")

COALESCE_MAX_BYTES = 8 << 20  # adjacent records merged into one ranged read, up to this many bytes


class RecordReadError(IOError, TpuShardsError):
    """A record could not be read or failed its checksums; the message names the split, index and shard."""


@dataclass(frozen=True)
class SplitIndex:
    """A split's record places: row i of the split is in shard `searchsorted(starts, i)` at offsets[i], lengths[i]."""

    starts: np.ndarray  # int64 [num_shards + 1]: first row of each shard, then the row count
    offsets: np.ndarray  # int64 [num_rows]
    lengths: np.ndarray  # int64 [num_rows]

    def __len__(self) -> int:
        return len(self.offsets)

    def shards_of(self, rows: np.ndarray) -> np.ndarray:
        """The shard index of each row."""
        return np.searchsorted(self.starts, rows, side="right") - 1

    def piece(self, shard: int, start: int, stop: int) -> SplitIndex:
        """Records start..stop-1 of one shard, as an index of one shard."""
        first = int(self.starts[shard])
        rows = slice(first + start, first + stop)
        return SplitIndex(np.array([0, stop - start], dtype=np.int64), self.offsets[rows], self.lengths[rows])

    @classmethod
    def joined(cls, parts: Sequence[SplitIndex]) -> SplitIndex:
        """The indexes one after the other: shard k of the result is the k-th shard of all of them, in order."""
        sizes = np.concatenate([np.diff(p.starts) for p in parts])
        return cls(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
                   np.concatenate([p.offsets for p in parts]), np.concatenate([p.lengths for p in parts]))

    @classmethod
    def from_places(cls, places, shard_records: Sequence[int], shard_bytes: Sequence[int],
                    max_record_bytes: int = MAX_RECORD_BYTES, where: str = "index") -> SplitIndex:
        """Build and check from (shard, offset, length) rows in shard order; IndexFormatError names a bad row."""
        flat = np.fromiter((v for place in places for v in place), dtype=np.int64)
        if len(flat) % 3:
            raise IndexFormatError(f"{where}: malformed rows")
        shard, offsets, lengths = flat.reshape(-1, 3).T.copy()
        starts = np.concatenate([[0], np.cumsum(np.asarray(shard_records, dtype=np.int64))])
        if len(offsets) != starts[-1]:
            raise IndexFormatError(f"{where}: {len(offsets)} rows for {starts[-1]} records in the manifest")
        rows = np.arange(len(offsets))
        expected = np.searchsorted(starts, rows, side="right") - 1
        sizes = np.asarray(shard_bytes, dtype=np.int64)[expected]
        bad = ((shard != expected) | (lengths < MIN_FRAMED) | (lengths > max_record_bytes) | (offsets < 0)
               | (offsets > sizes - lengths))
        if bad.any():
            i = int(np.argmax(bad))
            why = _why(int(shard[i]), int(expected[i]), int(offsets[i]), int(lengths[i]), int(sizes[i]),
                       max_record_bytes)
            raise IndexFormatError(f"{where}: row {i} (shard {shard[i]}, offset {offsets[i]}, length {lengths[i]}) "
                                   f"{why}; the index does not match the dataset: rebuild it or run "
                                   "`tpu-shards verify`")
        return cls(starts, offsets, lengths)


def _why(shard: int, expected: int, offset: int, length: int, size: int, limit: int) -> str:
    if shard != expected:
        return f"is in shard {shard}, but the manifest's counts put it in shard {expected}"
    return check_place(offset, length, size, limit) or "is invalid"


def load_index(m: Manifest, split: str, max_record_bytes: int = MAX_RECORD_BYTES) -> SplitIndex:
    """Read and check one split's index file against the manifest (size from stat or object metadata before any
    read, then streamed: CRC32C, every row's place)."""
    entry = m.split(split)
    if entry.index is None and not m.first_format.indexed:
        raise IndexFormatError(f"split {split!r} holds ArrayRecord shards only (--format array_record), which give "
                               "random access without an index: use grain.sources.ArrayRecordDataSource("
                               f"manifest.array_record_paths({split!r}))")
    if entry.index is None:
        raise IndexFormatError(f"split {split!r} has no index in its manifest; rebuild the dataset with a "
                               "tpu-shards that writes indexes")
    uri = storage.join(m.location, entry.index.path)
    problem = size_problem(uri, entry.index)
    if problem:
        raise IndexFormatError(f"{problem}; the index is damaged")
    rows_problem: IndexFormatError | None = None
    with storage.open_read(uri) as f:
        stream = DigestingReader(f)
        try:
            index = SplitIndex.from_places(read_places(stream, entry.index.num_rows),
                                           [s.num_records for s in entry.shards], [s.num_bytes for s in entry.shards],
                                           max_record_bytes, entry.index.path)
        except IndexFormatError as exc:
            rows_problem = exc  # said after the checksum, which names a damaged file first
        digest = drain(stream)
    if (digest.size, digest.crc32c) != (entry.index.num_bytes, entry.index.crc32c):
        raise IndexFormatError(f"{entry.index.path}: size {digest.size} / crc32c {digest.crc32c} differ from the "
                               f"manifest's {entry.index.num_bytes} / {entry.index.crc32c}; the index is damaged")
    if rows_problem is not None:
        raise rows_problem
    return index


def load_indexes(m: Manifest, max_record_bytes: int = MAX_RECORD_BYTES) -> dict[str, SplitIndex]:
    """Every split's index, each loaded once (pass them to `RandomAccessSource(..., index=)`)."""
    return {name: load_index(m, name, max_record_bytes) for name in m.splits}


def sources(dataset: str | Manifest) -> dict[str, RandomAccessSource]:
    """A source per split, their indexes loaded once."""
    m = dataset if isinstance(dataset, Manifest) else load(dataset)
    return {name: RandomAccessSource(m, name, index=idx) for name, idx in load_indexes(m).items()}


class RandomAccessSource:
    """Records of a split, or of a split expression ("train[:80%]", "fold0+fold1", a list), by position, for Grain
    (`grain.MapDataset.source(src)`) or any random-access reader. Position i of an expression is its i-th record
    in reading order: the terms in order, each in shard order.

    Thread-safe and deterministic: `src[i]` always returns the same bytes, or raises RecordReadError.
    Picklable: its state is the manifest and the index arrays; files are opened per read, in whatever
    process reads.
    """

    def __init__(self, dataset: str | Manifest, split: str | Sequence[str], *,
                 index: SplitIndex | Mapping[str, SplitIndex] | None = None, max_record_bytes: int = MAX_RECORD_BYTES,
                 read_range: Callable[[str, int, int], bytes] = storage.read_range):
        self._m = dataset if isinstance(dataset, Manifest) else load(dataset)
        selection = self._m.select(split)
        self._split = selection.expression
        indexes = _split_indexes(self._m, selection.splits, index, max_record_bytes)
        self._index = SplitIndex.joined([indexes[p.split].piece(p.shard, p.start, p.stop) for p in selection.pieces])
        shards = [self._m.splits[p.split].shards[p.shard] for p in selection.pieces]
        self._paths = [storage.join(self._m.location, s.path) for s in shards]
        self._names = [s.path for s in shards]
        self._read_range = read_range

    @property
    def manifest(self) -> Manifest:
        return self._m

    @property
    def split(self) -> str:
        return self._split

    def __len__(self) -> int:
        return len(self._index)

    def __repr__(self) -> str:
        return f"RandomAccessSource(dataset={self._m.location!r}, split={self._split!r}, num_records={len(self)})"

    def _position(self, i: Any) -> int:
        n = len(self)
        try:
            i = operator.index(i)
        except TypeError:
            raise TypeError(f"record index must be an integer, got {type(i).__name__}") from None
        if not -n <= i < n:
            raise IndexError(f"record {i} is outside split {self._split!r} of {n} records")
        return i % n

    def __getitem__(self, i: int) -> bytes:
        row = self._position(i)  # one record: _getitems' reads without its grouping (a reader's per-record cost)
        found: dict[int, bytes] = {}
        shard = int(np.searchsorted(self._index.starts, row, side="right")) - 1
        self._read_run([0], [row], [shard], [self._index.offsets[row]], [self._index.lengths[row]], found)
        return found[row]

    def _getitems(self, indices: Sequence[int]) -> list[bytes]:
        """Records at these positions, in this order; reads grouped by shard, adjacent records in one read."""
        rows = np.array([self._position(i) for i in indices], dtype=np.int64)
        if not len(rows):
            return []
        unique = np.unique(rows)
        shards = self._index.shards_of(unique)
        offsets, lengths = self._index.offsets[unique], self._index.lengths[unique]
        order = np.lexsort((offsets, shards))
        found: dict[int, bytes] = {}
        run: list[int] = []
        for k in order:
            if run and not (shards[k] == shards[run[-1]] and offsets[k] == offsets[run[-1]] + lengths[run[-1]]
                            and offsets[k] + lengths[k] - offsets[run[0]] <= COALESCE_MAX_BYTES):
                self._read_run(run, unique, shards, offsets, lengths, found)
                run = []
            run.append(int(k))
        self._read_run(run, unique, shards, offsets, lengths, found)
        return [found[int(r)] for r in rows]

    def _read_run(self, run: list[int], rows, shards, offsets, lengths, found: dict[int, bytes]) -> None:
        shard, start = int(shards[run[0]]), int(offsets[run[0]])
        end = int(offsets[run[-1]] + lengths[run[-1]])
        try:
            block = self._read_range(self._paths[shard], start, end - start)
        except Exception as exc:
            raise RecordReadError(f"split {self._split!r} record {int(rows[run[0]])} ({self._names[shard]} bytes "
                                  f"{start}..{end}): {storage.problem(exc)}") from None
        for k in run:
            at = int(offsets[k]) - start
            try:
                found[int(rows[k])] = unframe(block[at:at + int(lengths[k])])
            except FramingError as exc:
                raise RecordReadError(f"split {self._split!r} record {int(rows[k])} ({self._names[shard]} at byte "
                                      f"{int(offsets[k])}): {exc}; the shard is damaged or the index is stale "
                                      "(run `tpu-shards verify`)") from None


def _split_indexes(m: Manifest, names: Sequence[str], given: SplitIndex | Mapping[str, SplitIndex] | None,
                   max_record_bytes: int) -> dict[str, SplitIndex]:
    """The index of each split named: as given (one SplitIndex for a single split, or a dict by split), else loaded;
    each checked to have a row per record."""
    if isinstance(given, SplitIndex):
        if len(names) != 1:
            raise ValueError(f"index= holds one split's index; the expression reads {', '.join(names)}: pass a dict "
                             "of indexes by split (load_indexes(manifest))")
        given = {names[0]: given}
    out = {}
    for name in names:
        index = given.get(name) if given is not None else None
        index = index if index is not None else load_index(m, name, max_record_bytes)
        if len(index) != m.split(name).num_records:
            raise IndexFormatError(f"split {name!r}: the index has {len(index)} rows for "
                                   f"{m.split(name).num_records} records")
        out[name] = index
    return out


def host_slice(num_records: int, process_index: int, process_count: int) -> slice:
    """This host's records: every process_count-th from process_index, the last num_records % process_count dropped.

    Hosts' slices are disjoint, equally long (num_records // process_count) and, with the dropped tail,
    cover the split; the same arguments always give the same slice. Use as `grain.MapDataset.source(src)[s]`.
    """
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} must be in 0..process_count-1 (process_count "
                         f"{process_count})")
    if num_records < process_count:
        raise ValueError(f"{num_records} records cannot give each of {process_count} hosts one")
    return slice(process_index, num_records - num_records % process_count, process_count)


class Decoder:
    """Turns a serialized record into numpy arrays, with Pillow (no TensorFlow); picklable for Grain workers.

    Output: "image" uint8 [H, W, 3] (a video gives "video" uint8 [T, H, W, 3]; with `image_size=(H, W)` every
    picture is resized to it, bilinear, the JPEG decoded at the smallest scale still at least that size); "label"
    int64 (the 0-based
    id, label_offset removed; -1 for a record without a label; a multi-label dataset gives a float32 multi-hot
    [num_classes], all zeros without a label); "source_id"
    str; and each extra column as "extra/<name>" (0-d for scalars, 1-d for lists).
    """

    def __init__(self, num_classes: int, *, label_offset: int = 0, multi_label: bool = False,
                 media_key: str = schema.IMAGE_ENCODED, extras: Sequence[tuple[str, str, bool]] = (),
                 image_size: tuple[int, int] | None = None):
        self.num_classes = num_classes
        self.image_size = image_size
        self.label_offset = label_offset
        self.multi_label = multi_label
        self.media_key = media_key
        self.extras = tuple(extras)

    @classmethod
    def for_manifest(cls, m: Manifest, image_size: tuple[int, int] | None = None) -> Decoder:
        extras = [(k, v["dtype"], v.get("shape") == [schema.VARIABLE]) for k, v in m.features.items()
                  if k.startswith(schema.EXTRA_PREFIX)]
        return cls(m.num_classes, label_offset=m.label_offset, multi_label=m.multi_label, media_key=m.media_key,
                   extras=extras, image_size=image_size)

    @classmethod
    def for_source(cls, src: RandomAccessSource) -> Decoder:
        return cls.for_manifest(src.manifest)

    @property
    def _keys(self) -> tuple[str, ...]:
        return (self.media_key, schema.LABEL, schema.SOURCE_ID, *(key for key, _, _ in self.extras))

    def __call__(self, data: bytes) -> dict[str, Any]:
        fields = schema.decode_fields(data, self._keys)
        source_id = _source_id(fields)
        frames = [_jpeg(b, source_id, self.image_size) for b in self._media(fields, source_id)]
        out: dict[str, Any] = {"video": np.stack(frames)} if self.media_key == schema.VIDEO_ENCODED else {
            "image": frames[0]}
        out["label"] = self._label(fields, source_id)
        out["source_id"] = source_id
        for key, dtype, is_list in self.extras:
            values = fields.get(key, [])
            if dtype == "string":
                values = [v.decode("utf-8", "replace") for v in values]
            out[key] = np.asarray(values if is_list or len(values) != 1 else values[0])
        return out

    def picture(self, data: bytes) -> tuple[Any, Any]:
        """An image record's (RGB Pillow image, label), both as __call__ gives them (its "image" is the picture's
        pixels): only the image and the label are read out of the record, the source id only for an error's
        message. The JAX iterator's per-record work, most of which holds the GIL."""
        fields = schema.decode_fields(data, (self.media_key, schema.LABEL))
        source_id = _LazySourceId(data)
        pictures = [_picture(b, source_id, self.image_size) for b in self._media(fields, source_id)]
        return pictures[0], self._label(fields, source_id)

    def _media(self, fields: dict[str, list], source_id: Any) -> list[bytes]:
        media = fields.get(self.media_key) or []
        if not media:
            raise ValueError(f"record {str(source_id)!r} has no {self.media_key!r}")
        return media

    def _label(self, fields: dict[str, list], source_id: Any) -> Any:
        """The "label" output: the 0-based id (-1 for none), or a multi-hot vector; ValueError outside the classes."""
        ids = schema.label_ids_of(fields.get(schema.LABEL, []), self.label_offset)
        if not all(0 <= i < self.num_classes for i in ids):
            raise ValueError(f"record {str(source_id)!r}: label ids {list(ids)} are outside "
                             f"0..{self.num_classes - 1}")
        if self.multi_label:
            hot = np.zeros(self.num_classes, dtype=np.float32)
            hot[list(ids)] = 1.0
            return hot
        return np.int64(ids[0] if ids else -1)


def _source_id(fields: dict[str, list]) -> str:
    return b"".join(fields.get(schema.SOURCE_ID, [])).decode("utf-8", "replace")


class _LazySourceId:
    """A record's source id, read out of it only if a message names it."""

    def __init__(self, data: bytes):
        self.data = data

    def __str__(self) -> str:
        return _source_id(schema.decode_fields(self.data, (schema.SOURCE_ID,)))


def _jpeg(data: bytes, source_id: str, size: tuple[int, int] | None = None) -> np.ndarray:
    return np.asarray(_picture(data, source_id, size))


def _picture(data: bytes, source_id: Any, size: tuple[int, int] | None = None):
    """The decoded RGB Pillow image, resized to `size` (height, width) when given; ValueError if it does not decode."""
    try:
        picture = _plain_picture(data, size)
        return picture if picture is not None else _opened_picture(data, size)
    except Exception as exc:
        raise ValueError(f"record {str(source_id)!r}: image does not decode: {storage.problem(exc)}") from None


def _plain_picture(data: bytes, size: tuple[int, int] | None):
    """_opened_picture's pixels for a JPEG with a plain header, decoded by Pillow's decoder without Image.open's
    Python parse of the header (most of what a record costs outside the decoder, all of it holding the GIL); None
    for any other bytes, an image over Pillow's pixel limit, and pixels the decoder does not finish."""
    from PIL import Image  # Pillow and the decoder's module only where a picture is decoded (the loader needs neither)

    from shard_utils.format.jpeg_pixels import decoded_plain

    found = plain_header(data)
    if found is None or (Image.MAX_IMAGE_PIXELS is not None and found.width * found.height > Image.MAX_IMAGE_PIXELS):
        return None  # Image.open warns of, or refuses, a decompression bomb
    target = (size[1], size[0]) if size is not None else (found.width, found.height)
    image = decoded_plain(data, found, target)
    if image is None:
        return None
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    return rgb if target == (found.width, found.height) else rgb.resize(target, Image.Resampling.BILINEAR)


def _opened_picture(data: bytes, size: tuple[int, int] | None):
    """The picture through Image.open: any image Pillow reads, drafted to `size` when it is a JPEG."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        if size is not None and image.size != (size[1], size[0]):
            image.draft("RGB", (size[1], size[0]))  # JPEG: decode at 1/2, 1/4 or 1/8 scale when that suffices
            rgb = image if image.mode == "RGB" else image.convert("RGB")
            return rgb.resize((size[1], size[0]), Image.Resampling.BILINEAR)
        image.load()
        return image if image.mode == "RGB" else image.convert("RGB")
