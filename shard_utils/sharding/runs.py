"""Run files: one run's framed records in key order, as one encoder wrote them, and what is known of each.

A run is the bytes of its records one after another, exactly as a shard holds them, so a shard that is a
prefix of a run needs no byte copied: locally the run file is moved and cut at the shard's end, after the
bytes past the cut (its tail, which copies read) are saved beside it, so that a copy run again, or at the
same time, still finds them; on gs:// a run is written as parts of about CHUNK_BYTES (cut between records)
and the shard is composed from them by Cloud Storage, the parts left as they are. For every record the
writer keeps the size, CRC32C and SHA-256 of the run up to its end, so a prefix's checksums are known
without reading it again.

Names are fixed by (split, run): an encoder that runs twice writes the same bytes under the same names.
"""
from __future__ import annotations

import hashlib
import pickle
import struct
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import Future
from contextlib import ExitStack
from dataclasses import dataclass

import google_crc32c

from shard_utils import storage
from shard_utils.errors import InternalError
from shard_utils.media.encode import RecordMeta

__all__ = [
    "CHUNK_BYTES", "TAIL_SUFFIX", "UPLOAD_THREADS", "META_VERSION", "RunEntry", "RunFile", "run_names", "RunWriter",
    "Checksums", "move_prefix", "prefix_piece_bytes"
]

CHUNK_BYTES = 16 * 2**20  # gs:// runs are parts of about this size
TAIL_SUFFIX = ".tail"  # beside a local run whose file became a shard: the bytes past the shard's end
_TAIL_START = struct.Struct(">Q")  # a tail file starts with the run offset of its first byte
UPLOAD_THREADS = 4  # parts uploaded at once per process (one per run being written)
LOCAL_BLOCK_BYTES = 2**20  # a local run's records are written in blocks of about this size, not one write each
META_VERSION = 1


@dataclass(frozen=True, slots=True)
class RunEntry:
    """One record of a run: its metadata, and the run's size, CRC32C and SHA-256 up to its end."""

    meta: RecordMeta
    end: int
    crc32c: int
    sha256: bytes

    def __reduce__(self):
        return (RunEntry, (self.meta, self.end, self.crc32c, self.sha256))


@dataclass(frozen=True)
class RunFile:
    """Where a written run lies: its parts (path, bytes) in order, its metadata file, and its totals."""

    split: str
    run: int
    parts: tuple[tuple[str, int], ...]
    meta_path: str
    count: int
    num_bytes: int

    def read(self, start: int, end: int) -> bytes:
        """Bytes start..end-1 of the run: one ranged read per part they touch (locally, from the run's saved
        tail once its file has become a shard)."""
        out, at = [], 0
        try:
            for path, size in self.parts:
                lo, hi = max(start, at), min(end, at + size)
                if lo < hi:
                    out.append(storage.read_range(path, lo - at, hi - lo))
                at += size
        except storage.StorageError:
            if storage.is_gcs(self.parts[0][0]) or not storage.exists(self.parts[0][0] + TAIL_SUFFIX):
                raise
            out = [_read_tail(self.parts[0][0] + TAIL_SUFFIX, start, end)]
        data = b"".join(out)
        if len(data) != end - start:
            raise InternalError(f"run {self.run} of split {self.split!r} holds {self.num_bytes} bytes; "
                                f"bytes {start}..{end} were asked for")
        return data

    def entries(self) -> list[RunEntry]:
        """Every record's entry, in run order (one read of the metadata file)."""
        version, entries = pickle.loads(storage.read_bytes(self.meta_path))
        if version != META_VERSION or len(entries) != self.count:
            raise InternalError(f"run metadata {self.meta_path} holds {len(entries)} records of version {version}, "
                                f"expected {self.count} of version {META_VERSION}")
        return entries


def run_names(folder: str, split: str, run: int) -> tuple[str, str]:
    """(the run's data path, or the prefix of its parts on gs://; its metadata path)."""
    stem = storage.join(folder, "runs", split, f"{run:06d}")
    return stem + ".records", stem + ".meta"


class RunWriter:
    """Writes one run: `add` each framed record in key order, then `close` (or `abort` on failure).

    Locally the records are copied into a block of up to LOCAL_BLOCK_BYTES, written when the next record does not
    fit (one write of a block costs less than a write of each record, and one block kept for the whole run needs no
    fresh memory per block: each new 4 KiB page is a page fault); a larger record is written as it is. On gs:// a
    full part is uploaded in the background while the next one fills (at most one upload in flight, so at most two
    parts are held)."""

    def __init__(self, folder: str, split: str, run: int, chunk_bytes: int = CHUNK_BYTES):
        self.split, self.run = split, run
        self.path, self.meta_path = run_names(folder, split, run)
        self._gcs = storage.is_gcs(folder)
        self._chunk_bytes = chunk_bytes
        self._stack = ExitStack()
        self._file = None if self._gcs else self._stack.enter_context(storage.open_write(self.path, durable=False))
        self._block = bytearray()
        self._filled = 0  # bytes of the block holding records not yet written
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._parts: list[tuple[str, int]] = []
        self._upload: Future | None = None
        self._entries: list[RunEntry] = []
        self._size = 0
        self._crc = 0
        self._sha = hashlib.sha256()

    def add(self, framed: bytes, meta: RecordMeta) -> None:
        self._size += len(framed)
        self._crc = google_crc32c.extend(self._crc, framed)
        self._sha.update(framed)
        self._entries.append(RunEntry(meta, self._size, self._crc, self._sha.copy().digest()))
        if self._file is not None:
            self._to_block(framed)
            return
        self._buffer.append(framed)
        self._buffered += len(framed)
        if self._buffered >= self._chunk_bytes:
            self._flush_part()

    def _to_block(self, framed: bytes) -> None:
        """A local record copied into the block (written first when the record does not fit), or written as it is
        when it is larger than a block."""
        end = self._filled + len(framed)
        if end > LOCAL_BLOCK_BYTES and self._filled:
            self._write_block()
            end = len(framed)
        if end > LOCAL_BLOCK_BYTES:
            self._write(framed)
            return
        self._block[self._filled:end] = framed  # grows the block while the first one fills, copies after
        self._filled = end

    def _write_block(self) -> None:
        """The local records held in the block, written at once."""
        if self._filled:
            with memoryview(self._block)[:self._filled] as held:
                self._write(held)
            self._filled = 0

    def _write(self, data: bytes | memoryview) -> None:
        assert self._file is not None  # only a local run holds a file
        self._file.write(data)

    def _flush_part(self) -> None:
        if not self._buffered:
            return
        path = storage.join(self.path, f"part-{len(self._parts):05d}")
        self._wait_upload()
        uploads = storage.io_threads("upload", UPLOAD_THREADS)
        self._upload = uploads.submit(storage.write_bytes, path, b"".join(self._buffer))
        self._parts.append((path, self._buffered))
        self._buffer, self._buffered = [], 0

    def _wait_upload(self) -> None:
        if self._upload is not None:
            upload, self._upload = self._upload, None
            upload.result()

    def close(self) -> RunFile | None:
        """Finish the run; None when it holds no record (nothing is left behind then, nor when it fails)."""
        if self._file is not None:
            try:
                self._write_block()
            except BaseException:
                self.abort()
                raise
        try:
            return self._close()
        except BaseException:
            self._file = None  # its context has exited: the temp file is gone, or complete under its name
            self._discard()
            raise

    def _close(self) -> RunFile | None:
        if self._file is not None:
            self._stack.close()  # the file is complete now
            if self._entries:
                self._parts.append((self.path, self._size))
                storage.start_sync(self.path)  # made durable while the worker goes on; shards wait for it
            else:
                storage.delete(self.path)
        else:
            self._flush_part()
            self._wait_upload()
        if not self._entries:
            return None
        storage.write_bytes(self.meta_path, pickle.dumps((META_VERSION, self._entries),
                                                         protocol=pickle.HIGHEST_PROTOCOL))
        return RunFile(self.split, self.run, tuple(self._parts), self.meta_path, len(self._entries), self._size)

    def abort(self) -> None:
        """Give up the run: a local file being written disappears; gs:// parts are left to the clean-up."""
        if self._upload is not None:
            self._upload.cancel()
            self._upload = None
        if self._file is not None:
            self._file = None
            try:
                self._stack.__exit__(RuntimeError, RuntimeError("aborted"), None)
            finally:
                self._discard()

    def _discard(self) -> None:
        """Remove a local run's files that a failure left complete (its data, its metadata); gs:// parts are
        left to the clean-up of the run's temporary folder."""
        if not self._gcs:
            for path in (self.path, self.meta_path):
                storage.delete(path)


@dataclass(frozen=True)
class Checksums:
    """A shard's size, CRC32C (GCS's base64 form) and SHA-256 (hex)."""

    size: int
    crc32c: str
    sha256: str

    @staticmethod
    def of_prefix(entry: RunEntry) -> Checksums:
        return Checksums(entry.end, storage.crc32c_base64(entry.crc32c), entry.sha256.hex())


def move_prefix(run: RunFile, entries: Sequence[RunEntry], count: int, dst: str) -> Checksums:
    """Make dst the run's first `count` records without copying them (see the module's docstring)."""
    last = entries[count - 1]
    want = Checksums.of_prefix(last)
    if not storage.is_gcs(dst):
        _keep_tail(run, last.end)
        storage.move_prefix(run.parts[0][0], dst, last.end)
        return want
    sources, at = [], 0
    for path, size in run.parts:
        if at + size <= last.end:
            sources.append(path)
        elif at < last.end:  # the part the prefix ends in: its first bytes become a part of their own
            piece = f"{path}.prefix-{last.end - at}"
            storage.write_bytes(piece, storage.read_range(path, 0, last.end - at))
            sources.append(piece)
        at += size
    size, crc = storage.compose(sources, dst)
    if (size, crc) != (want.size, want.crc32c):
        raise InternalError(f"shard {dst} composed from run {run.run} holds {size} bytes with CRC32C {crc}; "
                            f"the run's first {count} records are {want.size} bytes with {want.crc32c}")
    return want


def _keep_tail(run: RunFile, start: int) -> None:
    """Save a local run's bytes from `start` on beside it, before its file is moved and cut there (once: an
    attempt that finds the file gone or cut finds the tail saved by the one that moved or cut it)."""
    path = run.parts[0][0]
    tail = path + TAIL_SUFFIX
    if start >= run.num_bytes or storage.exists(tail):
        return
    try:
        with storage.open_read(path) as src, storage.open_write(tail, durable=False) as out:
            out.write(_TAIL_START.pack(start))
            src.seek(start)
            left = run.num_bytes - start
            while left:
                block = src.read(min(left, storage.READ_CHUNK_SIZE))
                if not block:
                    raise EOFError(f"{path} ends {left} bytes early")
                out.write(block)
                left -= len(block)
    except (storage.StorageError, OSError, EOFError):
        if not storage.exists(tail):
            raise


def _read_tail(tail: str, start: int, end: int) -> bytes:
    """Run bytes start..end-1 from a saved tail (they must lie past where it starts)."""
    (first,) = _TAIL_START.unpack(storage.read_range(tail, 0, _TAIL_START.size))
    if start < first:
        raise InternalError(f"{tail}: bytes {start}..{end} were asked for; the run's bytes before {first} are a shard")
    return storage.read_range(tail, _TAIL_START.size + start - first, end - start)


def prefix_piece_bytes(run: RunFile, entries: Sequence[RunEntry], count: int) -> int:
    """Bytes that making the prefix copies: on gs://, the start of the part it ends in; locally none."""
    end, at = entries[count - 1].end, 0
    if len(run.parts) == 1 and not storage.is_gcs(run.parts[0][0]):
        return 0
    for _, size in run.parts:
        if at < end < at + size:
            return end - at
        at += size
    return 0


@dataclass(frozen=True)
class RunSummary:
    """What planning needs of an encoded run."""

    split: str
    run: int
    file: RunFile | None

    @property
    def count(self) -> int:
        return self.file.count if self.file is not None else 0


def usable_counts(summaries: list[RunSummary], dropped: list) -> dict[str, int]:
    """Records per split that can go into shards: encoded, less those dropped as duplicates."""
    out: dict[str, int] = defaultdict(int)
    for s in summaries:  # moved runs too: their records count in the split they moved to
        out[s.split] += s.count
    for split, _, _ in dropped:
        out[split] -= 1
    return dict(out)
