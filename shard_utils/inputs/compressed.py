"""Compressed listing files (.gz, .bz2, .deflate, .zst, .xz) opened so that no read inflates without bound.

A few megabytes of gzip can hold gigabytes of one line; a decompressor asked for everything at once would
allocate it all. These readers inflate as much as one read asks for and no more, so the line and block limits
of `listing_files` bound memory however the file is compressed.
"""
from __future__ import annotations

import bz2
import gzip
import io
import lzma
import zlib
from typing import BinaryIO, cast

from shard_utils.errors import TpuShardsError

__all__ = ["CompressionError", "decompressed"]

_CHUNK = 1 << 16  # compressed bytes read at a time


class CompressionError(ValueError, TpuShardsError):
    """A compressed listing's bytes are not a valid stream of its format (what was read before stands)."""


def decompressed(raw: BinaryIO, name: str) -> BinaryIO:
    """The listing file `name` (open as `raw`) decompressed as its extension says, or raw when it says none.
    A failure of the decompressor is a CompressionError; one reading raw (a transient storage error) is raised
    as it is. Closing the result leaves raw open (close it too)."""
    lower = name.lower()
    source = _Source(raw)
    if lower.endswith(".gz"):
        reader: BinaryIO = gzip.GzipFile(fileobj=source, mode="rb")
    elif lower.endswith(".bz2"):
        reader = bz2.BZ2File(source)
    elif lower.endswith((".xz", ".lzma")):
        reader = lzma.LZMAFile(source)
    elif lower.endswith((".zst", ".zstd")):
        import zstandard  # Beam's extra for .zst: installed wherever Beam reads them

        reader = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(source, read_across_frames=True,
                                                                               closefd=False))
    elif lower.endswith(".deflate"):
        reader = io.BufferedReader(_Inflating(source))
    else:
        return raw
    return cast(BinaryIO, _Checked(reader, source))


class _Source:
    """The compressed file, remembering the exception its last read raised."""

    def __init__(self, raw: BinaryIO):
        self._raw, self.failed = raw, None

    def read(self, n: int = -1) -> bytes:
        try:
            return self._raw.read(n)
        except BaseException as exc:
            self.failed = exc
            raise


class _Checked:
    """A decompressing reader whose own failures are CompressionErrors."""

    def __init__(self, reader: BinaryIO, source: _Source):
        self._reader, self._source = reader, source

    def read(self, n: int = -1) -> bytes:
        return self._call(self._reader.read, n)

    def readline(self, limit: int = -1) -> bytes:
        return self._call(self._reader.readline, limit)

    def _call(self, method, arg: int) -> bytes:
        try:
            return method(arg)
        except Exception as exc:
            if exc is self._source.failed:
                raise
            raise CompressionError(f"its compressed bytes are damaged ({type(exc).__name__}: {exc})") from None

    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> _Checked:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Inflating(io.RawIOBase):
    """A zlib stream (Beam's .deflate) inflated a buffer at a time."""

    def __init__(self, raw: _Source):
        self._raw, self._inflater = raw, zlib.decompressobj()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._inflater.eof:
            data = self._inflater.unconsumed_tail or self._raw.read(_CHUNK)
            if not data:
                raise EOFError("the compressed stream ends before its end marker")
            out = self._inflater.decompress(data, len(buffer))
            if out:
                buffer[:len(out)] = out
                return len(out)
        return 0
