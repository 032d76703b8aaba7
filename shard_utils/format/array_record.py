"""ArrayRecord shards: the same serialized records as a TFRecord shard, for Grain's random-access reads.

The `array_record` package writes local files only (its writers cannot open gs://), so a shard
is written into a local temporary file and then made visible whole through the storage layer: renamed
into place on a local disk, uploaded in one request sequence on gs:// (an object appears when its upload
ends). Its reader opens gs:// itself (random access: `shard_utils.read.array_record_source`), but reading a
whole gs:// shard here streams it once into a local copy: one download rather than a request per record. The
package is an extra (`array_record`), imported on first use: a TFRecord build never needs it.

Writer options: `group_size:1` puts every record in its own chunk, so a random read decodes one record,
not a group of them; `uncompressed` because the records are mostly JPEG bytes, which do not compress, so a
compressor would cost every read CPU for nothing. The same records always give the same bytes. The format ends
every file with a 64 KiB-aligned postscript block, so a shard takes at least 128 KiB however few its records.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from shard_utils import storage
from shard_utils.errors import TpuShardsError
from shard_utils.extras import require

WRITER_OPTIONS = "group_size:1,uncompressed"
READER_OPTIONS = "readahead_buffer_size:0"  # random access: no read-ahead past the record asked for
EXTRA = "array_record"
READ_BATCH = 64  # records asked of the reader at a time when reading a shard in order

__all__ = ["WRITER_OPTIONS", "Written", "module", "write_shard", "read_records", "count_records", "local_copy",
           "ArrayRecordError"]


class ArrayRecordError(ValueError, TpuShardsError):
    """An ArrayRecord shard cannot be read (truncated, not ArrayRecord); the message names it."""


@dataclass(frozen=True)
class Written:
    """An ArrayRecord shard written: its records, size, CRC32C (GCS form) and SHA-256."""

    num_records: int
    num_bytes: int
    crc32c: str
    sha256: str


def module(needed_for: str = "reading ArrayRecord shards"):
    """array_record's reader and writer module, or MissingExtra with the pip command that installs it; the
    message starts with `needed_for`, what the user asked for that needs it."""
    return require("array_record.python.array_record_module", EXTRA, needed_for)


def check_installed(needed_for: str) -> None:
    """MissingExtra now, before any work, when the package is missing (`needed_for`: as `module`)."""
    module(needed_for)


def write_shard(records: Iterable[bytes], dst: str) -> Written:
    """Write the records, in order, as the ArrayRecord file `dst` (local or gs://), which appears whole or not at
    all. Safe to run twice, or twice at once: each writer has its own temporary file and the bytes are the same."""
    writer_cls = module("writing ArrayRecord shards").ArrayRecordWriter
    local = not storage.is_gcs(dst)
    scratch = os.path.dirname(os.path.abspath(dst)) if local else None
    if scratch:
        storage.make_folder(scratch)
    # Named like the storage layer's own temporary files, so a rerun removes what a killed writer left.
    fd, temp = tempfile.mkstemp(prefix=f".{os.path.basename(dst)}.", suffix=".tmp", dir=scratch)
    os.close(fd)
    try:
        writer = writer_cls(temp, WRITER_OPTIONS)
        count = 0
        try:
            for record in records:
                writer.write(record)
                count += 1
        finally:
            writer.close()
        digest = _file_digest(temp)
        if local:
            _sync(temp)
            os.chmod(temp, 0o644)
            os.replace(temp, dst)
        else:
            upload(temp, dst)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temp)
    return Written(count, digest.size, digest.crc32c, digest.sha256)


def upload(local: str, dst: str) -> None:
    """Copy a finished local file to dst through the storage layer (dst appears whole when the copy ends)."""
    with open(local, "rb") as src, storage.open_write(dst) as out:
        while block := src.read(storage.READ_CHUNK_SIZE):
            out.write(block)


def _sync(path: str) -> None:
    """Make a local file durable before it is renamed into place, as the storage layer's own writes are."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _file_digest(path: str) -> storage.Digest:
    digest = storage.Digest()
    with open(path, "rb") as f:
        while block := f.read(storage.READ_CHUNK_SIZE):
            digest.update(block)
    return digest


@contextlib.contextmanager
def local_copy(uri: str) -> Iterator[str]:
    """A local path holding the file's bytes: the file itself when local (StorageError unless it is a regular
    file: a named pipe is refused, never waited on), else a download into a file with no name, which the
    system frees when this process ends however it ends (a SIGKILL leaves nothing in TMPDIR)."""
    if not storage.is_gcs(uri):
        storage.open_read(uri).close()
        yield uri
        return
    fd, named = _scratch_file()
    try:
        with storage.open_read(uri) as src, open(fd, "wb", closefd=False) as out:
            while block := src.read(storage.READ_CHUNK_SIZE):
                out.write(block)
        yield named or f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)
        if named:
            with contextlib.suppress(FileNotFoundError):
                os.remove(named)


def _scratch_file() -> tuple[int, str | None]:
    """(fd, None) of an anonymous file in TMPDIR, read back through /proc/self/fd; where the system has no such
    files, (fd, path) of a named one that local_copy removes."""
    if os.path.isdir("/proc/self/fd"):
        try:
            return os.open(tempfile.gettempdir(), os.O_TMPFILE | os.O_RDWR, 0o600), None
        except (AttributeError, OSError):  # not Linux, or a filesystem without O_TMPFILE
            fd, temp = tempfile.mkstemp(prefix="tpu-shards-", suffix=".array_record")
            os.remove(temp)  # open, unnamed from now on
            return fd, None
    fd, temp = tempfile.mkstemp(prefix="tpu-shards-", suffix=".array_record")
    return fd, temp


@contextlib.contextmanager
def _opened(uri: str, where: str) -> Iterator[tuple[object, int]]:
    """(reader, its record count) of an ArrayRecord shard; ArrayRecordError when it cannot be opened."""
    with local_copy(uri) as path:
        reader_cls = module().ArrayRecordReader
        reader = None
        try:
            try:
                reader = reader_cls(path, READER_OPTIONS)
                total = reader.num_records()
                if not reader.ok():
                    reader.close()  # raises the reader's reason
                    raise RuntimeError("the reader failed")
            except Exception as exc:  # noqa: BLE001 - the C++ reader's errors carry no stable type
                raise ArrayRecordError(f"{where}: not a readable ArrayRecord file ({_short(exc)})") from None
            yield reader, total
        finally:
            if reader is not None:
                with contextlib.suppress(Exception):  # a damaged file fails its close too; already reported
                    reader.close()


def read_records(uri: str, where: str | None = None) -> Iterator[bytes]:
    """Every record of an ArrayRecord shard in order; ArrayRecordError naming the shard (after the records read
    so far) when it cannot be read."""
    where = where or uri
    with _opened(uri, where) as (reader, total):
        for start in range(0, total, READ_BATCH):
            try:
                batch = reader.read(start, min(start + READ_BATCH, total))
            except Exception as exc:  # noqa: BLE001
                raise ArrayRecordError(f"{where}: records from {start} on cannot be read ({_short(exc)})") from None
            yield from batch


def count_records(uri: str, where: str | None = None) -> int:
    """The records an ArrayRecord shard holds, from its footer."""
    with _opened(uri, where or uri) as (_, total):
        return total


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__
