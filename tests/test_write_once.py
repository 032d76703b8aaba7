"""The write-once path: runs planned from the listing, and shards taken from them, against the fragment path."""
import array
import re

import pytest
from conftest import run_cli, run_job, write_images
from hypothesis import given, settings, strategies as st
from readers import rejected, shard_bytes

from beam_jobs import build_shards
from shard_utils import plan, storage, write_once
from shard_utils.inputs import MediaItem
from shard_utils.manifest import load


def _items(names_sizes):
    return [MediaItem(source_id=name, uri=f"/in/{name}", size=size, labels=("a",)) for name, size in names_sizes]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.text("abcdef/", min_size=1, max_size=8), st.integers(0, 5000)), max_size=120,
                unique_by=lambda t: t[0]),
       st.sampled_from([(("train", 1.0),), (("train", 0.7), ("validation", 0.3))]),
       st.integers(1, 9), st.integers(1, 4), st.one_of(st.none(), st.integers(1, 40)))
def test_runs_hold_every_item_once_in_key_order_and_one_split_each(names_sizes, splits, workers, cores, forced):
    items = _items(names_sizes)
    tasks = write_once.run_tasks(items, splits=splits, seed=3, num_cores=cores, num_hosts=1,
                                 target_shard_bytes=20_000, forced=forced, workers=workers)
    assert all(task.items for task in tasks)
    assert sorted(i.source_id for t in tasks for i in t.items) == sorted(i.source_id for i in items)
    for split, _ in splits:
        mine = [i for i in items if write_once.order_of(i, splits, 3)[0] == split]
        ordered = sorted(mine, key=lambda i: write_once.order_of(i, splits, 3)[1])
        assert [i for t in tasks if t.split == split for i in t.items] == ordered
    for split, _ in splits:  # a run that is all of a guessed shard says which: 0, 1, ... where every run is one
        guessed = [t.shard for t in tasks if t.split == split]
        named = [g for g in guessed if g is not None]
        assert named == sorted(set(named))
        assert not named or len(named) == len(guessed) == named[-1] + 1 or None in guessed
    if items and forced is None and len(items) >= cores:  # enough shards for the workers: a run is a guessed shard
        per_split = {s: [len(t.items) for t in tasks if t.split == s] for s, _ in splits}
        if sum(len(v) for v in per_split.values()) >= 2 * workers:
            for sizes in per_split.values():
                assert max(sizes, default=0) - min(sizes, default=0) <= 1


def _run(split, first_key, lengths, name, guessed=None):
    totals = plan.SplitTotals()
    for i, n in enumerate(lengths):
        totals.add(first_key + i, n, 16)
    described = None if guessed is None else write_once.RunIndex(guessed, f"/runs/{name}.avro", (), ())
    return write_once.WrittenRun(split, f"/runs/{name}", f"/runs/{name}.meta", (first_key, name),
                                 array.array("Q", lengths), totals, sum(lengths), "crc", "sha", described)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(1, 50), min_size=1, max_size=12), min_size=1, max_size=10), st.data())
def test_each_shard_takes_its_ranks_from_the_runs_in_order(runs_lengths, data):
    guesses = data.draw(st.lists(st.one_of(st.none(), st.integers(0, 12)), min_size=len(runs_lengths),
                                 max_size=len(runs_lengths)))
    runs = [_run("train", 1000 * i, lengths, f"r{i}", guess)
            for i, (lengths, guess) in enumerate(zip(runs_lengths, guesses))]
    total = sum(len(x) for x in runs_lengths)
    count = data.draw(st.integers(1, total))
    split_plan = plan.SplitPlan("train", total, sum(map(sum, runs_lengths)), count)
    shards = write_once.assign(list(reversed(runs)), {"train": split_plan})  # any order in, key order out
    assert [s.shard for s in shards] == list(range(count))
    taken = []
    for shard, size in zip(shards, split_plan.sizes):
        assert sum(p.count for p in shard.pieces) == size
        for p in shard.pieces:
            run = next(r for r in runs if r.path == p.path)
            assert p.start == sum(run.lengths[:p.first]) and p.length == sum(run.lengths[p.first:p.first + p.count])
            taken += [(p.path, p.first + k) for k in range(p.count)]
        one_whole_run = len(shard.pieces) == 1 and shard.pieces[0].count == len(
            next(r for r in runs if r.path == shard.pieces[0].path).lengths)
        assert shard.whole == one_whole_run
        assert (shard.num_bytes, shard.sha256) == ((shard.pieces[0].length, "sha") if shard.whole else (0, ""))
        run = next(r for r in runs if r.path == shard.pieces[0].path)
        made_as_this_shard = shard.whole and run.described is not None and run.described.shard == shard.shard
        assert shard.described is (run.described if made_as_this_shard else None)  # its index part is this shard's
    assert taken == [(r.path, k) for r in runs for k in range(r.count)]


def test_a_run_written_as_its_shard_gives_the_shard_and_index_the_writer_would_make_of_it(tmp_path):
    """encode_run indexes a run as the shard it was guessed to be; the writer takes that part instead of
    indexing the run again: the same shard result and the same index bytes."""
    import dataclasses

    from beam_jobs import encode_worker, shard_writer
    from beam_jobs.config import BuildConfig, RunInfo
    from shard_utils.encode import EncodeSettings

    src = tmp_path / "in"
    paths = write_images(src, {"a": 5, "b": 4})
    items = [MediaItem(source_id=str(p.relative_to(src)), uri=str(p), size=p.stat().st_size,
                       labels=(p.parent.name,)) for p in paths]
    items.sort(key=lambda i: write_once.order_of(i, (("train", 1.0),), 0)[1])
    config = BuildConfig(input=str(src), output=str(tmp_path / "out"), temp_root=str(tmp_path / "tmp"), run_id="r1")
    run = RunInfo("r1", config.temp_dir("r1"), "2026-01-01T00:00:00+00:00")
    out = encode_worker.encode_run(items, EncodeSettings(label_ids={"a": 0, "b": 1}), run.temp_dir, 16, 2)
    written = next(o for o in out if isinstance(o, write_once.WrittenRun))
    assert written.described.shard == 2 and written.described.classes == ((0, 5), (1, 4))
    (task,) = write_once.assign([written], {"train": plan.SplitPlan("train", 9, written.num_bytes, 1)})
    assert task.whole and task.described is None  # shard 0 of the real plan, not shard 2 it was indexed as
    as_guessed = dataclasses.replace(task, shard=2, num_shards=4)  # the shard it was written as
    fast = shard_writer.write_run_shard(dataclasses.replace(as_guessed, described=written.described), config, run)
    slow = shard_writer.write_run_shard(as_guessed, config, run)
    assert fast.result.index_part == written.described.path != slow.result.index_part
    assert dataclasses.replace(fast.result, index_part="") == dataclasses.replace(slow.result, index_part="")
    assert storage.read_bytes(fast.result.index_part) == storage.read_bytes(slow.result.index_part)


def test_assign_refuses_runs_that_do_not_add_up_to_the_plan():
    runs = [_run("train", 0, [10, 10], "r0")]
    with pytest.raises(plan.InternalError, match="the runs hold 2 records, the plan 3"):
        write_once.assign(runs, {"train": plan.SplitPlan("train", 3, 30, 1)})


def _fragment_path(monkeypatch, *args):
    monkeypatch.setattr(build_shards, "WRITE_ONCE", False)
    try:
        return run_job(*args)
    finally:
        monkeypatch.setattr(build_shards, "WRITE_ONCE", True)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_write_once_gives_the_fragment_paths_bytes_with_rejects_and_two_splits(tmp_path, monkeypatch, workers):
    src = tmp_path / "in"
    write_images(src, {"a": 23, "b": 19})
    (src / "a" / "img0003.jpg").write_bytes(b"not a jpeg")
    (src / "b" / "img0011.jpg").write_bytes((src / "b" / "img0012.jpg").read_bytes()[:300])  # truncated
    opts = ["--splits", "train=0.6,validation=0.4", "--num-cores", "2", "--workers", workers]
    once = run_job(src, tmp_path / "once", *opts)
    fragments = _fragment_path(monkeypatch, src, tmp_path / "fragments", *opts)
    assert shard_bytes(tmp_path / "once") == shard_bytes(tmp_path / "fragments")
    for split in ("train", "validation"):
        assert once.splits[split] == fragments.splits[split]
        assert (tmp_path / "once" / f"{split}.index.avro").read_bytes() == \
            (tmp_path / "fragments" / f"{split}.index.avro").read_bytes()
    assert rejected(tmp_path / "once") == rejected(tmp_path / "fragments") == {
        "a/img0003.jpg": "not_image", "b/img0011.jpg": "corrupt"}


def test_a_missed_guess_is_copied_into_the_real_plan(tmp_path, monkeypatch):
    """PNGs re-encoded to JPEG are far smaller than their files: the guess from file sizes plans more shards
    than the records fill, so every shard is copied from runs, and the bytes are still the fragment path's."""
    src = tmp_path / "in"
    write_images(src, {"a": 30, "b": 30}, fmt="PNG", ext="png")
    opts = ["--target-shard-mb", "0.05", "--num-cores", "2", "--workers", "2"]
    once = run_job(src, tmp_path / "once", *opts)
    fragments = _fragment_path(monkeypatch, src, tmp_path / "fragments", *opts)
    guessed = write_once.guess_shards(_items((p.name, p.stat().st_size) for p in src.rglob("*.png")), num_cores=2,
                                      num_hosts=1, target_shard_bytes=int(0.05 * plan.MB), forced=None)
    assert guessed > len(once.splits["train"].shards)  # the guess missed
    assert shard_bytes(tmp_path / "once") == shard_bytes(tmp_path / "fragments")
    assert once.splits == fragments.splits


def _counters(stdout: str) -> dict[str, int]:
    line = next(line for line in stdout.splitlines() if line.strip().startswith("counters:"))
    return {name: int(n) for name, n in re.findall(r"(\w+) (\d+)", line)}


def test_clean_jpegs_are_written_once_and_a_reject_makes_later_shards_copies(tmp_path):
    src = tmp_path / "in"
    write_images(src, {"a": 16, "b": 16})
    done = run_cli("build", "--input", src, "--output", tmp_path / "clean", "--num-cores", "4", "--workers", "2")
    assert done.returncode == 0, done.stderr
    counters = _counters(done.stdout)
    assert counters["shard_bytes_copied"] == 0 and counters["shards_written"] == 4
    (src / "a" / "img0005.jpg").write_bytes(b"broken")
    done = run_cli("build", "--input", src, "--output", tmp_path / "reject", "--num-cores", "4", "--workers", "2")
    assert done.returncode == 0, done.stderr
    m = load(str(tmp_path / "reject"))
    copied = _counters(done.stdout)["shard_bytes_copied"]
    assert 0 < copied <= m.splits["train"].num_bytes  # the shards after the reject's place moved, at least


def test_a_listing_without_sizes_is_guessed_from_a_sample_of_its_files(tmp_path):
    """A listing gives no file sizes: the guess stats a sample, so its runs are still the shards."""
    src = tmp_path / "in"
    paths = write_images(src, {"a": 30, "b": 30})
    listing = tmp_path / "list.csv"
    listing.write_text("path,label\n" + "".join(f"{p.relative_to(src).as_posix()},{p.parent.name}\n" for p in paths))
    items = [MediaItem(source_id=p.name, uri=str(p), size=0, labels=("a",)) for p in paths]
    assert write_once.source_bytes(items) == sum(p.stat().st_size for p in paths)  # 60 files: every one sampled
    done = run_cli("build", "--input", src, "--listing", listing, "--output", tmp_path / "out", "--num-cores", "2",
                   "--workers", "2", "--target-shard-mb", "0.02")
    assert done.returncode == 0, done.stderr
    m = load(str(tmp_path / "out"))
    assert len(m.splits["train"].shards) > 2  # more than the guess from no sizes at all would make
    assert _counters(done.stdout)["shard_bytes_copied"] == 0


def test_sizes_a_listing_leaves_out_are_sampled_on_a_bucket_too(gcs, tmp_path):
    bucket = gcs.new_bucket("sizes")
    sizes = [1000 + 37 * i for i in range(40)]
    items = []
    for i, n in enumerate(sizes):
        uri = f"gs://{bucket}/img{i:02d}.jpg"
        storage.write_bytes(uri, b"x" * n)
        items.append(MediaItem(source_id=f"img{i:02d}.jpg", uri=uri, size=0, labels=("a",)))
    items.append(MediaItem(source_id="gone.jpg", uri=f"gs://{bucket}/gone.jpg", size=0, labels=("a",)))
    sampled = sizes[:write_once.GCS_SIZE_SAMPLE]  # at most that many requests
    assert write_once.source_bytes(items) == sum(sampled) * 41 // len(sampled)
    walked = [MediaItem(source_id="w.jpg", uri="/nowhere/w.jpg", size=5000, labels=("a",))]
    assert write_once.source_bytes(walked + items[:1]) == 5000 + sizes[0]  # known sizes count as they are
