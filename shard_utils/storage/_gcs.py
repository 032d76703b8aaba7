"""The gs:// implementation of `shard_utils.storage` (use that module, not this one).

Everything goes through google-cloud-storage with its retry policies: `DEFAULT_RETRY` where
repeating the call leaves the same state (reads, whole-object writes, copies, deletes of a pinned
generation), the conditional policy where a generation precondition makes a write safe to repeat.
Functions raise the library's exceptions; `storage` words them with describe().
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from concurrent import futures

from google.api_core import exceptions as api
from google.cloud.storage.fileio import BlobWriter
from google.cloud.storage.retry import DEFAULT_RETRY as _LIBRARY_RETRY
from google.cloud.storage.retry import DEFAULT_RETRY_IF_GENERATION_SPECIFIED as _LIBRARY_CONDITIONAL
from google.cloud.storage.retry import _should_retry

from shard_utils.storage import base as storage
from shard_utils.storage import ranges
from shard_utils.storage.throttle import RetryPolicy, Throttle, Waited, with_retries

# The library's retry waits up to 60 s between tries and gives up after 120 s; under a burst of 503s that
# stalls a worker for minutes per request. Tries here wait at most 4 s (full jitter) and stop after 60 s:
# a request that still fails then fails its step, which the runner retries, while other reads go on.
DEFAULT_RETRY = _LIBRARY_RETRY.with_delay(initial=0.25, maximum=4.0, multiplier=2.0).with_timeout(60.0)
DEFAULT_RETRY_IF_GENERATION_SPECIFIED = type(_LIBRARY_CONDITIONAL)(
    DEFAULT_RETRY, _LIBRARY_CONDITIONAL.conditional_predicate, _LIBRARY_CONDITIONAL.required_kwargs)
# Source reads are tried one request at a time under a throttle shared by the process: a bucket that answers
# 429/503 above its current rate (a fresh one serves about 5,000 reads/s, doubling every 20 minutes) gets
# about 1.25 times what it serves, and each object retries on its own for 10 minutes after its first failure.
READ_POLICY = RetryPolicy(initial_s=0.5, maximum_s=16.0, multiplier=2.0, budget_s=600.0)
READ_THROTTLE = Throttle()  # one per process: every read in flight asks it
READ_TIMEOUT = (10.0, 60.0)  # seconds to connect, and to wait for each chunk of an answer

_BATCH = 100  # deletes per batch request (the JSON API's documented limit)
DELETE_BATCHES_IN_FLIGHT = 8  # batch requests at once when deleting a folder


def _bucket(uri: str):
    """(Bucket, object name) of a URI."""
    bucket, name = storage.split_gcs(uri)
    return storage.gcs_client().bucket(bucket), name


def _blob(uri: str):
    bucket, name = _bucket(uri)
    if not name or name.endswith("/"):
        raise IsADirectoryError(f"{uri} names a bucket or folder, not an object")
    return bucket.blob(name)


def _prefix(uri: str) -> tuple[str, str]:
    """gs://bucket/some/folder -> ('bucket', 'some/folder/'); the bucket root gives ('bucket', '')."""
    bucket, prefix = storage.split_gcs(uri.rstrip("/") + "/")
    return bucket, prefix.lstrip("/")


def _missing(uri: str) -> api.NotFound:
    return api.NotFound(f"not found: {uri}")


def _get(uri: str):
    """The object's metadata (with its generation), or None if it or its bucket is absent."""
    blob = _blob(uri)
    return blob.bucket.get_blob(blob.name, retry=DEFAULT_RETRY)


def _pinned(meta):
    """A handle on exactly the generation `meta` describes. Downloads through it use the client's
    endpoint (not the server's mediaLink), so STORAGE_EMULATOR_HOST and proxies hold for them too."""
    return meta.bucket.blob(meta.name, generation=meta.generation)


# ---------------------------------------------------------------------------------------------- listing

def exists(uri: str) -> bool:
    bucket, name = _bucket(uri)
    if not name.strip("/"):
        return bucket.exists(retry=DEFAULT_RETRY)
    if not name.endswith("/") and bucket.blob(name).exists(retry=DEFAULT_RETRY):
        return True
    try:  # a "folder": any object under name/
        found = storage.gcs_client().list_blobs(bucket.name, prefix=name.rstrip("/") + "/", max_results=1,
                                                fields="items(name),nextPageToken", retry=DEFAULT_RETRY)
        return any(True for _ in found)
    except api.NotFound:
        return False


def size(uri: str) -> int:
    blob = _get(uri)
    if blob is None:
        raise _missing(uri)
    return int(blob.size)


def list_names(folder: str) -> list[str]:
    bucket, prefix = _prefix(folder)
    pages = storage.gcs_client().list_blobs(bucket, prefix=prefix, delimiter="/", page_size=storage.LIST_PAGE_SIZE,
                                            fields="items(name),prefixes,nextPageToken", retry=DEFAULT_RETRY)
    names = [blob.name[len(prefix):] for blob in pages]  # iterating every page also gathers the prefixes
    return [n for n in names if n] + [p[len(prefix):] for p in pages.prefixes]


def top_level_dirs(root: str) -> list[str]:
    return [name.rstrip("/") for name in list_names(root) if name.endswith("/")]


def walk(root: str, follow_symlinks: bool, prune: Callable[[str], bool] | None = None, start: str = "",
         after: tuple[str, bool] | None = None, end: str | None = None) -> Iterator[storage.Entry]:
    """Objects have no symlinks: follow_symlinks changes nothing here. Nor does prune: a flat listing of
    the prefix has no folder to leave."""
    entries, _, _ = list_range(root, start, after, end, None, delimiter=False)
    yield from entries


def list_range(root: str, rel_dir: str, after: tuple[str, bool] | None, end: str | None, max_pages: int | None,
               delimiter: bool = True) -> tuple[Iterator[storage.Entry] | list, list[str], str | None]:
    """Objects under root/rel_dir whose names (relative to root) come after `after` = (name, inclusive) and
    before `end`. After a sub-folder ('a/', not inclusive) means after everything it holds.

    With delimiter, only that level: its objects, and its sub-folders' relative paths. At most max_pages
    pages are listed; the third value is then the last entry listed, object or sub-folder, when more remain
    (else None). Without a page limit the objects stream, one page held at a time. The range is also
    checked here, name by name: a server that ignores startOffset/endOffset (an emulator) gives the same
    result."""
    bucket, prefix = _prefix(root)
    level = prefix + (rel_dir.rstrip("/") + "/" if rel_dir.strip("/") else "")
    if after is not None:
        after = ranges.start_of(after)
    kwargs = dict(prefix=level, page_size=storage.LIST_PAGE_SIZE, retry=DEFAULT_RETRY,
                  fields="items(name,size),prefixes,nextPageToken")
    if delimiter:
        kwargs["delimiter"] = "/"
    if after is not None:
        kwargs["start_offset"] = prefix + after[0]
    if end is not None:
        kwargs["end_offset"] = prefix + end
    blobs = storage.gcs_client().list_blobs(bucket, **kwargs)

    def inside(rel: str) -> bool:
        return (after is None or rel > after[0] or (after[1] and rel == after[0])) and (end is None or rel < end)

    def entries_of(page) -> Iterator[storage.Entry]:
        for blob in page:
            rel = blob.name[len(prefix):]
            if rel and not rel.endswith("/") and inside(rel):  # folder placeholder objects hold no data
                yield _empty_part(rel) or storage.Entry(rel, int(blob.size or 0))

    if max_pages is None and not delimiter:
        return (e for page in blobs.pages for e in entries_of(page)), [], None
    found: list[storage.Entry] = []
    folders: list[str] = []
    pages, last = 0, ""
    for page in blobs.pages:
        found += entries_of(page)
        here = [p[len(prefix):] for p in page.prefixes if inside(p[len(prefix):])]
        pages += 1
        # The last entry in name order, object or sub-folder: a page of sub-folders alone goes on from its last.
        last = max([e.rel_path for e in found[-1:]] + here + [last])
        for rel in here:  # a sub-folder whose name has an empty part is refused whole, not listed
            refused = _empty_part(rel)
            if refused:
                found.append(refused)
            else:
                folders.append(rel)
        if max_pages is not None and pages >= max_pages and blobs.next_page_token and last:
            return found, sorted(set(folders)), last
    return found, sorted(set(folders)), None


BAD_NAME = "bad_name"  # the reason of an entry whose name below the root has an empty part (see _empty_part)


def _empty_part(rel: str) -> storage.Entry | None:
    """The refused entry of an object or sub-folder whose name below the root has an empty part ('/x.jpg' or
    'a//x.jpg' under 'in/': the object in//x.jpg), else None. Cloud Storage keeps such a name as it is, another
    object than the one the name without '//' gives (in/x.jpg), but `join` and a listing's relative paths give the
    name without it: the object cannot be named apart, so it is never read."""
    if not (rel.startswith("/") or "//" in rel):
        return None
    what = "folder's name" if rel.endswith("/") else "object's name"
    left = "no object under it is read; rename them" if rel.endswith("/") else "not read; rename it"
    return storage.Entry(rel, 0, BAD_NAME, f"the {what} has an empty part ('//'), which tpu-shards cannot tell "
                                             f"from the name without it: {left}")


# ---------------------------------------------------------------------------------------------- reading

def read_bytes(uri: str) -> bytes:
    return _blob(uri).download_as_bytes(retry=DEFAULT_RETRY)


def read_throttled(uri: str, end: int | None, waited: Waited | None) -> bytes:
    """The object's bytes (up to byte `end` when given), its CRC32C checked by the client: one request per try,
    retried under the process's read throttle and READ_POLICY (GaveUp once its budget is spent); the library's
    exceptions for definite answers."""
    blob = _blob(uri)
    ranged = {} if end is None else {"start": 0, "end": end}
    return with_retries(lambda: blob.download_as_bytes(retry=None, timeout=READ_TIMEOUT, **ranged),
                        transient=transient, overloaded=overloaded, throttle=READ_THROTTLE, policy=READ_POLICY,
                        waited=waited)


def read_range(uri: str, start: int, length: int) -> bytes:
    """One ranged GET of the stored bytes; past the end gives b''."""
    try:
        return _blob(uri).download_as_bytes(start=start, end=start + length - 1, raw_download=True,
                                            checksum=None, retry=DEFAULT_RETRY)
    except api.RequestRangeNotSatisfiable:
        return b""


def open_read(uri: str):
    """A BlobReader pinned to the generation current now, so a concurrent overwrite is never mixed in."""
    meta = _get(uri)
    if meta is None:
        raise _missing(uri)
    return _pinned(meta).open("rb", chunk_size=storage.READ_CHUNK_SIZE, raw_download=True, retry=DEFAULT_RETRY)


def checksum(uri: str) -> tuple[int, str] | None:
    blob = _get(uri)
    return None if blob is None else (int(blob.size), blob.crc32c)


# ---------------------------------------------------------------------------------------------- writing

def write_bytes(uri: str, data: bytes) -> None:
    # One request, retried with backoff: writing the same whole content again leaves the same object.
    _blob(uri).upload_from_string(data, retry=DEFAULT_RETRY)


class _Upload(BlobWriter):
    """A resumable upload that becomes an object on commit() and never if aborted (even when garbage
    collected: io's finalizer calls close(), which would otherwise finish the upload)."""

    _abandoned = False

    def commit(self) -> None:
        super().close()

    def abort(self) -> None:
        self._abandoned = True
        try:
            self.terminate()  # cancels the upload session if one was started
        except Exception:
            pass  # an unfinished session is never visible and expires on its own

    def close(self) -> None:
        if not self._abandoned:
            super().close()


def start_write(uri: str, durable: bool = True) -> _Upload:  # an upload is durable once committed
    return _Upload(_blob(uri), chunk_size=storage.WRITE_CHUNK_SIZE, ignore_flush=True, retry=DEFAULT_RETRY)


def create_exclusive(uri: str, data: bytes) -> bool:
    try:
        _blob(uri).upload_from_string(data, if_generation_match=0, retry=DEFAULT_RETRY_IF_GENERATION_SPECIFIED)
        return True
    except api.PreconditionFailed:
        return False


def _generation(version: str) -> int:
    if not str(version).isdigit():
        raise ValueError(f"{version!r} is not a version given by read_versioned")
    return int(version)


def read_versioned(uri: str) -> tuple[bytes, str] | None:
    for _ in range(10):
        meta = _get(uri)
        if meta is None:
            return None
        try:  # the download is pinned to that generation: content and version always agree
            return _pinned(meta).download_as_bytes(retry=DEFAULT_RETRY), str(meta.generation)
        except api.NotFound:
            continue  # replaced or deleted between the two requests: look again
    raise RuntimeError("the object changed on every one of 10 reads")


def replace_if_version(uri: str, data: bytes, version: str) -> bool:
    try:
        _blob(uri).upload_from_string(data, if_generation_match=_generation(version),
                                      retry=DEFAULT_RETRY_IF_GENERATION_SPECIFIED)
        return True
    except api.PreconditionFailed:
        return False


def delete_if_version(uri: str, version: str) -> bool:
    blob = _blob(uri)
    try:
        blob.delete(if_generation_match=_generation(version), retry=DEFAULT_RETRY_IF_GENERATION_SPECIFIED)
    except api.NotFound:
        return True
    except api.PreconditionFailed:
        return not blob.exists(retry=DEFAULT_RETRY)  # absent counts as gone, whichever answer GCS gave
    return True


def make_folder(uri: str) -> None:
    storage.split_gcs(uri)  # names need no folders; only check that it is a gs:// URI


# ---------------------------------------------------------------------------------------------- moving

def copy(src: str, dst: str) -> None:
    source = _get(src)
    if source is None:
        raise _missing(src)
    _rewrite(source, dst)


def _rewrite(source, dst: str) -> None:
    """Server-side copy of one pinned generation, in as many rewrite calls as the server needs."""
    target, token = _blob(dst), None
    try:
        while True:
            token, _, _ = target.rewrite(source, token=token, retry=DEFAULT_RETRY)
            if token is None:
                return
    except api.NotFound:
        if not target.bucket.exists(retry=DEFAULT_RETRY):
            raise storage.NotFoundError(f"bucket gs://{target.bucket.name} does not exist") from None
        raise


def rename(src: str, dst: str, size: int | None) -> None:
    source = _get(src)
    if source is None:
        if size is not None:
            done = _get(dst)
            if done is not None and int(done.size) == size:
                return  # an earlier attempt already moved it
        raise _missing(src)
    if storage.split_gcs(src) == storage.split_gcs(dst):
        return
    _rewrite(source, dst)
    try:  # source has its generation set: this deletes exactly the copied version, so it may be retried
        source.delete(retry=DEFAULT_RETRY)
    except api.NotFound:
        pass  # deleted by an earlier try, or replaced by a newer object that is not ours to delete


COMPOSE_LIMIT = 32  # source objects per compose request


def compose(sources: list[str], dst: str) -> tuple[int, str]:
    """Server-side concatenation; more than 32 sources go through intermediate objects beside dst, removed
    after. A retry composes the same sources into the same bytes."""
    target = _blob(dst)
    names = []
    for uri in sources:
        bucket, name = storage.split_gcs(uri)
        if bucket != target.bucket.name:
            raise ValueError(f"compose: {uri} is not in dst's bucket gs://{target.bucket.name}")
        names.append(name)
    level, parts = 0, []
    while len(names) > COMPOSE_LIMIT:
        grouped = []
        for i in range(0, len(names), COMPOSE_LIMIT):
            part = f"{target.name}.compose-{level}-{i // COMPOSE_LIMIT:05d}"
            _compose(target.bucket, names[i:i + COMPOSE_LIMIT], part)
            grouped.append(part)
        parts += grouped
        names, level = grouped, level + 1
    done = _compose(target.bucket, names, target.name)
    for part in parts:
        try:
            target.bucket.blob(part).delete(retry=DEFAULT_RETRY)
        except api.NotFound:
            pass
    return int(done.size), done.crc32c


def _compose(bucket, names: list[str], dst: str):
    blob = bucket.blob(dst)
    blob.compose([bucket.blob(n) for n in names], retry=DEFAULT_RETRY)
    return blob


def delete(uri: str) -> None:
    try:
        _blob(uri).delete(retry=DEFAULT_RETRY)
    except api.NotFound:
        pass


def delete_prefix(folder: str, batches_in_flight: int = DELETE_BATCHES_IN_FLIGHT) -> None:
    """Batched deletes, up to `batches_in_flight` batch requests at once while the listing goes on, then one
    retried delete for anything a failed batch left."""
    bucket_name, prefix = _prefix(folder)
    client = storage.gcs_client()
    bucket = client.bucket(bucket_name)

    def listing():
        return client.list_blobs(bucket_name, prefix=prefix, page_size=storage.LIST_PAGE_SIZE,
                                 fields="items(name),nextPageToken", retry=DEFAULT_RETRY)

    try:
        with futures.ThreadPoolExecutor(batches_in_flight, thread_name_prefix="tpu-shards-delete") as pool:
            pending: set[futures.Future] = set()
            names: list[str] = []
            for blob in listing():
                names.append(blob.name)
                if len(names) == _BATCH:
                    if len(pending) >= batches_in_flight:  # bounded: the listing waits for a batch to finish
                        pending = futures.wait(pending, return_when=futures.FIRST_COMPLETED).not_done
                    pending.add(pool.submit(_delete_batch, client, bucket, names))
                    names = []
            if names:
                pending.add(pool.submit(_delete_batch, client, bucket, names))
        for blob in listing():
            try:
                bucket.blob(blob.name).delete(retry=DEFAULT_RETRY)
            except api.NotFound:
                pass
    except api.NotFound:
        return  # no bucket: nothing under the folder


def _delete_batch(client, bucket, names: list[str]) -> None:
    """One batch request (the client's current batch is per thread, so batches may run at once)."""
    try:
        with client.batch(raise_exception=False):
            for name in names:
                bucket.delete_blob(name)
    except Exception:
        pass  # batches are not retried: the pass after the last batch deletes leftovers one by one


# ---------------------------------------------------------------------------------------------- errors

def transient(exc: BaseException) -> bool:
    """A failure that may pass when the request is sent again: 408, 429, 5xx, a reset, a timeout, a checksum
    mismatch."""
    return _should_retry(exc) or type(exc).__name__ == "DataCorruption"  # google.cloud.storage's or resumable_media's


def overloaded(exc: BaseException) -> bool:
    """The server's answer to more requests than it serves now (its rate limit, or a bucket still ramping up)."""
    return isinstance(exc, (api.TooManyRequests, api.ServiceUnavailable))


def describe(exc: BaseException, uri: str) -> str | None:
    """One line for a google-cloud-storage or google-auth failure on uri; None if it is neither."""
    from google.auth import exceptions as auth

    bucket = storage.split_gcs(uri)[0] if storage.is_gcs(uri) and len(uri) > len(storage.GCS) else "?"
    if isinstance(exc, auth.DefaultCredentialsError):
        return ("no Application Default Credentials: run `gcloud auth application-default login`, "
                "or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file")
    if isinstance(exc, auth.RefreshError):
        return "the Application Default Credentials could not be refreshed; log in again"
    if isinstance(exc, auth.TransportError):
        return "cannot reach the token server to refresh the Application Default Credentials"
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if not isinstance(exc, api.GoogleAPICallError) and isinstance(status, int):
        try:  # an upload's InvalidResponse: worded as the same status from any other call
            exc = api.from_http_response(response)
        except Exception:
            return f"{status} from Cloud Storage"
    if isinstance(exc, api.NotFound):
        return _not_found(exc, uri, bucket)
    if isinstance(exc, (api.Forbidden, api.Unauthorized)):
        return f"permission denied on gs://{bucket} ({exc.code}): {_api_detail(exc)}"
    if isinstance(exc, api.GoogleAPICallError):
        return f"{exc.code} {_api_detail(exc)}".strip()
    if type(exc).__module__.startswith(("requests.", "urllib3.")):
        return f"no answer from Cloud Storage ({type(exc).__name__})"
    return None


def _not_found(exc: api.NotFound, uri: str, bucket: str) -> str:
    """A 404 names the bucket or the object: from the server's words, else by asking for the bucket."""
    text = str(exc).lower()
    gone = f"bucket gs://{bucket} does not exist"
    name = storage.split_gcs(uri)[1] if bucket != "?" else ""
    if "bucket does not exist" in text or not name.strip("/"):
        return gone
    if "no such object" not in text:
        try:
            if not storage.gcs_client().bucket(bucket).exists(retry=DEFAULT_RETRY):
                return gone
        except Exception:
            pass
    return f"object {uri} does not exist"


def _api_detail(exc) -> str:
    """The server's own words from a GCS error, without the request URL."""
    errors = getattr(exc, "errors", None) or []
    detail = errors[0].get("message") if errors and isinstance(errors[0], dict) else None
    text = str(getattr(exc, "message", "") or exc)
    if not detail:  # uploads carry the JSON error body in the message text
        found = re.search(r'"message":\s*"((?:[^"\\]|\\.)*)"', text)
        detail = found.group(1) if found else text.split(": ", 1)[-1]
    return (detail.splitlines() or [""])[0][:300]
