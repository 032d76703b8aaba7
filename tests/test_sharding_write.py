"""Encoding runs and writing shards without Beam: every shard, written twice or twice at once, is the same."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest
from conftest import write_images

from shard_utils.media.encode import EncodeSettings
from shard_utils.inputs import MediaItem
from shard_utils.sharding import layout as lay
from shard_utils.sharding.encode_run import RunTask, encode_run, item_order
from shard_utils.sharding.shards import RunCount, plan_split_shards
from shard_utils.sharding.writer import ShardTask, write_shard
from shard_utils.format.layout import shard_name


def encoded_runs(tmp_path: Path, folder: str, *, shards: int, bits: int = 16):
    """30 images encoded into the runs of a layout of `shards` shards (2 cores), under `folder`."""
    paths = write_images(tmp_path / "in", {"a": 15, "b": 15})
    items = [MediaItem(f"{p.parent.name}/{p.name}", str(p), p.stat().st_size, (p.parent.name,)) for p in paths]
    settings = EncodeSettings(label_ids={"a": 0, "b": 1})
    keys = sorted(item_order(i, settings.seed) for i in items)
    totals = lay.ListingTotals(keys=lay.BucketCounts(bits))
    totals.add([k for k, _ in keys], [i.size for i in items])
    layout = lay.plan_layout("train", totals, lay.SizeSample(), num_cores=2, num_hosts=1, target_shard_bytes=1,
                             forced=shards)
    by_bucket: dict[int, list] = {}
    for k in keys:
        by_bucket.setdefault(lay.bucket_of(k[0], bits), []).append(k)
    picks = [p for b, ks in by_bucket.items() if b in layout.boundary_buckets
             for p in lay.BoundaryFinder.picks(layout, b, ks)]
    layout = lay.BoundaryFinder.complete(layout, picks)
    by_run: dict[int, list] = {}
    for item in items:
        by_run.setdefault(layout.run_of(item_order(item, settings.seed)), []).append(item)
    runs = {r: encode_run(RunTask("train", r, tuple(by_run[r])), settings, folder, chunk_bytes=4096).file
            for r in range(layout.num_runs)}
    planned = plan_split_shards(layout, [RunCount(r, f.count) for r, f in runs.items()], num_cores=2, num_hosts=1,
                                forced=shards)
    tasks = [ShardTask(s, shard_name("train", s.shard, s.num_shards), s.shard, {p.run: runs[p.run] for p in
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

    tasks = encoded_runs(tmp_path, folders[2], shards=16)
    results: dict[str, list] = {}
    errors = []

    def attempt(task):
        try:
            results.setdefault(task.name, []).append(write_shard(task, folders[2]))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    for group in ([t for t in tasks if not t.plan.prefix], [t for t in tasks if t.plan.prefix]):
        threads = [threading.Thread(target=attempt, args=(t,)) for t in group for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert errors == []
    assert {name: shard_bytes(rs[0]) for name, rs in results.items()} == once
    assert all(rs[0] == rs[1] for rs in results.values())
