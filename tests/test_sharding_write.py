"""Encoding runs and writing shards without Beam: every shard, written twice or twice at once, is the same, and
so is every shard of the whole step run again or several times at once."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest
from conftest import write_images

from shard_utils.format.shard_formats import TFRECORD
from shard_utils.inputs import MediaItem
from shard_utils.media.encode import EncodeSettings
from shard_utils.sharding import run_plan
from shard_utils.sharding.encode_run import RunTask, encode_run, item_order
from shard_utils.sharding.shards import RunCount, plan_split_shards
from shard_utils.sharding.writer import ShardTask, write_shard


def encoded_runs(tmp_path: Path, folder: str, *, shards: int, bits: int = 16):
    """30 images encoded into the runs of a layout of `shards` shards (2 cores), under `folder`."""
    paths = write_images(tmp_path / "in", {"a": 15, "b": 15})
    items = [MediaItem(f"{p.parent.name}/{p.name}", str(p), p.stat().st_size, (p.parent.name,)) for p in paths]
    settings = EncodeSettings(label_ids={"a": 0, "b": 1})
    keys = sorted(item_order(i, settings.seed) for i in items)
    totals = run_plan.ListingTotals(keys=run_plan.BucketCounts(bits))
    totals.add([k for k, _ in keys], [i.size for i in items])
    layout = run_plan.plan_layout("train", totals, run_plan.SizeSample(), num_cores=2, num_hosts=1,
                                  target_shard_bytes=1, forced=shards)
    by_bucket: dict[int, list] = {}
    for k in keys:
        by_bucket.setdefault(run_plan.bucket_of(k[0], bits), []).append(k)
    picks = [p for b, ks in by_bucket.items() if b in layout.boundary_buckets
             for p in run_plan.BoundaryFinder.picks(layout, b, ks)]
    layout = run_plan.BoundaryFinder.complete(layout, picks)
    by_run: dict[int, list] = {}
    for item in items:
        by_run.setdefault(layout.run_of(item_order(item, settings.seed)), []).append(item)
    runs = {r: encode_run(RunTask("train", r, tuple(by_run[r])), settings, folder, chunk_bytes=4096).file
            for r in range(layout.num_runs)}
    planned = plan_split_shards(layout, [RunCount(r, f.count) for r, f in runs.items()], num_cores=2, num_hosts=1,
                                forced=shards)
    tasks = [ShardTask(s, TFRECORD.shard_name("train", s.shard, s.num_shards), s.shard, {p.run: runs[p.run] for p in
                                                                                   s.pieces}) for s in planned.shards]
    return tasks


def shard_bytes(result) -> bytes:
    from shard_utils import storage

    return storage.read_bytes(result.temp_path)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["local", "gcs"])
def test_each_shard_written_twice_or_twice_at_once_is_the_same(request, tmp_path, where):
    if where == "local":
        folders = [str(tmp_path / f"tmp{i}") for i in range(3)]
    else:
        gcs = request.getfixturevalue("gcs")
        bucket = gcs.new_bucket("writes")
        folders = [f"gs://{bucket}/tmp{i}" for i in range(3)]
    first_tasks = sorted(encoded_runs(tmp_path, folders[0], shards=16), key=lambda t: t.plan.prefix)  # copies first
    once = {t.name: shard_bytes(write_shard(t, folders[0])) for t in first_tasks}
    tasks = encoded_runs(tmp_path, folders[1], shards=16)
    assert any(t.plan.prefix for t in tasks) and any(not t.plan.prefix for t in tasks)
    copies = [t for t in tasks if not t.plan.prefix]
    prefixes = [t for t in tasks if t.plan.prefix]
    twice = {}
    for group in (copies, prefixes):  # as WriteShards orders them: copies read the runs' tails first
        for task in group:
            first = write_shard(task, folders[1])
            again = write_shard(task, folders[1])
            assert first == again
            twice[task.name] = shard_bytes(again)
    assert twice == once
    # The whole step again, its prefixes taken: locally the copies read the tails saved beside the runs' files.
    assert {t.name: shard_bytes(write_shard(t, folders[1])) for t in copies + prefixes} == once

    tasks = sorted(encoded_runs(tmp_path, folders[2], shards=16), key=lambda t: t.plan.prefix)
    results: dict[str, list] = {}
    errors = []
    took_prefix = threading.Event()

    def whole_step(order: list, after: threading.Event | None = None, then: threading.Event | None = None):
        try:
            if after is not None:
                assert after.wait(60)
            for task in order:
                results.setdefault(task.name, []).append(write_shard(task, folders[2]))
                if then is not None and task.plan.prefix:
                    then.set()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    # Attempts at the whole step (copies first, prefixes in any order) at once; the last one's copies start once
    # the first has taken a prefix of the run they read.
    copies, prefixes = [t for t in tasks if not t.plan.prefix], [t for t in tasks if t.plan.prefix]
    attempts = [(copies + prefixes[::-1], None, took_prefix), (tasks, None, None), (tasks, took_prefix, None)]
    threads = [threading.Thread(target=whole_step, args=attempt) for attempt in attempts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert {name: shard_bytes(rs[0]) for name, rs in results.items()} == once
    assert all(rs[0] == r for rs in results.values() for r in rs) and {len(rs) for rs in results.values()} == {3}


def test_a_run_whose_file_became_a_shard_is_read_from_its_saved_tail(tmp_path):
    """Locally, taking a prefix moves the run's file and cuts it; its tail is saved first, so a copy that finds
    the file gone, or cut under it by an attempt running at the same time, reads the tail instead."""
    import os

    from shard_utils import storage
    from shard_utils.media.encode import RecordMeta
    from shard_utils.sharding.runs import TAIL_SUFFIX, RunWriter, move_prefix

    writer = RunWriter(str(tmp_path / "tmp"), "train", 0)
    data = [bytes([i]) * (100 + i) for i in range(5)]
    for i, framed in enumerate(data):
        writer.add(framed, RecordMeta(i, f"s{i}", len(framed), (0,), "", 1, 1))
    run = writer.close()
    entries = run.entries()
    cut, whole = entries[1].end, b"".join(data)
    path = run.parts[0][0]
    os.truncate(path, cut + 7)  # as an attempt that saved the tail and is cutting the file finds it
    with pytest.raises(storage.StorageError, match="short read"):
        run.read(cut, run.num_bytes)  # no tail saved: the bytes are gone
    os.truncate(path, 0)
    with open(path, "wb") as f:
        f.write(whole)
    move_prefix(run, entries, 2, str(tmp_path / "shard"))
    assert (tmp_path / "shard").read_bytes() == whole[:cut] and not os.path.exists(path)
    assert run.read(cut, run.num_bytes) == whole[cut:]
    assert run.read(entries[2].end, entries[3].end) == data[3]
    move_prefix(run, entries, 2, str(tmp_path / "shard"))  # taken again: the same shard, the tail kept
    assert (tmp_path / "shard").read_bytes() == whole[:cut] and run.read(cut, run.num_bytes) == whole[cut:]
    with open(path, "wb") as f:  # a file cut under a reader after its tail was saved
        f.write(whole[:cut])
    assert run.read(cut, run.num_bytes) == whole[cut:]
    assert os.path.getsize(path + TAIL_SUFFIX) == 8 + len(whole) - cut


def test_a_local_run_written_in_blocks_holds_every_record_in_order(tmp_path):
    """Records are written in blocks of about LOCAL_BLOCK_BYTES: a run spanning several blocks (one record
    larger than a block among them) holds exactly its records' bytes, and each entry's checksums are those
    of the run up to its record's end."""
    import hashlib

    import google_crc32c

    from shard_utils.media.encode import RecordMeta
    from shard_utils.sharding.runs import LOCAL_BLOCK_BYTES, RunWriter

    sizes = [LOCAL_BLOCK_BYTES // 3] * 5 + [LOCAL_BLOCK_BYTES + 5, 17, LOCAL_BLOCK_BYTES // 2]
    data = [bytes([i]) * size for i, size in enumerate(sizes)]
    writer = RunWriter(str(tmp_path / "tmp"), "train", 3)
    for i, framed in enumerate(data):
        writer.add(framed, RecordMeta(i, f"s{i}", len(framed), (0,), "", 1, 1))
    run = writer.close()
    whole = b"".join(data)
    assert Path(run.parts[0][0]).read_bytes() == whole and (run.count, run.num_bytes) == (len(data), len(whole))
    ends = [sum(sizes[:i + 1]) for i in range(len(sizes))]
    assert [(e.end, e.crc32c, e.sha256) for e in run.entries()] == [
        (end, google_crc32c.value(whole[:end]), hashlib.sha256(whole[:end]).digest()) for end in ends]
