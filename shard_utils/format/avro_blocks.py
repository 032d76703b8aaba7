"""Avro container blocks framed by hand, every size checked before it is allocated.

fastavro inflates a block before it says how large the block is, so a few kilobytes of deflate can become
gigabytes. The index and listing readers walk the framing here (row count, size, data, sync marker), inflate
with a bound, and leave the decoding of rows to fastavro.
"""
from __future__ import annotations

import bz2
import lzma
import zlib
from typing import BinaryIO

from shard_utils import storage
from shard_utils.errors import TpuShardsError

__all__ = [
    "MAX_INFLATED", "CODECS", "SYNC_SIZE", "BlockError", "Recent", "read_long", "block_header", "block_body", "inflate"
]

MAX_INFLATED = 64 * 2**20  # the rows of one block, inflated; writers make blocks of kilobytes to a few megabytes
CODECS = ("null", "deflate", "bzip2", "xz")  # the codecs inflated here, with a bound (the Avro spec's own)
SYNC_SIZE = 16


class BlockError(ValueError, TpuShardsError):
    """A block's framing or a size in it is wrong; the message says how (without naming the file)."""


class Recent:
    """A read-only stream that keeps the last 16 bytes read (an Avro header ends with its sync marker) and reads a
    large request in chunks (see storage.read_in_chunks)."""

    def __init__(self, stream: BinaryIO):
        self._stream, self.tail = stream, b""

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n) if n is None or n < 0 else storage.read_in_chunks(self._stream.read, n)
        self.tail = (self.tail + data)[-SYNC_SIZE:]
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._stream.seek(offset, whence)

    def tell(self) -> int:
        return self._stream.tell()


def read_long(stream: Recent, at_end: bool = False) -> int | None:
    """An Avro long (zig-zag varint); None at the end of the file when `at_end` allows it there."""
    value = shift = 0
    while byte := stream.read(1):
        value |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return (value >> 1) ^ -(value & 1)
        shift += 7
        if shift > 63:
            raise BlockError("a block count or size is not a valid Avro long")
    if at_end and not shift:
        return None
    raise BlockError("the file ends inside a block header")


def block_header(stream: Recent, max_bytes: int = MAX_INFLATED) -> tuple[int, int] | None:
    """(declared rows, stored bytes) of the next block, both checked for sign and size; None at the end."""
    count = read_long(stream, at_end=True)
    if count is None:
        return None
    size = read_long(stream)
    assert size is not None  # read_long returns None only at the end of the file, when at_end is True
    if count < 0:
        raise BlockError(f"a block declares {count} rows")
    if not 0 <= size <= max_bytes:
        raise BlockError(f"a block declares {size} bytes; blocks hold at most {max_bytes}")
    return count, size


def block_body(stream: Recent, size: int, codec: str, sync: bytes, limit: int = MAX_INFLATED) -> bytes:
    """The rows' bytes of a block whose header said `size`, inflated to at most `limit` bytes, after checking the
    sync marker that follows it."""
    data = stream.read(size)
    if len(data) < size:
        raise BlockError(f"the file ends inside a block ({len(data)} of its {size} bytes)")
    rows = inflate(data, codec, limit)
    if stream.read(len(sync)) != sync:
        raise BlockError("a block is not followed by the file's sync marker")
    return rows


def inflate(data: bytes, codec: str, limit: int = MAX_INFLATED) -> bytes:
    """A block's rows as bytes, never more than `limit` of them."""
    if codec == "null":
        return data
    if codec == "deflate":
        inflater = zlib.decompressobj(-15)
        try:
            rows = inflater.decompress(data, limit)
        except zlib.error as exc:
            raise BlockError(f"a block's compressed rows are damaged ({exc})") from None
        more, done = bool(inflater.unconsumed_tail), inflater.eof
    elif codec in ("bzip2", "xz"):
        decompressor = bz2.BZ2Decompressor() if codec == "bzip2" else lzma.LZMADecompressor()
        try:
            rows = decompressor.decompress(data, limit)
        except (OSError, lzma.LZMAError) as exc:
            raise BlockError(f"a block's compressed rows are damaged ({exc})") from None
        more, done = not decompressor.needs_input and not decompressor.eof, decompressor.eof
    else:
        raise BlockError(f"codec {codec!r} is not read here; use one of {', '.join(CODECS)}")
    if more:
        raise BlockError(f"a block inflates to more than {limit} bytes")
    if not done:
        raise BlockError("a block's compressed rows are cut short")
    return rows
