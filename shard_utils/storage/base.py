"""What the storage contract's two implementations share: names, errors, checksums, the Cloud Storage client.

`shard_utils.storage` is the contract; `_local` and `_gcs` implement it and import this module, never the
contract itself (so nothing imports in a circle).
"""
from __future__ import annotations

import base64
import hashlib
import os
import posixpath
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from shard_utils.errors import TpuShardsError
from shard_utils.text import printable

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

__all__ = [
    "GCS", "LIST_PAGE_SIZE", "WRITE_CHUNK_SIZE", "READ_CHUNK_SIZE", "StorageError", "NotFoundError", "is_gcs", "join",
    "split_gcs", "parent", "basename", "crc32c_base64", "Digest", "io_threads", "HTTP_CONNECTIONS", "gcs_client",
    "Entry", "Readable", "Seekable", "Writable"
]

GCS = "gs://"
LIST_PAGE_SIZE = 1000  # objects per gs:// listing request; listings stream page by page
WRITE_CHUNK_SIZE = 16 * 1024 * 1024  # bytes per resumable-upload request of open_write on gs://
READ_CHUNK_SIZE = 8 * 1024 * 1024  # bytes per ranged GET of open_read on gs://


class Readable(Protocol):
    """What a reader of a byte stream front to back needs: read(n), fewer than n bytes only at the end."""

    def read(self, n: int = -1, /) -> bytes: ...


class Seekable(Readable, Protocol):
    """A byte stream read from anywhere: read, seek and tell (a file, an open_read stream, BytesIO)."""

    def seek(self, offset: int, whence: int = 0, /) -> int: ...

    def tell(self) -> int: ...


class Writable(Protocol):
    """What a writer of a byte stream needs: write(data), which takes it all (a file, an open_write stream)."""

    def write(self, data: bytes | memoryview, /) -> int: ...


class StorageError(TpuShardsError):
    """A path cannot be read or written; the message names the verb, the path and what to check."""

    def __init__(self, message: str, *, verb: str | None = None, uri: str | None = None,
                 reason: str | None = None):
        super().__init__(message)
        self.verb = verb
        self.uri = uri
        self.reason = message if reason is None else reason


class NotFoundError(StorageError):
    """The file or object (or the bucket holding it) does not exist."""


# ---------------------------------------------------------------------------------------------- paths

def is_gcs(uri: str) -> bool:
    """Whether a path is a gs:// URI."""
    return uri.startswith(GCS)


def join(base: str, *parts: str) -> str:
    """Join path parts with '/', for local paths and gs:// alike (on gs:// parts never restart the path)."""
    if is_gcs(base):
        return posixpath.join(base, *(p.lstrip("/") for p in parts))
    return os.path.join(base, *parts)


def split_gcs(uri: str) -> tuple[str, str]:
    """gs://bucket/some/name -> ('bucket', 'some/name')."""
    if not is_gcs(uri) or len(uri) <= len(GCS):
        raise StorageError(f"{uri!r} is not a gs://bucket/path URI")
    bucket, _, name = uri[len(GCS):].partition("/")
    if not bucket:
        raise StorageError(f"{uri!r} has no bucket name")
    return bucket, name


def parent(uri: str) -> str:
    """The folder holding a path: gs://b/a/x -> gs://b/a, gs://b/x -> gs://b, x.json -> '.'."""
    if is_gcs(uri):
        bucket, name = split_gcs(uri)
        head = posixpath.dirname(name.rstrip("/"))
        return f"{GCS}{bucket}/{head}" if head else f"{GCS}{bucket}"
    stripped = uri.rstrip("/") or uri
    return os.path.dirname(stripped) or "."


def basename(uri: str) -> str:
    """The last part of a path, ignoring a trailing '/'."""
    if is_gcs(uri):
        return posixpath.basename(split_gcs(uri)[1].rstrip("/"))
    return os.path.basename(uri.rstrip("/") or uri)


# ---------------------------------------------------------------------------------------------- errors

def _one_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return (lines[0] if lines else "unknown error")[:300]


def _show(uri: str) -> str:
    """A path as printed in a message: control characters escaped so the message stays one line."""
    return printable(uri)


def crc32c_base64(crc: int) -> str:
    """A CRC32C value in the base64 big-endian form GCS reports as an object's crc32c."""
    return base64.b64encode(crc.to_bytes(4, "big")).decode()


class Digest:
    """Running size, CRC32C (GCS form) and SHA-256 of bytes written in order."""

    def __init__(self) -> None:
        import google_crc32c

        self.size = 0
        self._crc = google_crc32c.Checksum()
        self._sha = hashlib.sha256()

    def update(self, data: bytes) -> None:
        self.size += len(data)
        self._crc.update(data)
        self._sha.update(data)

    @property
    def crc32c(self) -> str:
        return base64.b64encode(self._crc.digest()).decode()

    @property
    def sha256(self) -> str:
        return self._sha.hexdigest()


_io_pools: dict[str, ThreadPoolExecutor] = {}
_io_pools_lock = threading.Lock()


def io_threads(name: str, size: int) -> ThreadPoolExecutor:
    """A process-wide pool of `size` threads for I/O that runs beside the work (reads ahead, uploads behind)."""
    with _io_pools_lock:
        if name not in _io_pools:
            _io_pools[name] = ThreadPoolExecutor(size, thread_name_prefix=f"tpu-shards-{name}")
        return _io_pools[name]


_client = None  # (STORAGE_EMULATOR_HOST it was made for, client)
HTTP_CONNECTIONS = 32  # kept open per process: more than the reads a worker keeps in flight


def gcs_client():
    """One google-cloud-storage client per process (a new one if STORAGE_EMULATOR_HOST changes), with a
    connection pool large enough for the reads kept in flight.

    Credentials are Application Default Credentials; with STORAGE_EMULATOR_HOST set (a local
    emulator) the client is anonymous, as the emulator needs no credentials.
    """
    global _client
    host = os.environ.get("STORAGE_EMULATOR_HOST") or None
    if _client is None or _client[0] != host:
        import google.cloud.storage as storage

        credentials: Credentials
        project: str | None
        if host:
            from google.auth.credentials import AnonymousCredentials

            credentials = AnonymousCredentials()
            project = os.environ.get("GOOGLE_CLOUD_PROJECT") or "local-emulator"
        else:
            import google.auth

            credentials, project = google.auth.default()  # DefaultCredentialsError says what to do
        client = storage.Client(project=project, credentials=credentials, _http=_session(credentials))
        _client = (host, client)
    return _client[1]


def _session(credentials):
    """An HTTP session whose pool keeps HTTP_CONNECTIONS connections per host (requests keeps 10)."""
    import requests
    from google.auth.transport.requests import AuthorizedSession

    session = AuthorizedSession(credentials)
    adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=HTTP_CONNECTIONS)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    return session


# ---------------------------------------------------------------------------------------------- listing

@dataclass(frozen=True)
class Entry:
    """One listed file: its path relative to the root, size, and why it cannot be read (reason, message)."""

    rel_path: str
    size: int
    reason: str | None = None
    message: str | None = None
