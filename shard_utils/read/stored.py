"""Records as a dataset stores them, read back from its shards without TensorFlow (for inspect and extract).

Every text taken from a record is decoded leniently (invalid UTF-8 becomes U+FFFD): a record's fields are data
to show or to sanitise, never trusted as paths or markup.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from shard_utils import storage
from shard_utils.format import schema
from shard_utils.format.manifest import Manifest, Shard
from shard_utils.format.shard_formats import READ_ERRORS

__all__ = ["ShardReadError", "StoredRecord", "label_texts", "iter_shard", "iter_split"]


class ShardReadError(storage.StorageError):
    """A shard cannot be opened, or a record in it does not parse; the message names the shard and record."""


@dataclass(frozen=True)
class StoredRecord:
    """One record of a split: where it sits (shard path relative to the manifest, index in the shard) and its
    fields as `schema.decode_lists` returns them."""

    split: str
    shard: str
    index: int
    fields: dict[str, list]

    def _text(self, key: str) -> list[str]:
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in self.fields.get(key, [])]

    @property
    def source_id(self) -> str:
        ids = self._text(schema.SOURCE_ID)
        return ids[0] if ids else ""

    @property
    def label_texts(self) -> list[str]:
        return self._text(schema.LABEL_TEXT)

    @property
    def label_ids(self) -> list[int]:
        return [int(v) for v in self.fields.get(schema.LABEL, []) if isinstance(v, int)]

    @property
    def is_video(self) -> bool:
        return schema.VIDEO_ENCODED in self.fields and schema.IMAGE_ENCODED not in self.fields

    @property
    def media(self) -> list[bytes]:
        """The stored JPEG bytes: one image, or a clip's frames."""
        key = schema.VIDEO_ENCODED if self.is_video else schema.IMAGE_ENCODED
        return [v for v in self.fields.get(key, []) if isinstance(v, bytes)]

    def _int(self, key: str) -> int | None:
        values = self.fields.get(key, [])
        return int(values[0]) if values and isinstance(values[0], int) else None

    @property
    def width(self) -> int | None:
        return self._int(schema.IMAGE_WIDTH)

    @property
    def height(self) -> int | None:
        return self._int(schema.IMAGE_HEIGHT)


def label_texts(m: Manifest, record: StoredRecord) -> list[str]:
    """A record's label names: its own text, else looked up in the manifest from its label ids; [] for a record
    without a label (schema.NO_LABEL)."""
    if record.label_ids and not schema.label_ids_of(record.label_ids, m.label_offset):
        return []
    texts = record.label_texts
    if texts:
        return texts
    names = []
    for value in record.label_ids:
        i = value - m.label_offset
        names.append(m.labels[i] if 0 <= i < len(m.labels) else f"label {value}")
    return names


def iter_shard(m: Manifest, split: str, shard: Shard) -> Iterator[StoredRecord]:
    """Every record of one shard (of the dataset's first format: TFRecord or ArrayRecord), in order; a broken frame
    or record is a ShardReadError naming both."""
    records = m.first_format.read(storage.join(m.location, shard.path), shard.path)
    try:
        for index, data in enumerate(records):
            try:
                fields = schema.decode_lists(data)
            except ValueError as exc:
                raise ShardReadError(f"{shard.path}: record {index}: {exc}; run `tpu-shards verify`") from None
            yield StoredRecord(split, shard.path, index, fields)
    except ShardReadError:
        raise
    except READ_ERRORS as exc:
        raise ShardReadError(f"{exc}; run `tpu-shards verify` on the dataset") from None
    except storage.StorageError as exc:
        raise ShardReadError(f"{exc}; run `tpu-shards verify` on the dataset") from None


def iter_split(m: Manifest, split: str) -> Iterator[StoredRecord]:
    """Every record of a split, shard by shard, in shard order."""
    for shard in m.split(split).shards:
        yield from iter_shard(m, split, shard)
