"""One media item to one framed tf.Example: read, validate, encode, frame. Pure and picklable.

This is the CPU-heavy work of a build. The Beam job runs it inline (one process per core on
Dataflow) or in a local pool of worker processes; either way the bytes are the same.
"""
from __future__ import annotations

import hashlib
import operator
from dataclasses import dataclass, field, replace
from typing import Any

from shard_utils.format import schema
from shard_utils.format.order import choose_split, sort_key
from shard_utils.format.tfrecord import frame_pieces
from shard_utils.inputs import MediaItem
from shard_utils.media.budget import OutOfMemory, mib
from shard_utils.media.images import ImageOptions, Rejected, memory_for, prepare_image
from shard_utils.media.reads import DEFAULT_MAX_FILE_BYTES, Unusable, read_source
from shard_utils.media.video import VideoOptions, prepare_video
from shard_utils.quality.flags import Inspection, flag_findings
from shard_utils.quality.signature import to_hex

__all__ = [
    "EncodeSettings", "RecordMeta", "Encoded", "Prepared", "Reject", "Outcome", "framed", "reject", "unlabeled_reject",
    "first_line", "encode_item", "encode_data", "killed_message"
]


@dataclass(frozen=True)
class EncodeSettings:
    """What encoding needs besides the item: image options, split rule, label ids and record shape."""

    image: ImageOptions = ImageOptions()
    seed: int = 0
    splits: tuple[tuple[str, float], ...] = (("train", 1.0),)
    label_ids: dict[str, int] = field(default_factory=dict)
    label_offset: int = 0
    extras: tuple[schema.ExtraSpec, ...] = ()
    video: VideoOptions | None = None  # a video dataset: every item is a clip
    frame_now: bool = True  # False when an embedding is added to the record later (it is framed then)
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES  # larger source files are rejected `too_large`, never read whole


@dataclass(frozen=True, slots=True)  # slots: a build holds one per record until its shard is written
class RecordMeta:
    """What the planner, the shard writer and the index need to know of one record, without its bytes."""

    sort_key: int
    source_id: str
    length: int  # of the framed record
    labels: tuple[int, ...]  # label ids (0-based, before any label offset)
    sha256: str
    height: int
    width: int
    extras: tuple[tuple[str, tuple], ...] = ()
    phash: str = ""  # the perceptual signature (16 hex digits; shard_utils.quality), "" when none was computed

    @property
    def order(self) -> tuple[int, str]:
        """The record's place in its split's total order."""
        return (self.sort_key, self.source_id)

    def __reduce__(self):
        """Pickle as a plain tuple: the slots dataclass default walks fields() on every record, and a
        build pickles each record's metadata several times (pool results, Beam's stages, shard tasks)."""
        return (type(self), _meta_fields(self))


_meta_fields = operator.attrgetter(*RecordMeta.__slots__)  # a slots dataclass's slots are its fields, in order


@dataclass(frozen=True)
class Encoded:
    """A framed record ready for a fragment, with its split and metadata."""

    split: str
    meta: RecordMeta
    framed: bytes
    passed_through: bool = False
    trailer_bytes: int = 0
    quality: tuple[dict, ...] = ()  # the image's flags, as findings for quality.jsonl


@dataclass(frozen=True)
class Prepared:
    """A record waiting for its embedding: everything but the framing (`meta.length` is 0 until framed)."""

    split: str
    meta: RecordMeta
    record: schema.ImageRecord
    passed_through: bool = False
    trailer_bytes: int = 0
    quality: tuple[dict, ...] = ()


Reject = dict  # {"source": ..., "reason": ..., "message": ...}
Outcome = Encoded | Prepared | Reject


def framed(prepared: Prepared, embedding: tuple[float, ...] | None = None, key: str = schema.EMBEDDING) -> Encoded:
    """Frame a prepared record (with its embedding, if any): the bytes and length that go into a fragment."""
    record = prepared.record
    if embedding is not None:
        record = replace(record, embedding=tuple(float(x) for x in embedding), embedding_key=key)
    data = frame_pieces(schema.example_parts(record))
    return Encoded(prepared.split, replace(prepared.meta, length=len(data)), data, prepared.passed_through,
                   prepared.trailer_bytes, prepared.quality)


def reject(item: MediaItem, reason: str, message: str) -> Reject:
    """A rejection naming the item (and the listing row it came from, if any)."""
    where = f"{item.origin}: " if item.origin else ""
    return {"source": item.source_id, "reason": reason, "message": where + message}


def unlabeled_reject(item: MediaItem, settings: EncodeSettings) -> Reject | None:
    """The rejection of an item without a label in a build that has labels (its `no_label` reason), or None: a
    build is labeled or not as a whole, and in a build where no item has a label every item is an unlabeled
    record (schema.NO_LABEL)."""
    if item.labels or not settings.label_ids:
        return None
    reason, message = item.no_label if item.no_label[0] else ("no_label", "has no label")
    return reject(item, reason, message)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type if it has none), at most 300 characters."""
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def encode_item(item: MediaItem, settings: EncodeSettings) -> Outcome:
    """Read, validate and encode one item into a framed record (or a Prepared one awaiting its embedding),
    or say why it cannot be one. A read that may succeed later raises TransientReadError."""
    data = read_source(item.uri, settings.max_file_bytes, item.size)
    return encode_data(item, settings, data)


def encode_data(item: MediaItem, settings: EncodeSettings, data: bytes | Unusable) -> Outcome:
    """encode_item for bytes already read (or the definite answer why they could not be)."""
    refused = unlabeled_reject(item, settings)
    if refused is not None:
        return refused
    if isinstance(data, Unusable):
        return reject(item, data.reason, data.message)
    try:
        if settings.video is not None:
            clip = prepare_video(data, settings.video)
            media: dict[str, Any] = dict(encoded=b"", frames=clip.frames, frame_rate=clip.frame_rate,
                                         height=clip.height, width=clip.width, channels=3)
            passed_through, trailer, inspection = False, 0, None
        else:
            image = prepare_image(data, settings.image)
            media = dict(encoded=image.encoded, height=image.height, width=image.width, channels=image.channels)
            passed_through, trailer, inspection = image.passed_through, image.trailer_bytes, image.inspection
    except Rejected as exc:
        return reject(item, exc.reason, exc.message)
    except OutOfMemory as exc:  # a resource failure, not a property of the file: never a rejection
        raise OutOfMemory(f"{item.source_id}: {exc}") from None
    except MemoryError:
        raise OutOfMemory(f"{item.source_id}: the system refused memory while encoding it") from None
    except Exception as exc:  # noqa: BLE001 - a decoder bug must not end a three-hour job
        return reject(item, "corrupt", f"{type(exc).__name__}: {first_line(exc)}")
    labels = tuple(settings.label_ids[name] for name in item.labels)
    stored = tuple(i + settings.label_offset for i in labels or (schema.NO_LABEL,))
    sha256 = hashlib.sha256(data).hexdigest()
    record = schema.ImageRecord(
        **media, label=stored[0], label_text=item.label, source_id=item.source_id, sha256=sha256, labels=stored,
        label_texts=item.labels or ("",), extras=_extras(item, settings.extras))
    split = item.split or choose_split(list(settings.splits), settings.seed, item.source_id)
    data = frame_pieces(schema.example_parts(record)) if settings.frame_now else b""
    phash, quality = _quality(inspection, item.source_id, split)
    meta = RecordMeta(sort_key(settings.seed, item.source_id), item.source_id, len(data), labels, sha256,
                      record.height, record.width, item.extras, phash)
    if settings.frame_now:  # as framed() would make it, without a Prepared record and a copy of its meta
        return Encoded(split, meta, data, passed_through, trailer, quality)
    return Prepared(split, meta, record, passed_through, trailer, quality)


def _quality(inspection: Inspection | None, source: str, split: str) -> tuple[str, tuple[dict, ...]]:
    """The index's signature field and the flag findings of an inspected image ("" and none when not inspected)."""
    if inspection is None:
        return "", ()
    phash = to_hex(inspection.signature) if inspection.signature is not None else ""
    return phash, tuple(flag_findings(inspection, source, split))


def killed_message(item: MediaItem, settings: EncodeSettings) -> str:
    """Why a build stops when the system killed the worker encoding `item` even with nothing beside it: the
    file, and the memory its header says it needs (read again here, in the build's own process)."""
    data = read_source(item.uri, settings.max_file_bytes, item.size)
    need = None if isinstance(data, Unusable) or settings.video is not None else memory_for(data, settings.image)
    needs = f"it needs about {mib(need)}" if need else "its header gives no size"
    return (f"{item.source_id}: the system killed the worker encoding it (SIGKILL), again with no other beside it; "
            f"{needs}, and a worker may use {mib(settings.image.memory)} (--worker-memory-mb): give the build more "
            "memory or fewer --workers")


def _extras(item: MediaItem, specs: tuple[schema.ExtraSpec, ...]) -> tuple:
    values = dict(item.extras)
    return tuple((spec, tuple(values.get(spec.name, ()))) for spec in specs)
