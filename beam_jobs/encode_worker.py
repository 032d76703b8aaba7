"""Encoding in a local worker process that writes its own fragments: the records never travel back to the build.

`encode_run` is the other way: items of one planned shard, in key order, encoded straight into one
file (`write_once`), which becomes the shard itself when the plan holds.

Each worker keeps a fragment buffer per run across its tasks and writes it as one sorted fragment
when it fills or when the build asks (at the end of the encode step). The build receives only
rejects, counts and written fragments; a task whose records die with their worker before they are
written is replayed elsewhere by the pool (`LocalPool.submit(keeps=True)`). No Beam here.
"""
from __future__ import annotations

import array
import os
import signal
import uuid
from dataclasses import dataclass

from shard_utils import plan, storage, write_once
from shard_utils.encode import EncodeSettings, Encoded, encode_batch, encode_item
from shard_utils.fragments import FragmentBuffer
from shard_utils.inputs import MediaItem

from . import shard_writer

SEGV_ON = "TPU_SHARDS_SEGV_ON"  # test hook: a worker given this source id dies as a crashing decoder would
_buffers: dict[tuple[str, int], FragmentBuffer] = {}  # (run folder, limit) -> this worker's buffer


@dataclass(frozen=True)
class EncodeTally:
    """What a task encoded, for the build's counters and progress."""

    records: int
    passed_through: int
    trailers: int
    trailer_bytes: int


class _Counts:
    """A task's records counted as they are made; `tally()` is what goes back to the build."""

    __slots__ = ("records", "passed", "trailers", "trailer_bytes")

    def __init__(self) -> None:
        self.records = self.passed = self.trailers = self.trailer_bytes = 0

    def add(self, outcome: Encoded) -> None:
        self.records += 1
        self.passed += outcome.passed_through
        self.trailers += bool(outcome.trailer_bytes)
        self.trailer_bytes += outcome.trailer_bytes

    def tally(self) -> EncodeTally:
        return EncodeTally(self.records, self.passed, self.trailers, self.trailer_bytes)


def _crash_if_asked(items: list[MediaItem]) -> None:
    """The SEGV_ON test hook."""
    if any(item.source_id == os.environ.get(SEGV_ON) for item in items):
        os.kill(os.getpid(), signal.SIGSEGV)


def encode_and_keep(items: list[MediaItem], settings: EncodeSettings, folder: str, limit: int,
                    replay: bool = False) -> tuple[list, bool]:
    """Encode items into this worker's buffer, writing it when it reaches `limit` bytes.

    Returns ([rejects..., FragmentInfo..., EncodeTally], released): released when nothing is left in
    the buffer. A replay (the first run's records were lost) returns only the fragments it writes.
    """
    _crash_if_asked(items)
    buffer = _buffers.setdefault((folder, limit), FragmentBuffer(limit))
    out: list = []
    counts = _Counts()
    for outcome in encode_batch(items, settings):
        if not isinstance(outcome, Encoded):
            if not replay:
                out.append(outcome)
            continue
        buffer.add(outcome)
        counts.add(outcome)
    if buffer.size >= limit:
        out.extend(buffer.flush(folder))
    if not replay:
        out.append(counts.tally())
    return out, not buffer.records


def flush_kept(items: list, folder: str, limit: int) -> tuple[list, bool]:
    """Write what this worker holds for the run as one fragment: ([FragmentInfo] or [], released)."""
    buffer = _buffers.pop((folder, limit), None)
    return (list(buffer.flush(folder)) if buffer is not None else []), True


def encode_run(items: list[MediaItem], settings: EncodeSettings, folder: str, bucket_bits: int,
               shard: int | None = None) -> list:
    """Encode items (one split, key order) into one run file under `folder`, checksummed as it is written.

    Returns [rejects..., WrittenRun (when any record was made), EncodeTally]. The file may become a shard
    as it is: its flush to disk starts now, and the shard writer waits for it (storage.sync).
    """
    _crash_if_asked(items)
    name = uuid.uuid4().hex
    path, meta_path = storage.join(folder, "runs", name + ".records"), storage.join(folder, "runs", name + ".meta")
    out: list = []
    metas, lengths, totals = [], array.array("Q"), plan.SplitTotals()
    digest = storage.Digest()
    counts = _Counts()
    split = None
    with storage.open_write(path, durable=False) as f:  # made durable in the background (start_sync below)
        for item in items:
            outcome = encode_item(item, settings)
            if not isinstance(outcome, Encoded):
                out.append(outcome)
                continue
            if split is not None and outcome.split != split:
                raise plan.InternalError(f"a run holds records of splits {split!r} and {outcome.split!r}")
            split = outcome.split
            f.write(outcome.framed)
            digest.update(outcome.framed)
            meta = outcome.meta
            metas.append(meta)
            lengths.append(meta.length)
            totals.add(meta.sort_key, meta.length, bucket_bits)
            counts.add(outcome)
    if metas:  # a run of rejects only leaves an empty file in the run's temporary folder
        storage.start_sync(path)  # the disk takes it while this worker encodes the next run
        write_once.write_metas(meta_path, metas)
        described = None if shard is None else shard_writer.index_run(shard, metas, settings.extras, path + ".avro")
        out.append(write_once.WrittenRun(split, path, meta_path, metas[0].order, lengths, totals, digest.size,
                                         digest.crc32c, digest.sha256, described))
    out.append(counts.tally())
    return out
