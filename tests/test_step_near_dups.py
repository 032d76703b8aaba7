"""The near-duplicate steps on their own (beam_jobs.pipeline.near_dups): encoded runs of generated photos with
planted copies (byte-identical, resized and re-compressed), their clusters, and what report, group and drop do
with them: findings, rejections naming the kept member, records moved byte for byte into the kept member's split."""
from __future__ import annotations

import hashlib
import random
from dataclasses import replace

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.util import assert_that, equal_to
from conftest import photo
from PIL import Image
from steps import (
    counters,
    created,
    encoded_runs,
    labels_of,
    laid_out,
    media_chunks,
    outputs,
    pipeline,
    run,
    step_config,
)

from beam_jobs.pipeline.near_dups import (
    ActOnClusters,
    BatchMembers,
    ClusterSignatures,
    FindNearDuplicates,
    MoveRecords,
    member_of,
    packed,
    run_members,
    signature_of,
)
from beam_jobs.pipeline.shards import PlanShards
from shard_utils.quality import findings
from shard_utils.quality.clusters import Member, find_clusters
from shard_utils.quality.member_batches import batch_of, signatures_of
from shard_utils.quality.signature import NEAR_DISTANCE, signature
from shard_utils.sharding.naming import ShardNaming
from shard_utils.storage import StorageError

PAIRS = {"dog/copy.jpg": "cat/img0000.jpg", "fish/small.jpg": "cat/img0001.jpg", "dog/img0002.jpg": "cat/big.jpg"}
SIZE = (96, 72)  # large enough for a 75 % copy at JPEG quality 60 to stay within NEAR_DISTANCE bits


def save(image: Image.Image, path, quality=90) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, "JPEG", quality=quality)


@pytest.fixture(scope="module")
def encoded(tmp_path_factory):
    """10 photos under cat/ and dog/, plus: dog/copy.jpg (cat/img0000's bytes), fish/small.jpg (cat/img0001 at
    75 %, quality 60: a label conflict) and cat/big.jpg (dog/img0002 at 150 %), encoded into two splits."""
    tmp_path = tmp_path_factory.mktemp("near")
    root = tmp_path / "in"
    for label, base in (("cat", 0), ("dog", 1000)):
        for i in range(5):
            save(photo(*SIZE, seed=base + i), root / label / f"img{i:04d}.jpg")
    (root / "dog" / "copy.jpg").write_bytes((root / "cat" / "img0000.jpg").read_bytes())
    save(photo(*SIZE, seed=1).resize((72, 54)), root / "fish" / "small.jpg", quality=60)
    save(photo(*SIZE, seed=1002).resize((144, 108)), root / "cat" / "big.jpg")
    config = step_config(tmp_path, root, "--splits", "train=0.5,validation=0.5", "--num-cores", "1")
    chunks = media_chunks(config)
    laid = laid_out(config, chunks)
    runs = encoded_runs(config, laid, labels_of(chunks))
    sigs = {str(p.relative_to(root)): signature(np.asarray(Image.open(p).convert("RGB"))) for p in root.rglob("*.jpg")}
    members = [member_of(f) for r in runs for _, fields in run_members(r) for f in fields]
    signed = [(packed(sigs[m.source_id]), m) for m in members]
    return config, laid, runs, signed, labels_of(chunks)


def test_a_runs_records_are_one_batch_signed_first_each_at_its_place(encoded):
    _, _, runs, _, _ = encoded
    for r in runs:
        entries = r.file.entries()
        ((raw, fields),) = run_members(r)
        n = len(raw) // 8
        assert sorted(f[3] for f in fields) == [(r.run, i) for i in range(len(entries))]
        assert [f[0] for f in fields] == [entries[f[3][1]].meta.source_id for f in fields]
        assert signatures_of((raw, fields)).tolist() == [signature_of(entries[f[3][1]].meta.phash) for f in fields[:n]]
        assert all(signature_of(entries[f[3][1]].meta.phash) is None for f in fields[n:])


def test_a_run_without_signatures_is_read_only_for_exact_copies(encoded):
    """Without --dedup a record without a signature is in no cluster: a run of only such records (a structural
    check's) gives no batch, and its records' metadata is not read; with --dedup every record is a member."""
    _, _, runs, _, _ = encoded
    for r in runs:
        assert r.tally.signed == sum(bool(e.meta.phash) for e in r.file.entries()) > 0
        assert list(run_members(r, exact=False)) == list(run_members(r, exact=True))
        unsigned = replace(r, tally=replace(r.tally, signed=0), file=replace(r.file, meta_path=r.file.meta_path + "x"))
        assert list(run_members(unsigned, exact=False)) == []
        with pytest.raises(StorageError):  # with --dedup its records are read
            list(run_members(unsigned, exact=True))


def split_of(signed, source_id: str) -> str:
    return next(m.split for _, m in signed if m.source_id == source_id)


def where(runs, split: str, run_: int, position: int) -> str:
    found = next(r for r in runs if (r.split, r.run) == (split, run_))
    return found.file.entries()[position].meta.source_id


def acted(signed, labels, mode: str, dedup=False):
    def build(p):
        clusters = created(p, "Signed", [batch_of(signed)]) | ClusterSignatures(NEAR_DISTANCE)
        out = clusters | ActOnClusters(mode, dedup, created(p, "Labels", labels))
        return {"dropped": out.dropped, "rejected": out.rejected, "findings": out.findings, "moved": out.moved,
                "cross_split": out.cross_split}
    return outputs(build)


def test_clusters_of_the_planted_copies_and_nothing_else(encoded):
    _, _, _, signed, _ = encoded
    clusters = find_clusters([(int.from_bytes(s, "big"), m) for s, m in signed], NEAR_DISTANCE)
    assert sorted(sorted(m.source_id for m in c.members) for c in clusters) == [
        ["cat/big.jpg", "dog/img0002.jpg"], ["cat/img0000.jpg", "dog/copy.jpg"], ["cat/img0001.jpg", "fish/small.jpg"]]


def test_report_lists_clusters_label_conflicts_and_leaks_and_drops_nothing(encoded):
    _, _, _, signed, labels = encoded
    out, result = acted(signed, labels, "report")
    assert out["dropped"] == out["rejected"] == out["moved"] == []
    near = sorted((f["sources"], f["splits"], f["labels"]) for f in out["findings"] if f["kind"] == "near_duplicate")
    assert near == sorted((sorted(pair), [split_of(signed, s) for s in sorted(pair)], names) for pair, names in (
        (("cat/big.jpg", "dog/img0002.jpg"), [["cat"], ["dog"]]),
        (("cat/img0000.jpg", "dog/copy.jpg"), [["cat"], ["dog"]]),
        (("cat/img0001.jpg", "fish/small.jpg"), [["cat"], ["fish"]])))
    conflicts = [f for f in out["findings"] if f["kind"] == "label_conflict"]
    assert len(conflicts) == 3 and all(findings.check(f) for f in out["findings"])
    leaking = sum(findings.leaks(f) for f in out["findings"] if f["kind"] == "near_duplicate")
    assert leaking == sum(len(set(s)) > 1 for _, s, _ in near) > 0  # this seed splits a pair across splits
    assert counters(result)["near_dup_clusters"] == 3


def test_drop_keeps_the_smallest_source_id_and_rejects_the_rest_naming_it(encoded):
    _, _, runs, signed, labels = encoded
    out, result = acted(signed, labels, "drop")
    assert sorted(where(runs, *d) for d in out["dropped"]) == ["dog/copy.jpg", "dog/img0002.jpg", "fish/small.jpg"]
    got = {r["source"]: (r["reason"], r["message"].split(" (")[0]) for r in out["rejected"]}
    assert got == {"dog/copy.jpg": ("duplicate", "same bytes as cat/img0000.jpg"),
                   "dog/img0002.jpg": ("near_duplicate", "a near-duplicate of cat/big.jpg"),
                   "fish/small.jpg": ("near_duplicate", "a near-duplicate of cat/img0001.jpg")}
    assert not any(findings.leaks(f) for f in out["findings"])  # the rejected copies are in no split
    assert counters(result)["rejected_near_duplicate"] == 2


def test_group_moves_each_copy_byte_for_byte_into_its_kept_members_split(encoded):
    config, laid, runs, signed, labels = encoded

    def build(p):
        runs_p = created(p, "Runs", runs)
        clusters = created(p, "Signed", [batch_of(signed)]) | ClusterSignatures(NEAR_DISTANCE)
        out = clusters | ActOnClusters("group", False, created(p, "Labels", labels))
        moved = runs_p | MoveRecords(out.moved, created(p, "Run", [run_info(config)]), config.run_part_bytes)
        plan = runs_p | PlanShards(config, created(p, "Layouts", laid["layouts"]), ShardNaming.for_build("tfrecord"),
                                   out.dropped, moved=moved)
        return {"moved": moved, "plans": plan["plans"], "findings": out.findings, "dropped": out.dropped}

    out, _ = outputs(build)
    movers = {copy: split_of(signed, kept) for copy, kept in PAIRS.items()
              if split_of(signed, copy) != split_of(signed, kept)}
    assert movers, "this seed leaves every pair in one split"
    moved_ids = {e.meta.source_id: (f.split, e) for f in out["moved"] for e in f.entries()}
    assert {k: v[0] for k, v in moved_ids.items()} == movers
    for f in out["moved"]:  # each moved record's bytes are the ones its own run holds
        entries = f.entries()
        for i, e in enumerate(entries):
            start = entries[i - 1].end if i else 0
            src = next(r for r in runs
                       if r.file and any(x.meta.source_id == e.meta.source_id for x in r.file.entries()))
            se = src.file.entries()
            j = next(k for k, x in enumerate(se) if x.meta.source_id == e.meta.source_id)
            assert f.read(start, e.end) == src.file.read(se[j - 1].end if j else 0, se[j].end)
    (plans,) = out["plans"]
    total = {s: sum(r.file.count for r in runs if r.split == s and r.file) for s in plans}
    for s, plan in plans.items():
        out_of = sum(split_of(signed, copy) == s for copy in movers)
        assert plan.num_records == total[s] - out_of + sum(t == s for t in movers.values())
        assert max(plan.sizes) - min(plan.sizes) <= 1
    assert not any(findings.leaks(f) for f in out["findings"])


def test_byte_copies_with_dedup_are_dropped_in_any_mode_and_the_datasets_record_wins(encoded):
    """--dedup: same bytes are a distance-0 cluster, signed or not; an append's own record is kept first."""
    _, _, runs, signed, labels = encoded
    old_sha = hashlib.sha256(b"not these bytes").hexdigest()
    twin = next(m for _, m in signed if m.source_id == "dog/img0001.jpg")
    existing = [(None, Member("old/photo.jpg", "train", (0,), None, twin.sha256)),
                (None, Member("old/other.jpg", "validation", (0,), None, old_sha))]
    p = pipeline()
    clusters = created(p, "Runs", runs) | FindNearDuplicates(NEAR_DISTANCE, created(p, "Old", existing), exact=True)
    out = clusters | ActOnClusters("report", True, created(p, "Labels", labels))
    kept = split_of(signed, "cat/img0000.jpg")
    assert_that(out.rejected | beam.Map(lambda r: (r["source"], r["reason"], r["message"])), equal_to([
        ("dog/copy.jpg", "duplicate", f"same bytes as cat/img0000.jpg (kept, in split {kept})"),
        ("dog/img0001.jpg", "duplicate", "same bytes as old/photo.jpg (already in the dataset, in split train)")]))
    assert_that(out.dropped | beam.Map(lambda d: where(runs, *d)), equal_to(["dog/copy.jpg", "dog/img0001.jpg"]),
                label="Dropped")
    run(p)


def test_an_append_brings_a_near_duplicate_of_a_validation_photo_into_validation(encoded):
    _, _, _, signed, labels = encoded
    new = [(s, m) for s, m in signed if m.source_id in ("fish/small.jpg", "dog/img0003.jpg")]
    original = signature(np.asarray(photo(*SIZE, seed=1)))
    existing = [(packed(original), Member("old/photo.jpg", "validation", (0,), None, "x" * 64))]
    grouped, _ = acted(new + existing, labels, "group")
    moved = [(t, m.source_id) for t, m in grouped["moved"]]
    assert moved == ([("validation", "fish/small.jpg")] if split_of(signed, "fish/small.jpg") == "train" else [])
    (f,) = [f for f in grouped["findings"] if f["kind"] == "near_duplicate"]
    assert f["splits"] == ["validation", "validation"] and f["in_dataset"] == ["old/photo.jpg"]
    dropped, _ = acted(new + existing, labels, "drop")
    assert [(r["source"], r["reason"]) for r in dropped["rejected"]] == [("fish/small.jpg", "near_duplicate")]
    assert "already in the dataset, in split validation" in dropped["rejected"][0]["message"]


def run_info(config):
    from steps import run_info as info

    return info(config)


def synthetic(n: int, seed: int):
    """n random signatures, a tenth of them with a copy a few bits away, and 30 records of one flat signature."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        s = rng.getrandbits(64)
        out.append((s, Member(f"a{i:05d}", "train", (i % 3,), (0, i))))
        if i % 10 == 0:
            for b in rng.sample(range(64), rng.randrange(0, 8)):
                s ^= 1 << b
            out.append((s, Member(f"b{i:05d}", "validation", (i % 2,), (1, i))))
    out += [(0, Member(f"flat{i:02d}", "train", (), (2, i))) for i in range(30)]
    return out


@pytest.mark.slow
def test_the_multi_process_runner_finds_the_clusters_of_one_process():
    from apache_beam.options.pipeline_options import PipelineOptions

    records = synthetic(400, 7)
    expected = sorted(tuple(m.source_id for m in c.members) for c in find_clusters(records, NEAR_DISTANCE, cap=8))
    assert len(expected) > 30
    for args in ([], ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]):
        p = beam.Pipeline(runner="FnApiRunner", options=PipelineOptions(args))
        got = (p | beam.Create([(packed(s), m) for s, m in records])  # the workers cannot import this folder
               | beam.Reshuffle()  # bundles spread over the workers, cut by a buffer of 100 and at its end
               | beam.ParDo(BatchMembers(30))
               | ClusterSignatures(NEAR_DISTANCE, cap=8, buffer=100)
               | beam.Map(lambda c: tuple(m.source_id for m in c.members)))
        assert_that(got, equal_to(expected))
        run(p)
