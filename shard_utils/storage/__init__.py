"""Every local or gs:// file operation the project needs, behind one contract (no Beam).

Each verb works on a local path or a gs://bucket/name URI alike and raises `StorageError` with one
wording: `cannot <verb> <uri>: <problem>`, one line, never a credential. Absent files and objects
raise its subclass `NotFoundError`. Callers never branch on the kind of path.

Local files go through the os module (atomic replace, flock for compare-and-swap); Cloud Storage
goes through `google-cloud-storage` only (Application Default Credentials, `STORAGE_EMULATOR_HOST`
honoured), retried wherever the operation is idempotent. The two implementations are `_local` and `_gcs`,
which share `base`; import this module, not those.
"""
from __future__ import annotations

import io
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from shard_utils.storage import base, ranges  # noqa: F401
from shard_utils.storage.base import (  # noqa: F401
    GCS,
    HTTP_CONNECTIONS,
    LIST_PAGE_SIZE,
    READ_CHUNK_SIZE,
    WRITE_CHUNK_SIZE,
    Digest,
    Entry,
    NotFoundError,
    Readable,
    Seekable,
    StorageError,
    Writable,
    _one_line,
    _show,
    basename,
    crc32c_base64,
    gcs_client,
    io_threads,
    is_gcs,
    join,
    parent,
    split_gcs,
)
from shard_utils.storage.throttle import Waited

__all__ = [
    "base", "ranges", "GCS", "HTTP_CONNECTIONS", "LIST_PAGE_SIZE", "READ_CHUNK_SIZE", "WRITE_CHUNK_SIZE", "Digest",
    "Entry", "NotFoundError", "Readable", "Seekable", "StorageError", "Writable", "basename", "crc32c_base64",
    "gcs_client", "io_threads", "is_gcs",
    "join", "parent", "split_gcs", "problem", "checksum", "stores_checksums", "exists", "size", "list_names", "walk",
    "list_level", "top_level_dirs", "read_bytes", "read_range", "open_read", "read_in_chunks", "write_bytes",
    "open_write", "start_sync", "sync", "create_exclusive", "read_versioned", "replace_if_version",
    "delete_if_version", "make_folder", "copy", "rename", "compose", "move_prefix", "unfinished_writes", "delete",
    "delete_prefix"
]


def problem(exc: BaseException, uri: str = "") -> str:
    """One line saying why an operation on uri failed and what to check; never a credential.

    GCS errors name the bucket (missing bucket or object, 403/401 with the server's own words,
    missing Application Default Credentials); local errors give the OS's words (strerror).
    """
    if isinstance(exc, StorageError):
        return exc.reason
    if is_gcs(uri) or type(exc).__module__.startswith(("google.", "requests.", "urllib3.")):
        from shard_utils.storage import _gcs as _storage_gcs

        found = _storage_gcs.describe(exc, uri)
        if found:
            return _one_line(found)
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return _one_line(text)


def _error(verb: str, uri: str, exc: BaseException, dst: str | None = None) -> StorageError:
    subjects = [u for u in (uri, dst) if u]
    reason = problem(exc, next((u for u in subjects if is_gcs(u)), uri))
    target = _show(uri) + (f" to {_show(dst)}" if dst else "")
    kind = NotFoundError if _is_missing(exc) else StorageError
    return kind(f"cannot {verb} {target}: {reason}", verb=verb, uri=uri, reason=reason)


def _is_missing(exc: BaseException) -> bool:
    if isinstance(exc, StorageError):
        return isinstance(exc, NotFoundError)
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
        return True
    return type(exc).__name__ == "NotFound" and type(exc).__module__.startswith("google.")


@contextmanager
def _failing(verb: str, uri: str, dst: str | None = None) -> Iterator[None]:
    """Turn any failure inside the block into a StorageError worded `cannot <verb> <uri>: ...`."""
    try:
        yield
    except StorageError as exc:
        if exc.verb is not None:
            raise
        raise _error(verb, uri, exc, dst) from exc
    except Exception as exc:
        raise _error(verb, uri, exc, dst) from exc


def read_throttled(uri: str, end: int | None = None, waited: Waited | None = None) -> bytes:
    """A gs:// object's bytes (up to byte `end` when given) for reads of many objects at once: each request
    retried under the process's read throttle; a definite answer (not found, forbidden) raises the client
    library's own exception, a failure still passing when the budget is spent raises `throttle.GaveUp`."""
    from shard_utils.storage import _gcs as _storage_gcs

    return _storage_gcs.read_throttled(uri, end, waited)


def _backend(uri: str):
    """The module implementing the verbs for this kind of path (imported on first use)."""
    if is_gcs(uri):
        from shard_utils.storage import _gcs as _storage_gcs

        return _storage_gcs
    from shard_utils.storage import _local as _storage_local

    return _storage_local


# ---------------------------------------------------------------------------------------------- checksums

def checksum(uri: str) -> tuple[int, str] | None:
    """(size, crc32c in GCS form) of a file; None if absent. gs:// reads object metadata only;
    a local file is read through once."""
    with _failing("read", uri):
        return _backend(uri).checksum(uri)


def stores_checksums(uri: str) -> bool:
    """Whether checksum() is metadata (gs://) rather than a full read (local files)."""
    return is_gcs(uri)


# ---------------------------------------------------------------------------------------------- client


def exists(uri: str) -> bool:
    """Whether a file, a folder (on gs://: any object under uri + '/') or a bucket is there."""
    with _failing("stat", uri):
        return _backend(uri).exists(uri)


def size(uri: str) -> int:
    """Size in bytes of a file (a local symlink: of its target)."""
    with _failing("stat", uri):
        return _backend(uri).size(uri)


def list_names(folder: str) -> list[str]:
    """Names directly inside a folder, sorted; sub-folders end with '/'. A missing folder is empty."""
    with _failing("list", folder):
        return sorted(_backend(folder).list_names(folder))


def walk(root: str, follow_symlinks: bool = False, prune: Callable[[str], bool] | None = None,
         start: str = "", after: tuple[str, bool] | None = None, end: str | None = None) -> Iterator[Entry]:
    """Every file under root (or under its folder `start`, paths still relative to root), recursively,
    streamed (page by page on gs://).

    Local symlinks are never followed out of root or into folders; with follow_symlinks=True links
    to files are followed wherever they point. Links that dangle, loop or lead to folders, unreadable
    files and folders come out as entries with a reason instead of being dropped.
    prune(folder's relative path), when given, may stop the rest of a folder being listed locally
    (asked as the walk goes, so it can depend on what came out); gs:// lists everything anyway.
    On gs:// the walk can be limited to a range of names (see `list_level`).
    """
    with _failing("list", join(root, start) if start else root):
        if after is not None or end is not None:
            if not is_gcs(root):
                raise ValueError("a range of names is for gs:// walks")
            yield from _backend(root).walk(root, follow_symlinks, prune, start, after, end)
        else:
            yield from _backend(root).walk(root, follow_symlinks, prune, start)


def list_level(root: str, rel_dir: str, follow_symlinks: bool = False, *, after: tuple[str, bool] | None = None,
               end: str | None = None, max_pages: int | None = None,
               flat: bool = False) -> tuple[list[Entry], list[str], str | None]:
    """One folder level under root: (its files as entries, its sub-folders' relative paths, and on gs:// the
    last entry listed, file or sub-folder, when `max_pages` pages did not hold the whole level, else None).

    On gs:// the level can be cut into ranges of names (after = (name, inclusive) < name < end, names relative
    to root; after a sub-folder 'a/' means after all it holds), so that one large folder is listed by several
    workers (see `ranges.cut_points`); flat=True lists every file under the range's names, at any depth."""
    with _failing("list", join(root, rel_dir) if rel_dir else root):
        if is_gcs(root):
            entries, folders, more = _backend(root).list_range(root, rel_dir, after, end, max_pages, not flat)
            return list(entries), folders, more
        if flat:
            raise ValueError("a flat listing of a range of names is for gs://")
        files, folders = _backend(root).list_dir(root, rel_dir, follow_symlinks)
        return files, folders, None


def top_level_dirs(root: str) -> list[str]:
    """Names of the folders directly under root, sorted."""
    with _failing("list", root):
        return sorted(_backend(root).top_level_dirs(root))


# ---------------------------------------------------------------------------------------------- reading

def read_bytes(uri: str, limit: int | None = None) -> bytes:
    """The whole content of a (small) file; with `limit`, at most its first `limit` bytes (so a file that
    should be small costs no more than that, however large it is)."""
    with _failing("read", uri):
        if limit is not None:
            return _backend(uri).read_range(uri, 0, limit) if limit > 0 else b""
        return _backend(uri).read_bytes(uri)


def read_range(uri: str, start: int, length: int) -> bytes:
    """Exactly `length` bytes from offset `start` (one ranged GET on gs://); fewer is a StorageError."""
    if start < 0 or length < 0:
        raise ValueError(f"read_range needs start >= 0 and length >= 0, got {start}, {length}")
    if length == 0:
        return b""
    with _failing("read", uri):
        data = _backend(uri).read_range(uri, start, length)
        if len(data) != length:
            raise EOFError(f"short read at offset {start}: the file ends after {len(data)} of the "
                           f"{length} bytes asked for")
        return data


def open_read(uri: str) -> io.BufferedIOBase:
    """A seekable binary stream over a large file, read in chunks (one version of it on gs://)."""
    with _failing("read", uri):
        return _Reader(_backend(uri).open_read(uri), uri)


def read_in_chunks(read: Callable[[int], bytes], n: int) -> bytes:
    """Up to n bytes, from calls read(k) of at most READ_CHUNK_SIZE bytes each: a size taken from a file's
    content (a length header, a block size) then never allocates more than the file holds."""
    if n <= READ_CHUNK_SIZE:
        return read(n)
    chunks = []
    while n > 0 and (chunk := read(min(n, READ_CHUNK_SIZE))):
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


class _Reader(io.BufferedIOBase):
    """A binary read stream whose failures are StorageErrors."""

    def __init__(self, stream, uri: str):
        super().__init__()
        self._stream, self._uri = stream, uri

    def read(self, n: int | None = -1) -> bytes:
        """Up to n bytes (all that is left for n < 0), a large n in chunks (see read_in_chunks)."""
        with _failing("read", self._uri):
            if n is None or n < 0:
                return self._stream.read(-1)
            return read_in_chunks(self._stream.read, n)

    read1 = read

    def readinto(self, buffer) -> int:
        data = self.read(len(memoryview(buffer)))
        memoryview(buffer)[:len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        with _failing("read", self._uri):
            return self._stream.seek(offset, whence)

    def tell(self) -> int:
        return self._stream.tell()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        if not self.closed:
            self._stream.close()
        super().close()


# ---------------------------------------------------------------------------------------------- writing

def write_bytes(uri: str, data: bytes) -> None:
    """Write a file so that readers see the old content or the whole new one, never a part."""
    with _failing("write", uri):
        _backend(uri).write_bytes(uri, data)


@contextmanager
def open_write(uri: str, durable: bool = True) -> Iterator[Writable]:
    """A binary writer for a large file that appears whole when the block ends, and not at all
    if the block raises (a hidden temp file renamed on close; a resumable upload on gs://).

    durable=False: a local file is not fsynced (scratch files of one run, redone by a rerun anyway).
    """
    with _failing("write", uri):
        upload = _backend(uri).start_write(uri, durable)
    try:
        yield _Writer(upload, uri)
    except BaseException:
        upload.abort()
        raise
    with _failing("write", uri):
        upload.commit()


class _Writer:
    """The writer handed out by open_write; its failures are StorageErrors."""

    def __init__(self, upload, uri: str):
        self._upload, self._uri = upload, uri

    def write(self, data: bytes | memoryview) -> int:
        with _failing("write", self._uri):
            return self._upload.write(data)

    def tell(self) -> int:
        return self._upload.tell()

    def flush(self) -> None:
        """Nothing to do: content becomes visible only when the block ends."""

    def writable(self) -> bool:
        return True


def start_sync(uri: str) -> None:
    """Begin making a file written with durable=False durable, in the background; `sync` waits for it.

    Lets a writer go on with its next work while the disk takes this file's pages. No-op on gs://,
    where an object is durable once written."""
    if not is_gcs(uri):
        threading.Thread(target=_sync_quietly, args=(uri,), daemon=True, name="tpu-shards-sync").start()


def _sync_quietly(uri: str) -> None:
    try:
        sync(uri)
    except StorageError:  # the sync that must succeed (a caller's `sync`) reports it
        pass


def sync(uri: str) -> None:
    """Make a written file durable (fsync): quick when start_sync's flush has finished. No-op on gs://."""
    if is_gcs(uri):
        return
    with _failing("sync", uri):
        fd = os.open(uri, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def create_exclusive(uri: str, data: bytes) -> bool:
    """Create a file with this content only if it does not exist; False if it already did.

    The content is complete when the file becomes visible. On gs:// a False can, rarely, follow a
    retry whose first try landed but whose answer was lost: callers that must know read it back
    (so make data unique to the caller). replace_if_version behaves the same.
    """
    with _failing("create", uri):
        return _backend(uri).create_exclusive(uri, data)


def read_versioned(uri: str) -> tuple[bytes, str] | None:
    """(content, version) of a file for a later replace_if_version or delete_if_version; None if absent."""
    with _failing("read", uri):
        return _backend(uri).read_versioned(uri)


def replace_if_version(uri: str, data: bytes, version: str) -> bool:
    """Replace a file's content only if it is still at `version` (compare-and-swap); False otherwise."""
    with _failing("replace", uri):
        return _backend(uri).replace_if_version(uri, data, version)


def delete_if_version(uri: str, version: str) -> bool:
    """Delete a file only if it is still at `version`; True if that version is gone (also when the
    file was already absent), False if the file now holds another version."""
    with _failing("delete", uri):
        return _backend(uri).delete_if_version(uri, version)


def make_folder(uri: str) -> None:
    """Create a local folder and its parents (nothing to do on gs://, where names need no folders)."""
    with _failing("create", uri):
        _backend(uri).make_folder(uri)


# ---------------------------------------------------------------------------------------------- moving

def copy(src: str, dst: str) -> None:
    """Copy a file to dst, replacing it (between local and gs:// too); dst appears whole."""
    with _failing("copy", src, dst):
        if is_gcs(src) == is_gcs(dst):
            _backend(src).copy(src, dst)
        else:
            _stream_copy(src, dst)


def rename(src: str, dst: str, *, size: int | None = None) -> None:
    """Move a file to dst, replacing it (on gs:// a copy then a delete, retried).

    With size given, a source already gone while dst exists with that size counts as done, so a
    retried publish cannot fail on its own earlier success.
    """
    with _failing("rename", src, dst):
        if is_gcs(src) == is_gcs(dst):
            _backend(src).rename(src, dst, size)
            return
        if size is not None and not _backend(src).exists(src) and _done_already(dst, size):
            return
        _stream_copy(src, dst)
        _backend(src).delete(src)


def _done_already(dst: str, expected: int) -> bool:
    found = _backend(dst).checksum(dst)
    return found is not None and found[0] == expected


def _stream_copy(src: str, dst: str) -> None:
    with open_read(src) as reader, open_write(dst) as writer:
        while block := reader.read(base.READ_CHUNK_SIZE):
            writer.write(block)


def compose(sources: Sequence[str], dst: str) -> tuple[int, str]:
    """Write dst as the sources' bytes one after another (dst appears whole); returns dst's (size, crc32c).

    On gs:// the sources must be in dst's bucket and nothing is downloaded: Cloud Storage composes them
    (32 at a time, in a tree for more). Locally the bytes are copied. Running it again gives the same dst."""
    if not sources:
        raise ValueError("compose needs at least one source")
    with _failing("compose", sources[0], dst):
        if is_gcs(dst) and all(is_gcs(s) for s in sources):
            return _backend(dst).compose(list(sources), dst)
        digest = Digest()
        with open_write(dst) as out:
            for src in sources:
                with open_read(src) as reader:
                    while block := reader.read(base.READ_CHUNK_SIZE):
                        out.write(block)
                        digest.update(block)
        return digest.size, digest.crc32c


def move_prefix(src: str, dst: str, length: int) -> None:
    """Move a local file to dst keeping only its first `length` bytes, made durable (no byte is copied).

    Safe to repeat, and to run twice at once: once src is gone, dst is cut to `length` again."""
    if is_gcs(src) or is_gcs(dst):
        raise ValueError("move_prefix works on local files; on gs:// compose the object's parts")
    with _failing("rename", src, dst):
        _backend(src).move_prefix(src, dst, length)


def unfinished_writes(folder: str) -> list[tuple[str, str]]:
    """(temp file, the name it was being written as) of the writes a killed process left in a local folder; none on
    gs://, where an object appears whole or not at all."""
    if is_gcs(folder):
        return []
    with _failing("list", folder):
        return _backend(folder).unfinished_writes(folder)


def delete(uri: str) -> None:
    """Remove a file; a missing one is fine."""
    with _failing("delete", uri):
        _backend(uri).delete(uri)


def delete_prefix(folder: str) -> None:
    """Remove a folder and everything under it (gs:// objects in batches); a missing one is fine."""
    with _failing("delete", folder):
        if _is_everything(folder):
            raise StorageError("refusing to delete a whole bucket or file system")
        _backend(folder).delete_prefix(folder)


def _is_everything(folder: str) -> bool:
    if is_gcs(folder):
        return not split_gcs(folder)[1].strip("/")
    return os.path.abspath(folder) == os.path.abspath(os.sep)
