"""Files a manifest states (shards, indexes): read only once they are regular files of the stated size, as `stat` or
the object's metadata says, and then streamed, so that no read is larger than what the manifest allows.
"""
from __future__ import annotations

from shard_utils import storage
from shard_utils.format.generations import DigestingReader
from shard_utils.format.manifest import IndexFile, Shard

__all__ = ["size_problem", "stored_problems", "digest_problems", "drain"]


def size_problem(uri: str, entry: Shard | IndexFile) -> str | None:
    """Why a stated file must not be read: missing, not a regular file (refused without waiting on it), or of
    another size than its entry's (from `stat` or object metadata, nothing read); None when it may be read."""
    try:
        with storage.open_read(uri):
            pass
        size = storage.size(uri)
    except storage.NotFoundError:
        return f"{entry.path}: missing"
    except storage.StorageError as exc:
        return f"{entry.path}: cannot read: {storage.problem(exc, uri)}"
    return None if size == entry.num_bytes else _size_line(entry, size)


def stored_problems(path: str, entry: Shard | IndexFile) -> list[str]:
    """How a file whose storage keeps its size and CRC32C (gs://) differs from its manifest entry, from that
    metadata alone (nothing downloaded); each problem names the entry's path. Empty when it matches."""
    try:
        found = storage.checksum(path)
    except storage.StorageError as exc:
        return [f"{entry.path}: cannot read object metadata: {storage.problem(exc, path)}"]
    if found is None:
        return [f"{entry.path}: missing"]
    size, crc = found
    problems = []
    if size != entry.num_bytes:
        problems.append(_size_line(entry, size))
    if crc != entry.crc32c:
        problems.append(f"{entry.path}: crc32c {crc}, manifest says {entry.crc32c} (it changed since the build)")
    return problems


def _size_line(entry: Shard | IndexFile, size: int) -> str:
    return f"{entry.path}: size {size} bytes, manifest says {entry.num_bytes}"


def digest_problems(digest: storage.Digest, entry: Shard | IndexFile) -> list[str]:
    """A file's size and checksums against its manifest entry, one line per difference."""
    problems = []
    if digest.size != entry.num_bytes:
        problems.append(_size_line(entry, digest.size))
    if digest.crc32c != entry.crc32c:
        problems.append(f"{entry.path}: crc32c {digest.crc32c}, manifest says {entry.crc32c}")
    if digest.sha256 != entry.sha256:
        problems.append(f"{entry.path}: sha256 differs from the manifest")
    return problems


def drain(reader: DigestingReader) -> storage.Digest:
    """Read what is left of a stream through its digest, a chunk at a time; the digest of the whole file."""
    while reader.read(storage.READ_CHUNK_SIZE):
        pass
    return reader.digest
