"""Reading source files: bounded in size, refusing what is not a regular file, several in flight at once.

A read ends in one of three ways. The bytes. A definite answer that the file cannot be used (`Unusable`:
it does not exist, permission is denied, it is a pipe or a device, it is larger than the limit), which
becomes a rejection. Or a failure that may pass (5xx, 429, a dropped connection, a timeout) and still fails
when the object's own retries are spent (`shard_utils.storage.throttle`, under the process's throttle):
`TransientReadError` is raised, so the step fails and is retried as a whole; such a file is never rejected.
"""
from __future__ import annotations

import collections
import errno
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TypeVar

from shard_utils import storage
from shard_utils.errors import TpuShardsError
from shard_utils.storage.throttle import GaveUp, Waited
from shard_utils.text import printable

__all__ = [
    "DEFAULT_MAX_FILE_BYTES", "READS_IN_FLIGHT", "BYTES_IN_FLIGHT", "READ_BLOCK", "UNKNOWN_SIZE", "TransientReadError",
    "Unusable", "read_source", "T", "prefetched", "needs_prefetch"
]

DEFAULT_MAX_FILE_BYTES = 256 * 2**20
READS_IN_FLIGHT = 16  # gs:// reads a worker keeps going while it decodes
BYTES_IN_FLIGHT = 128 * 2**20  # ... and the file bytes they may hold at once
READ_BLOCK = 8 * 2**20  # the largest read of a local file
UNKNOWN_SIZE = 2**20  # what a read of a file of unknown size is counted as, for that budget


class TransientReadError(RuntimeError, TpuShardsError):
    """A source could not be read for a reason that may pass; the message names it and the cause."""


@dataclass(frozen=True)
class Unusable:
    """A definite answer: the source cannot be a record, and why (a rejection reason and a message)."""

    reason: str
    message: str


def read_source(uri: str, max_bytes: int = DEFAULT_MAX_FILE_BYTES, size_hint: int = 0,
                waited: Waited | None = None) -> bytes | Unusable:
    """A source file's bytes, or why it cannot be used; TransientReadError when that is not known yet.
    `waited` adds up the time a gs:// read was held back by throttling or backed off after a 429/503."""
    if storage.is_gcs(uri):
        return _read_gcs(uri, max_bytes, size_hint, waited)
    return _read_local(uri, max_bytes)


def _too_large(size: int | str, max_bytes: int) -> Unusable:
    return Unusable("too_large", f"the file holds {size} bytes, more than the {max_bytes // 2**20} MiB limit "
                                 "(--max-file-mb)")


def _read_local(path: str, max_bytes: int) -> bytes | Unusable:
    try:  # O_NONBLOCK: opening a FIFO must not wait for a writer; regular files are unaffected
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (FileNotFoundError, NotADirectoryError):
        return Unusable("missing", f"{printable(path)} does not exist")
    except PermissionError as exc:
        return Unusable("unreadable", f"permission denied ({exc.strerror})")
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket, or a FIFO with no writer opened without blocking
            return Unusable("not_regular_file", "not a regular file (device, pipe or socket)")
        return Unusable("unreadable", exc.strerror or str(exc))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return Unusable("not_regular_file", "not a regular file (a folder, device, pipe or socket)")
        if st.st_size > max_bytes:
            return _too_large(st.st_size, max_bytes)
        try:
            data = _read_up_to(fd, max_bytes + 1, st.st_size)
        except OSError as exc:
            return Unusable("unreadable", exc.strerror or str(exc))
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # it grew after the check
        return _too_large(f"more than {max_bytes}", max_bytes)
    return data


def _read_up_to(fd: int, limit: int, expected: int) -> bytes:
    """At most `limit` bytes of fd. The first read asks for one byte more than the file's size, so that its
    buffer is no larger than the file (allocating a large block per file costs more than reading it): when it
    gives that size, the end is reached (one read per file). Any other short read is followed by a one-byte probe
    for the end, and a file still growing is read in doubling blocks."""
    parts, left, want = [], limit, expected + 1
    while left > 0:
        asked = min(left, want)
        block = os.read(fd, asked)
        if not block:
            break
        parts.append(block)
        left -= len(block)
        if len(block) == expected < asked and len(parts) == 1:
            break
        want = 1 if len(block) < asked else min(READ_BLOCK, 2 * asked)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _read_gcs(uri: str, max_bytes: int, size_hint: int, waited: Waited | None) -> bytes | Unusable:
    from google.api_core import exceptions as api

    if size_hint > max_bytes:
        return _too_large(size_hint, max_bytes)
    # The whole object, its CRC32C checked by the client; of a size unknown (a listing), at most one byte more
    # than the limit. One request per try: the object's retries and the process's throttle are the storage's.
    try:
        data = storage.read_throttled(uri, None if 0 < size_hint else max_bytes, waited)
    except api.NotFound:
        return Unusable("missing", f"{uri} does not exist")
    except (api.Forbidden, api.Unauthorized) as exc:
        return Unusable("unreadable", storage.problem(exc, uri))
    except api.RequestRangeNotSatisfiable:
        return b""  # an empty object asked for with a range
    except GaveUp as exc:  # still failing when its budget was spent: the run fails, naming the object
        raise TransientReadError(f"cannot read {uri}: {storage.problem(exc.last, uri)} "
                                 f"(failed {exc.tries} tries over {exc.seconds:.0f} s)") from exc.last
    except Exception as exc:  # noqa: BLE001 - anything else that is not a definite answer: may pass
        raise TransientReadError(f"cannot read {uri}: {storage.problem(exc, uri)}") from exc
    if len(data) > max_bytes:
        return _too_large(f"more than {max_bytes}", max_bytes)
    return data


T = TypeVar("T")
R = TypeVar("R")


def prefetched(items: Iterable[T], read: Callable[[T], R], size: Callable[[T], int], *,
               in_flight: int = READS_IN_FLIGHT, budget: int = BYTES_IN_FLIGHT) -> Iterator[tuple[T, R]]:
    """(item, read(item)) in the items' order, with up to `in_flight` reads (holding about `budget` bytes)
    running ahead of the one handed out. An exception of a read is raised when its item's turn comes."""
    pending: collections.deque[tuple[T, Future[R], int]] = collections.deque()
    queued = 0
    source = iter(items)
    exhausted = False
    while True:
        while not exhausted and len(pending) < in_flight and (not pending or queued < budget):
            item = next(source, None)
            if item is None:
                exhausted = True
                break
            cost = size(item) or UNKNOWN_SIZE
            pending.append((item, storage.io_threads("read", READS_IN_FLIGHT).submit(read, item), cost))
            queued += cost
        if not pending:
            return
        item, future, cost = pending.popleft()
        queued -= cost
        yield item, future.result()


def needs_prefetch(uri: str) -> bool:
    """Whether reads of this source gain from running ahead (remote objects; local files are read inline)."""
    return storage.is_gcs(uri)
