"""TFRecord framing: length, masked CRC32C of the length, data, masked CRC32C of the data.

Written here (not through TensorFlow) so that Beam workers and `verify` need no TF,
and so that a reader can report exactly which record of which file is broken.
"""
from __future__ import annotations

import functools
import struct
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import TYPE_CHECKING

from shard_utils.errors import TpuShardsError
from shard_utils.extras import require

__all__ = [
    "HEADER", "FOOTER", "FramingError", "masked_crc", "frame", "frame_pieces", "count_from_headers", "iter_records"
]

if TYPE_CHECKING:
    from shard_utils.storage import Readable, Seekable

_MASK_DELTA = 0xA282EAD8
HEADER = 12  # 8 length bytes + 4 CRC bytes
FOOTER = 4


class FramingError(ValueError, TpuShardsError):
    """A TFRecord file is truncated or fails a length or data checksum."""


@functools.cache
def _crc32c() -> ModuleType:
    """google_crc32c, imported on first use: modules that only name shards (tfds_meta) import this one without
    it, as after a --no-deps install in a notebook."""
    return require("google_crc32c", None, "checking TFRecord checksums")


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC32C."""
    return _masked(_crc32c().value(data))


def _masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(record: bytes) -> bytes:
    """One record in TFRecord framing."""
    return frame_pieces((record,))


def frame_pieces(pieces: Sequence[bytes]) -> bytes:
    """The record that is `pieces` joined, in TFRecord framing: its bytes are copied once, into the result."""
    crc = _crc32c().extend
    length = struct.pack("<Q", sum(map(len, pieces)))
    value = 0
    for piece in pieces:
        value = crc(value, piece)
    return b"".join((length, struct.pack("<I", masked_crc(length)), *pieces, struct.pack("<I", _masked(value))))


def count_from_headers(stream: Seekable, size: int) -> int:
    """The records of a TFRecord file of `size` bytes, counted from their headers alone: each length's checksum
    must hold and each record must end inside the file, or FramingError names the first that does not. Reads 12
    bytes per record, so a reader that trusts lengths (TensorFlow's allocates them) can be given the file after."""
    offset = index = 0
    while offset < size:
        stream.seek(offset)
        length = _length(stream.read(HEADER), index)
        if length > size - offset - HEADER - FOOTER:
            raise FramingError(f"record {index}: length {length} runs past the end of the file ({size} bytes)")
        offset += HEADER + length + FOOTER
        index += 1
    return index


def iter_records(stream: Readable, max_record_bytes: int = 1 << 31) -> Iterator[bytes]:
    """Yield each record's data, checking both CRCs; raise FramingError naming the record index."""
    index = 0
    while True:
        header = stream.read(HEADER)
        if not header:
            return
        length = _length(header, index)
        if length > max_record_bytes:
            raise FramingError(f"record {index}: length {length} exceeds {max_record_bytes} bytes")
        data = stream.read(length)
        footer = stream.read(FOOTER)
        if len(data) < length or len(footer) < FOOTER:
            raise FramingError(f"record {index}: truncated data")
        if masked_crc(data) != struct.unpack("<I", footer)[0]:
            raise FramingError(f"record {index}: data checksum mismatch")
        yield data
        index += 1


def _length(header: bytes, index: int) -> int:
    """The data length a record's header gives, once the header is whole and its length checksum holds."""
    if len(header) < HEADER:
        raise FramingError(f"record {index}: truncated header ({len(header)} of {HEADER} bytes)")
    length_bytes, (length_crc,) = header[:8], struct.unpack("<I", header[8:])
    if masked_crc(length_bytes) != length_crc:
        raise FramingError(f"record {index}: length checksum mismatch")
    return struct.unpack("<Q", length_bytes)[0]
