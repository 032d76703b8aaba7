"""The local-file implementation of `shard_utils.storage` (use that module, not this one).

Functions raise plain OSErrors; `storage` words them. Writes are atomic (a hidden temp file in the
same folder, fsynced, then os.replace); compare-and-swap holds an flock on the folder, so it is
correct between processes on one host.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import operator
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from shard_utils.errors import TpuShardsError
from shard_utils.storage import base as storage

_BLOCK = 4 * 1024 * 1024
_NAME = operator.attrgetter("name")  # what a folder's scanned entries are sorted by


def exists(path: str) -> bool:
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def size(path: str) -> int:
    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    return st.st_size


def list_names(folder: str) -> list[str]:
    try:
        with os.scandir(folder) as it:
            return [e.name + ("/" if e.is_dir() else "") for e in it]
    except FileNotFoundError:
        return []


def top_level_dirs(root: str) -> list[str]:
    with os.scandir(root) as it:
        return [e.name for e in it if e.is_dir(follow_symlinks=False)]


def walk(root: str, follow_symlinks: bool, prune: Callable[[str], bool] | None = None,
         start: str = "") -> Iterator[storage.Entry]:
    """Depth-first, sorted by name, from the folder `start` (relative to root); the root must be listable,
    sub-folders that are not become entries. A folder for which prune(its relative path) is true, asked
    before each of its entries, is left."""
    real_root = os.path.realpath(root)
    if start:
        pending: list[tuple[str, list[os.DirEntry] | None]] = [(start.rstrip("/"), None)]
    else:
        with os.scandir(root) as it:  # an unlistable root is an error, as a missing bucket is
            pending = [("", sorted(it, key=_NAME))]
    while pending:
        rel_dir, entries = pending.pop()
        if prune is not None and rel_dir and prune(rel_dir):
            continue
        if entries is None:
            try:
                with os.scandir(os.path.join(root, rel_dir)) as it:
                    entries = sorted(it, key=_NAME)
            except OSError as exc:
                yield storage.Entry(rel_dir + "/", 0, "unreadable",
                                    f"folder cannot be listed: {exc.strerror or exc}")
                continue
        for entry in entries:
            if prune is not None and rel_dir and prune(rel_dir):
                break
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            found = _entry(entry, rel, real_root, follow_symlinks)
            if found is None:
                pending.append((rel, None))
            else:
                yield found


def list_dir(root: str, rel_dir: str, follow_symlinks: bool) -> tuple[list[storage.Entry], list[str]]:
    """The files directly in one folder as entries, and its sub-folders' relative paths (both sorted)."""
    real_root = os.path.realpath(root)
    rel_dir = rel_dir.rstrip("/")
    try:
        with os.scandir(os.path.join(root, rel_dir) if rel_dir else root) as it:
            entries = sorted(it, key=_NAME)
    except OSError as exc:
        if not rel_dir:
            raise  # an unlistable root is an error, as a missing bucket is
        return [storage.Entry(rel_dir + "/", 0, "unreadable", f"folder cannot be listed: {exc.strerror or exc}")], []
    files, folders = [], []
    prefix = f"{rel_dir}/" if rel_dir else ""
    for entry in entries:
        found = _entry(entry, prefix + entry.name, real_root, follow_symlinks)
        if found is None:
            folders.append(prefix + entry.name)
        else:
            files.append(found)
    return files, folders


def _entry(entry: os.DirEntry, rel: str, real_root: str, follow_symlinks: bool) -> storage.Entry | None:
    """A scanned name as an entry; None for a folder (to be listed in turn)."""
    try:
        if entry.is_file(follow_symlinks=False):  # the usual entry, asked first: a regular file, not a link to one
            return storage.Entry(rel, entry.stat(follow_symlinks=False).st_size)
        if entry.is_symlink():
            return _symlink_entry(rel, entry.path, real_root, follow_symlinks)
        if entry.is_dir(follow_symlinks=False):
            return None
        return storage.Entry(rel, 0, "not_regular_file", "not a regular file (device, pipe or socket)")
    except OSError as exc:
        return storage.Entry(rel, 0, "unreadable", f"cannot stat: {exc.strerror or exc}")


def _symlink_entry(rel: str, path: str, real_root: str, follow: bool) -> storage.Entry:
    """A symlink as an entry: followed to a file (inside root unless follow), else a reason."""
    try:
        st = os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return storage.Entry(rel, 0, "symlink", "symbolic link loops; not followed")
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return storage.Entry(rel, 0, "symlink", "symbolic link is dangling; not followed")
        return storage.Entry(rel, 0, "unreadable", f"cannot stat the link's target: {exc.strerror or exc}")
    if not follow and os.path.commonpath([real_root, os.path.realpath(path)]) != real_root:
        return storage.Entry(rel, 0, "symlink", "symbolic link leads outside the input folder; not followed")
    if stat.S_ISDIR(st.st_mode):
        return storage.Entry(rel, 0, "symlink", "symbolic link to a folder; not followed")
    if not stat.S_ISREG(st.st_mode):
        return storage.Entry(rel, 0, "not_regular_file", "symbolic link to a device, pipe or socket")
    return storage.Entry(rel, st.st_size)


class NotRegularFile(OSError, TpuShardsError):
    """A path to read is a named pipe, device or socket, which could block forever or never end."""


def open_regular(path: str):
    """A binary file open for reading, only if path is (or leads to) a regular file: it is opened without
    blocking and checked before any byte is read, so a named pipe or a device is refused, never waited on."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not stat.S_ISREG(mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file (a named pipe, device or socket); refused")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str) -> bytes:
    with open_regular(path) as f:
        return f.read()


def read_range(path: str, start: int, length: int) -> bytes:
    """Up to `length` bytes from `start`; never more than the file holds there (no allocation on a bad length)."""
    with open_regular(path) as f:
        f.seek(start)
        return f.read(max(0, min(length, os.fstat(f.fileno()).st_size - start)))


def open_read(path: str):
    return open_regular(path)


def checksum(path: str) -> tuple[int, str] | None:
    import google_crc32c

    try:
        f = open_regular(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    crc, total = google_crc32c.Checksum(), 0
    with f:
        while block := f.read(_BLOCK):
            crc.update(block)
            total += len(block)
    return total, storage.crc32c_base64(int.from_bytes(crc.digest(), "big"))


_UNFINISHED = re.compile(r"^\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp$")  # what _TempFile names a write before its rename


def unfinished_writes(folder: str) -> list[tuple[str, str]]:
    """(temp file, the name it was being written as) of every write a killed process left in folder."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return [(n, m.group("name")) for n in names if (m := _UNFINISHED.match(n))]


class _TempFile:
    """A hidden temp file beside the destination, fsynced (if durable) and renamed over it on commit."""

    def __init__(self, path: str, durable: bool = True):
        self.path, self.durable = path, durable
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)  # as on gs://, where a name needs no folder made first
        fd, self.temp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
        self.file = os.fdopen(fd, "wb")

    def write(self, data: bytes | memoryview) -> int:
        return self.file.write(data)

    def tell(self) -> int:
        return self.file.tell()

    def finish(self) -> str:
        """Flush, fsync and close; the temp file is complete and readable by others."""
        self.file.flush()
        if self.durable:
            os.fsync(self.file.fileno())
        self.file.close()
        os.chmod(self.temp, 0o644)  # mkstemp makes it 0600; others read datasets
        return self.temp

    def commit(self) -> None:
        try:
            os.replace(self.finish(), self.path)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Remove the temp file; closing it may fail as the write did (a full disk refuses the buffered rest)."""
        try:
            self.file.close()
        except OSError:
            pass
        finally:
            try:
                os.remove(self.temp)
            except FileNotFoundError:
                pass


def start_write(path: str, durable: bool = True) -> _TempFile:
    return _TempFile(path, durable)


def write_bytes(path: str, data: bytes) -> None:
    temp = _TempFile(path)
    try:
        temp.write(data)
    except BaseException:
        temp.abort()
        raise
    temp.commit()


def create_exclusive(path: str, data: bytes) -> bool:
    temp = _TempFile(path)
    try:
        temp.write(data)
        temp.finish()
        os.link(temp.temp, path)  # atomic, fails if the name exists; the content is already whole
        return True
    except FileExistsError:
        return False
    finally:
        temp.abort()


def _version(fd: int, data: bytes) -> str:
    """Names one written state of a file: its inode, mtime, size and content hash."""
    st = os.fstat(fd)
    return f"{st.st_ino}:{st.st_mtime_ns}:{st.st_size}:{hashlib.sha256(data).hexdigest()[:16]}"


def read_versioned(path: str) -> tuple[bytes, str] | None:
    try:
        f = open_regular(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    with f:  # files are only ever replaced, never changed in place: one open file is one version
        data = f.read()
        return data, _version(f.fileno(), data)


@contextmanager
def _folder_lock(path: str) -> Iterator[bool]:
    """Hold an exclusive flock on the folder of path (yields False if the folder does not exist)."""
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        yield False
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield True
    finally:
        os.close(fd)  # closing releases the lock


def replace_if_version(path: str, data: bytes, version: str) -> bool:
    with _folder_lock(path) as locked:
        current = read_versioned(path) if locked else None
        if current is None or current[1] != version:
            return False
        write_bytes(path, data)
        return True


def delete_if_version(path: str, version: str) -> bool:
    with _folder_lock(path) as locked:
        current = read_versioned(path) if locked else None
        if current is None:
            return True
        if current[1] != version:
            return False
        os.remove(path)
        return True


def make_folder(path: str) -> None:
    os.makedirs(path, exist_ok=True)


def copy(src: str, dst: str) -> None:
    with open_regular(src) as reader:
        temp = _TempFile(dst)
        try:
            shutil.copyfileobj(reader, temp.file, _BLOCK)
        except BaseException:
            temp.abort()
            raise
        temp.commit()


def rename(src: str, dst: str, size: int | None) -> None:
    if size is not None and not os.path.lexists(src):
        try:
            if os.stat(dst).st_size == size:
                return  # an earlier attempt already moved it
        except FileNotFoundError:
            pass
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    try:
        os.replace(src, dst)
    except FileNotFoundError:  # another attempt moved it between the check above and here
        if size is None or not os.path.exists(dst) or os.stat(dst).st_size != size:
            raise


def move_prefix(src: str, dst: str, length: int) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    try:
        os.replace(src, dst)
    except FileNotFoundError:
        if not os.path.exists(dst):
            raise
    fd = os.open(dst, os.O_RDWR)
    try:
        if os.fstat(fd).st_size < length:
            raise OSError(errno.EINVAL, f"holds {os.fstat(fd).st_size} bytes, fewer than the {length} to keep")
        os.ftruncate(fd, length)
        os.fsync(fd)
    finally:
        os.close(fd)


def delete(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def delete_prefix(folder: str) -> None:
    if os.path.islink(folder) or os.path.isfile(folder):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), folder)
    try:
        shutil.rmtree(folder)
    except FileNotFoundError:
        pass
