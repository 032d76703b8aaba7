"""Local and gs:// storage helpers that need no Beam: listing, small reads and writes, checksums.

Cloud Storage goes through `google-cloud-storage` (Application Default Credentials;
`STORAGE_EMULATOR_HOST` is honoured), with its retry policy on every call.
"""
from __future__ import annotations

import base64
import hashlib
import os
import posixpath
import re
import tempfile
from dataclasses import dataclass
from typing import Iterator

GCS = "gs://"


class StorageError(Exception):
    """A path cannot be read or written; the message names the path and what to check."""


def is_gcs(uri: str) -> bool:
    return uri.startswith(GCS)


def join(base: str, *parts: str) -> str:
    """Join path parts with '/', for local paths and gs:// alike."""
    if is_gcs(base):
        return posixpath.join(base, *parts)
    return os.path.join(base, *parts)


def split_gcs(uri: str) -> tuple[str, str]:
    """gs://bucket/some/name -> ('bucket', 'some/name')."""
    if not is_gcs(uri) or len(uri) <= len(GCS):
        raise StorageError(f"{uri!r} is not a gs://bucket/path URI")
    bucket, _, name = uri[len(GCS):].partition("/")
    if not bucket:
        raise StorageError(f"{uri!r} has no bucket name")
    return bucket, name


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


def digest_of(stream, chunk: int = 1 << 22) -> Digest:
    """Digest of everything left in a binary stream."""
    digest = Digest()
    while block := stream.read(chunk):
        digest.update(block)
    return digest


_client = None  # (STORAGE_EMULATOR_HOST it was made for, client)


def gcs_client():
    """One google-cloud-storage client per process (a new one if STORAGE_EMULATOR_HOST changes).

    Credentials are Application Default Credentials; with STORAGE_EMULATOR_HOST set (a local
    emulator) the client is anonymous, as the emulator needs no credentials.
    """
    global _client
    host = os.environ.get("STORAGE_EMULATOR_HOST") or None
    if _client is None or _client[0] != host:
        from google.cloud import storage

        if host:
            from google.auth.credentials import AnonymousCredentials

            client = storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT") or "local-emulator",
                                    credentials=AnonymousCredentials())
        else:
            try:
                client = storage.Client()
            except OSError:  # ADC that names no project: reading and writing objects needs none
                client = storage.Client(project=None)
        _client = (host, client)
    return _client[1]


def _blob(uri: str):
    bucket, name = split_gcs(uri)
    return gcs_client().bucket(bucket).blob(name)


@dataclass(frozen=True)
class Entry:
    """One listed file: its path relative to the root, size, and why it cannot be read (reason, message)."""

    rel_path: str
    size: int
    reason: str | None = None
    message: str | None = None


def walk(root: str) -> Iterator[Entry]:
    """Every file under root, recursively, streamed; symlinks are never followed out of root or into folders."""
    if is_gcs(root):
        yield from _walk_gcs(root)
    else:
        yield from _walk_local(root)


def _walk_local(root: str) -> Iterator[Entry]:
    real_root = os.path.realpath(root)
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        try:
            with os.scandir(os.path.join(root, rel_dir)) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            yield Entry(rel_dir + "/", 0, "unreadable", f"folder cannot be listed: {exc.strerror or exc}")
            continue
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                if entry.is_symlink():
                    yield _symlink_entry(rel, entry.path, real_root)
                elif entry.is_dir(follow_symlinks=False):
                    pending.append(rel)
                elif entry.is_file(follow_symlinks=False):
                    yield Entry(rel, entry.stat(follow_symlinks=False).st_size)
                else:
                    yield Entry(rel, 0, "not_regular_file", "not a regular file (device, pipe or socket)")
            except OSError as exc:
                yield Entry(rel, 0, "unreadable", f"cannot stat: {exc.strerror or exc}")


def _symlink_entry(rel: str, path: str, real_root: str) -> Entry:
    target = os.path.realpath(path)
    if not os.path.exists(target):
        return Entry(rel, 0, "symlink", "symbolic link is dangling or loops; not followed")
    if os.path.commonpath([real_root, target]) != real_root:
        return Entry(rel, 0, "symlink", "symbolic link leads outside the input folder; not followed")
    if os.path.isdir(target):
        return Entry(rel, 0, "symlink", "symbolic link to a folder; not followed")
    return Entry(rel, os.path.getsize(target))


LIST_PAGE_SIZE = 1000  # objects per listing request; the listing streams page by page


def _gcs_prefix(uri: str) -> tuple[str, str]:
    """gs://bucket/some/folder -> ('bucket', 'some/folder/'); the bucket root gives ('bucket', '')."""
    bucket, prefix = split_gcs(uri.rstrip("/") + "/")
    return bucket, prefix.lstrip("/")


def _walk_gcs(root: str) -> Iterator[Entry]:
    bucket, prefix = _gcs_prefix(root)
    # One page at a time: the caller sees the first objects before the rest are listed, and
    # nothing here holds more than a page, however many objects the bucket has.
    for blob in gcs_client().list_blobs(bucket, prefix=prefix, page_size=LIST_PAGE_SIZE,
                                        fields="items(name,size),nextPageToken"):
        rel = blob.name[len(prefix):]
        if not rel or rel.endswith("/"):
            continue  # folder placeholder objects hold no data
        yield Entry(rel, int(blob.size or 0))


def top_level_dirs(root: str) -> list[str]:
    """Names of the folders directly under root."""
    if is_gcs(root):
        bucket, prefix = _gcs_prefix(root)
        pages = gcs_client().list_blobs(bucket, prefix=prefix, delimiter="/", page_size=LIST_PAGE_SIZE,
                                        fields="items(name),prefixes,nextPageToken")
        for _ in pages:
            pass
        return sorted(p[len(prefix):].rstrip("/") for p in pages.prefixes)
    with os.scandir(root) as it:
        return sorted(e.name for e in it if e.is_dir(follow_symlinks=False))


def exists(uri: str) -> bool:
    if is_gcs(uri):
        return _blob(uri).exists()
    return os.path.exists(uri)


def is_dir(uri: str) -> bool:
    """A local folder, or any gs:// prefix (buckets have no real folders)."""
    return True if is_gcs(uri) else os.path.isdir(uri)


def list_names(folder: str) -> list[str]:
    """File names directly inside a folder (not recursive)."""
    if is_gcs(folder):
        bucket, prefix = _gcs_prefix(folder)
        blobs = gcs_client().list_blobs(bucket, prefix=prefix, delimiter="/", page_size=LIST_PAGE_SIZE)
        names = [b.name[len(prefix):] for b in blobs]
        return sorted(n for n in names if n) + sorted(p[len(prefix):] for p in blobs.prefixes)
    if not os.path.isdir(folder):
        return []
    return sorted(e.name + ("/" if e.is_dir() else "") for e in os.scandir(folder))


def read_bytes(uri: str) -> bytes:
    """The whole content of a (small) file."""
    try:
        if is_gcs(uri):
            return _blob(uri).download_as_bytes()
        with open(uri, "rb") as f:
            return f.read()
    except Exception as exc:
        raise StorageError(f"cannot read {uri}: {_short(exc)}") from None


def write_bytes(uri: str, data: bytes) -> None:
    """Write a file so that readers see the old content or the whole new one, never a part."""
    try:
        if is_gcs(uri):
            from google.cloud.storage.retry import DEFAULT_RETRY

            try:  # one request, retried with backoff on 429/5xx and dropped connections
                _blob(uri).upload_from_string(data, retry=DEFAULT_RETRY)
            except Exception as exc:
                raise StorageError(f"cannot write {uri}: {gcs_problem(exc, uri)}") from exc
            return
        folder = os.path.dirname(os.path.abspath(uri))
        os.makedirs(folder, exist_ok=True)  # as on gs://, where a name needs no folder made first
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, uri)
    except StorageError:
        raise
    except Exception as exc:
        raise StorageError(f"cannot write {uri}: {_short(exc)}") from None


def delete(uri: str) -> None:
    """Remove a file if it is there."""
    if is_gcs(uri):
        from google.api_core.exceptions import NotFound
        from google.cloud.storage.retry import DEFAULT_RETRY

        try:
            _blob(uri).delete(retry=DEFAULT_RETRY)
        except NotFound:
            pass
    elif os.path.lexists(uri):
        os.remove(uri)


def gcs_problem(exc: BaseException, uri: str) -> str:
    """One line saying why a gs:// call failed, naming the bucket and what to check; never a credential."""
    from google.api_core import exceptions as api
    from google.auth.exceptions import DefaultCredentialsError, RefreshError

    bucket = split_gcs(uri)[0]
    if isinstance(exc, DefaultCredentialsError):
        return ("no Application Default Credentials: run `gcloud auth application-default login`, "
                "or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file")
    if isinstance(exc, RefreshError):
        return "the Application Default Credentials could not be refreshed; log in again"
    if isinstance(exc, api.NotFound):
        return f"bucket gs://{bucket} does not exist"
    if isinstance(exc, (api.Forbidden, api.Unauthorized)):
        return f"permission denied on gs://{bucket} ({exc.code}): {_api_detail(exc)}"
    if isinstance(exc, api.GoogleAPICallError):
        return f"{exc.code} {_api_detail(exc)}"
    return _short(exc)


def _api_detail(exc) -> str:
    """The server's own words from a GCS error, without the request URL."""
    errors = getattr(exc, "errors", None) or []
    detail = errors[0].get("message") if errors and isinstance(errors[0], dict) else None
    text = str(getattr(exc, "message", "") or exc)
    if not detail:  # uploads carry the JSON error body in the message text
        found = re.search(r'"message":\s*"((?:[^"\\]|\\.)*)"', text)
        detail = found.group(1) if found else text.split(": ", 1)[-1]
    return (detail.splitlines() or [""])[0][:300]


def object_crc32c(uri: str) -> tuple[int, str] | None:
    """(size, crc32c) as GCS reports them for an object, without downloading it; None if absent."""
    bucket, name = split_gcs(uri)
    blob = gcs_client().bucket(bucket).get_blob(name)  # metadata only; retried like every call here
    return None if blob is None else (int(blob.size), blob.crc32c)


def _short(exc: Exception) -> str:
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return text.splitlines()[0][:300]
