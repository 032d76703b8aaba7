"""The core job on the real Beam runner: balance, determinism, labels, splits, accounting."""
import contextlib
import io
import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import install_faults, run_cli, run_job, write_images
from readers import all_records, by_source, dataset_files, records, rejected, shard_bytes

from shard_utils.errors import PlanError
from shard_utils.format import schema
from shard_utils.format.manifest import load
from shard_utils.format.order import choose_split, sort_key
from shard_utils.format.shard_formats import TFRECORD
from shard_utils.sharding import plan


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> SimpleNamespace:
    """The `images` fixture's folder built once with the default options, for the tests that only read it."""
    base = tmp_path_factory.mktemp("built")
    write_images(base / "images", {"cat": 12, "dog": 12, "fish": 12})
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        m = run_job(base / "images", base / "out")
    return SimpleNamespace(images=base / "images", out=base / "out", manifest=m, printed=printed.getvalue())


@pytest.mark.slow
def test_shards_are_balanced_multiples_of_cores_and_accounted(built):
    out, m = built.out, built.manifest
    shards = m.splits["train"].shards
    assert [s.path for s in shards] == [TFRECORD.shard_name("train", i, 8) for i in range(8)]
    counts = [len(records(out / s.path)) for s in shards]
    assert counts == [s.num_records for s in shards] == plan.shard_sizes(36, 8)
    assert max(counts) - min(counts) <= 1 and min(counts) > 0
    assert m.files_seen == 36 == m.splits["train"].num_records
    assert m.labels == ["cat", "dog", "fish"] and m.splits["train"].class_counts == {"cat": 12, "dog": 12, "fish": 12}
    assert sorted(p.name for p in out.iterdir()) == sorted([s.path for s in shards] + dataset_files())
    assert (out / "rejected.jsonl").read_text() == "" and m.quality["path"] == "quality.jsonl"
    assert [s.num_bytes for s in shards] == [(out / s.path).stat().st_size for s in shards]


@pytest.mark.slow
@pytest.mark.parametrize("extra,unit,expected", [
    (["--num-cores", "4", "--num-hosts", "2"], 8, 8),
    (["--num-cores", "2"], 2, 2),
    (["--num-shards", "16"], 8, 16),
    (["--target-shard-mb", "0.004"], 8, None),
])
def test_shard_counts(images, tmp_path, extra, unit, expected):
    m = run_job(images, tmp_path / "out", *extra)
    shards = m.splits["train"].shards
    assert len(shards) % unit == 0
    if expected:
        assert len(shards) == expected
    else:  # 36 images of ~2 KB at 4 KB per shard -> more than the 8-shard minimum
        assert len(shards) > 8
    sizes = [s.num_records for s in shards]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1 and sum(sizes) == 36


@pytest.mark.slow
def test_records_are_shuffled_across_shards_with_proportional_classes(tmp_path):
    write_images(tmp_path / "in", {"a": 40, "b": 40})
    out = tmp_path / "out"
    m = run_job(tmp_path / "in", out)
    for shard in m.splits["train"].shards:
        labels = Counter(r[schema.LABEL_TEXT] for r in records(out / shard.path))
        assert set(labels) == {b"a", b"b"}, "every shard should carry both classes"
    order = [r[schema.SOURCE_ID] for r in all_records(out)]
    assert order != sorted(order)


@pytest.mark.slow
def test_same_input_gives_identical_bytes_across_workers_and_modes(images, tmp_path):
    one = tmp_path / "one"
    run_job(images, one, "--splits", "train=0.7,validation=0.3")
    two = tmp_path / "two"
    done = run_cli("build", "--input", images, "--output", two, "--splits", "train=0.7,validation=0.3",
                   "--direct_num_workers=2", "--direct_running_mode=multi_processing")
    assert done.returncode == 0, done.stderr
    assert shard_bytes(one) == shard_bytes(two) and len(shard_bytes(one)) == 16
    first, second = load(str(one)), load(str(two))
    assert first.splits == second.splits


@pytest.mark.slow
def test_a_worker_crash_loses_only_its_file_though_the_worker_held_other_records(tmp_path, monkeypatch):
    """A decoder that crashes its worker process costs only that file: the run it was in is encoded again
    without it, and the shards equal those of a build where the file is merely undecodable."""
    src = tmp_path / "in"
    write_images(src, {"a": 20, "b": 20})
    install_faults(monkeypatch, segv="b/img0013.jpg")
    crashed = run_job(src, tmp_path / "crashed", "--workers", "2", "--num-cores", "2")
    for name in ("PYTHONPATH", "TPU_SHARDS_TEST_SEGV"):
        monkeypatch.delenv(name)
    whole = (src / "b" / "img0013.jpg").read_bytes()
    (src / "b" / "img0013.jpg").write_bytes(whole[:len(whole) // 2])  # truncated: rejected `corrupt`
    clean = run_job(src, tmp_path / "clean", "--workers", "1", "--num-cores", "2")
    assert rejected(tmp_path / "crashed") == rejected(tmp_path / "clean") == {"b/img0013.jpg": "corrupt"}
    assert "SIGSEGV" in (tmp_path / "crashed" / "rejected.jsonl").read_text()
    assert crashed.splits["train"].num_records == clean.splits["train"].num_records == 39
    assert shard_bytes(tmp_path / "crashed") == shard_bytes(tmp_path / "clean")


@pytest.mark.slow
def test_seed_changes_order_not_content(images, tmp_path):
    a = run_job(images, tmp_path / "a", "--seed", "1")
    b = run_job(images, tmp_path / "b", "--seed", "2")
    ra, rb = all_records(tmp_path / "a"), all_records(tmp_path / "b")
    assert [r[schema.SOURCE_ID] for r in ra] != [r[schema.SOURCE_ID] for r in rb]
    assert sorted(r[schema.SHA256] for r in ra) == sorted(r[schema.SHA256] for r in rb)
    assert a.splits["train"].num_records == b.splits["train"].num_records == 36


@pytest.mark.slow
def test_labels_are_sorted_names_and_records_carry_the_schema(built):
    images, out = built.images, built.out
    recs = by_source(out)
    assert len(recs) == 36
    rec = recs["dog/img0003.jpg"]
    assert rec[schema.LABEL] == 1 and rec[schema.LABEL_TEXT] == b"dog"
    assert rec[schema.IMAGE_FORMAT] == b"jpeg" and rec[schema.IMAGE_CHANNELS] == 3
    assert (rec[schema.IMAGE_WIDTH], rec[schema.IMAGE_HEIGHT]) == (64, 48)
    source = (images / "dog" / "img0003.jpg").read_bytes()
    import hashlib

    assert rec[schema.SHA256] == hashlib.sha256(source).hexdigest().encode()
    assert set(rec) == set(schema.FEATURES)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["features"] == schema.FEATURES


@pytest.mark.slow
def test_split_folders_give_splits_and_labels_from_next_level(tmp_path):
    src = tmp_path / "in"
    write_images(src / "train", {"cat": 10, "dog": 6})
    write_images(src / "validation", {"cat": 4, "dog": 4, "eel": 1})
    m = run_job(src, tmp_path / "out", "--num-cores", "2")
    assert m.labels == ["cat", "dog", "eel"]
    assert m.splits["train"].num_records == 16 and m.splits["validation"].num_records == 9
    assert m.splits["validation"].class_counts == {"cat": 4, "dog": 4, "eel": 1}
    recs = by_source(tmp_path / "out", "validation")
    assert recs["validation/eel/img0000.jpg"][schema.LABEL] == 2


@pytest.mark.slow
def test_fraction_splits_are_near_proportional_and_disjoint(tmp_path):
    write_images(tmp_path / "in", {"a": 100, "b": 100}, size=(16, 16))
    out = tmp_path / "out"
    m = run_job(tmp_path / "in", out, "--splits", "train=0.8,validation=0.2")
    train, val = by_source(out, "train"), by_source(out, "validation")
    assert not set(train) & set(val) and len(train) + len(val) == 200
    assert 25 <= len(val) <= 55
    assert m.options["splits"] == {"train": 0.8, "validation": 0.2}


@pytest.mark.slow
def test_hidden_system_and_non_media_files_are_skipped_and_counted(images, tmp_path):
    (images / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (images / "cat" / "Thumbs.db").write_bytes(b"x")
    (images / "cat" / "notes.txt").write_text("hello")
    (images / "cat" / "._img0001.jpg").write_bytes(b"apple double")
    (images / ".hidden label").mkdir()
    (images / ".hidden label" / "x.jpg").write_bytes((images / "cat" / "img0001.jpg").read_bytes())
    (images / "__MACOSX").mkdir()
    (images / "__MACOSX" / "y.jpg").write_bytes(b"junk")
    m = run_job(images, tmp_path / "out")
    assert m.skipped == {"count": 6, "by_reason": {"hidden": 3, "not_media": 1, "system": 2},
                         "by_extension": {".txt": 1}, "path": "skipped.jsonl"}
    assert m.files_seen == 42 and m.splits["train"].num_records == 36 and m.rejected["count"] == 0


@pytest.mark.slow
def test_files_outside_label_folders_are_rejected_not_lost(images, tmp_path):
    (images / "loose.jpg").write_bytes((images / "cat" / "img0001.jpg").read_bytes())
    out = tmp_path / "out"
    m = run_job(images, out)
    assert m.rejected["by_reason"] == {"no_label": 1}
    line = json.loads((out / "rejected.jsonl").read_text())
    assert line["source"] == "loose.jpg" and line["reason"] == "no_label" and "label folder" in line["message"]
    assert m.files_seen == m.splits["train"].num_records + m.rejected["count"] + m.skipped["count"]


@pytest.mark.slow
def test_overwrite_replaces_the_whole_dataset(images, tmp_path):
    out = tmp_path / "out"
    run_job(images, out, "--num-shards", "16")
    assert len(list(out.glob("train-*-of-00016.tfrecord"))) == 16
    run_job(images, out, "--overwrite")
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted([TFRECORD.shard_name("train", i, 8) for i in range(8)] + dataset_files())


@pytest.mark.slow
def test_summary_is_printed(built):
    text = built.printed
    assert "train: 36 records in 8 shards of 4/5 records" in text and "files seen 36" in text


@pytest.mark.slow
def test_the_garbage_collector_leaves_the_run_s_long_lived_objects_alone_and_takes_them_back_after(images, tmp_path,
                                                                                                   monkeypatch):
    """Full collections during a build walk only what the run made (its driver paused a tenth of a second per
    collection otherwise); afterwards nothing stays frozen, after a failed run too."""
    import gc

    from beam_jobs.pipeline import publish as publish_step

    seen = tmp_path / "frozen"
    commit = publish_step.commit_step

    def noting(found, config):  # the last step of a build, run in the driver (Beam runs a pickled copy of this)
        seen.write_text(str(gc.get_freeze_count()))
        yield from commit(found, config)

    monkeypatch.setattr(publish_step, "commit_step", noting)
    run_job(images, tmp_path / "out")
    assert int(seen.read_text()) > 100_000  # modules, Beam and the graph: frozen while it ran
    assert gc.get_freeze_count() == 0
    bad = tmp_path / "bad" / "a" / "x.jpg"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not a photo")
    with pytest.raises(PlanError, match="no input file could be used"):
        run_job(tmp_path / "bad", tmp_path / "out2")
    assert gc.get_freeze_count() == 0


@pytest.mark.slow
def test_summary_of_one_record_in_one_shard_says_so_in_the_singular(tmp_path, capsys):
    write_images(tmp_path / "in", {"cat": 1})
    run_job(tmp_path / "in", tmp_path / "out", "--num-cores", "1")
    assert "train: 1 record in 1 shard of 1 record, " in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("bits", [0, 2])
def test_every_hash_bucket_size_gives_the_same_bytes_on_one_and_two_workers(tmp_path, bits):
    """Tiny buckets (about 4 records each with 2 bits on 16 records a split) and one bucket for everything
    rank exactly like the default 2**16 buckets, in-process and with Beam's worker processes."""
    write_images(tmp_path / "in", {"a": 20, "b": 16})
    reference = tmp_path / "ref"
    run_job(tmp_path / "in", reference, "--splits", "train=0.5,validation=0.5", "--num-cores", "4")
    one = tmp_path / "one"
    run_job(tmp_path / "in", one, "--splits", "train=0.5,validation=0.5", "--num-cores", "4",
            "--hash-bucket-bits", str(bits), "--workers", "1")
    two = tmp_path / "two"
    done = run_cli("build", "--input", tmp_path / "in", "--output", two, "--splits", "train=0.5,validation=0.5",
                   "--num-cores", "4", "--hash-bucket-bits", str(bits), "--direct_num_workers=2",
                   "--direct_running_mode=multi_processing")
    assert done.returncode == 0, done.stderr
    assert shard_bytes(reference) == shard_bytes(one) == shard_bytes(two)
    m = load(str(one))
    for split in ("train", "validation"):
        sizes = [s.num_records for s in m.splits[split].shards]
        assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
        order = [sort_key(0, r[schema.SOURCE_ID].decode()) for r in all_records(one, split)]
        assert order == sorted(order)  # shards hold contiguous runs of the seeded order


@pytest.mark.slow
def test_label_offset_is_stored_and_recorded(images, tmp_path):
    m = run_job(images, tmp_path / "out", "--label-offset", "1")
    assert m.label_offset == 1 and m.options["label_offset"] == 1
    recs = by_source(tmp_path / "out")
    assert recs["cat/img0000.jpg"][schema.LABEL] == 1 and recs["fish/img0000.jpg"][schema.LABEL] == 3


@pytest.mark.slow
def test_tfrec_extension_for_kaggle_notebooks(images, tmp_path):
    m = run_job(images, tmp_path / "out", "--shard-extension", "tfrec")
    assert [s.path for s in m.splits["train"].shards] == [TFRECORD.shard_name("train", i, 8, "tfrec") for i in range(8)]
    assert len(list((tmp_path / "out").glob("*.tfrec"))) == 8
    from shard_utils.read.verify import verify

    assert verify(str(tmp_path / "out"), deep=True) == []


@pytest.mark.slow
def test_skipped_files_are_named_with_their_extensions(images, tmp_path, capsys):
    for name in ("clip.mp4", "CLIP2.MOV", "notes.txt"):
        (images / "cat" / name).write_bytes(b"x")
    (images / ".DS_Store").write_bytes(b"x")
    out = tmp_path / "out"
    m = run_job(images, out)
    assert m.skipped["by_reason"] == {"hidden": 1, "not_media": 3}
    assert m.skipped["by_extension"] == {".mov": 1, ".mp4": 1, ".txt": 1}
    listed = [json.loads(line)["source"] for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert listed == ["cat/CLIP2.MOV", "cat/clip.mp4", "cat/notes.txt"]  # hidden files stay counts
    printed = capsys.readouterr().out
    assert "not media: .mov 1, .mp4 1, .txt 1" in printed and "skipped.jsonl" in printed


@pytest.mark.slow
def test_when_every_file_is_rejected_the_error_names_reasons_and_where_they_are(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    for i in range(5):
        (src / f"img{i:03d}.jpg").write_bytes(b"x")
    (src / "x").mkdir()
    (src / "x" / "y.jpg").write_text("not an image")
    done = run_cli("build", "--input", src, "--output", tmp_path / "out")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith("tpu-shards: error: no input file could be used (0 records); rejected: 5 no_label "
                           "(e.g. img000.jpg: file sits directly in the input folder, not in a label folder), "
                           "1 not_image (e.g. x/y.jpg")
    report = Path(line.rsplit(" ", 1)[-1])
    assert report.name == "rejected.jsonl" and report.read_text().count("\n") == 6


@pytest.mark.slow
def test_too_many_rejects_fail_the_build_and_publish_nothing(images, tmp_path):
    for i in range(3):
        (images / "cat" / f"broken{i}.jpg").write_bytes(b"nope")
    out = tmp_path / "out"
    done = run_cli("build", "--input", images, "--output", out, "--max-rejected", "2")
    assert done.returncode == 1 and "3 of 39 files were rejected, more than --max-rejected 2" in done.stderr
    assert not (out / "manifest.json").exists()
    assert run_cli("build", "--input", images, "--output", out, "--max-rejected", "10%").returncode == 0


@pytest.mark.slow
def test_dedup_keeps_the_smallest_source_id_and_reports_leakage(tmp_path, capsys):
    src = tmp_path / "in"
    write_images(src, {"a": 12, "b": 12})
    halves = [("train", 0.5), ("validation", 0.5)]
    copy = next(f"a/copy{i}.jpg" for i in range(100)
                if choose_split(halves, 0, f"a/copy{i}.jpg") != choose_split(halves, 0, "b/img0003.jpg"))
    (src / copy).write_bytes((src / "b" / "img0003.jpg").read_bytes())
    (src / "a" / "zz_again.jpg").write_bytes((src / "a" / "img0001.jpg").read_bytes())
    out = tmp_path / "out"
    m = run_job(src, out, "--dedup", "--splits", "train=0.5,validation=0.5", "--num-cores", "2")
    rejected_lines = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert {(r["source"], r["reason"]) for r in rejected_lines} == {("a/zz_again.jpg", "duplicate"),
                                                                   ("b/img0003.jpg", "duplicate")}
    assert f"same bytes as {copy}" in next(r["message"] for r in rejected_lines if r["source"] == "b/img0003.jpg")
    written = set(by_source(out, "train")) | set(by_source(out, "validation"))
    assert len(written) == 24 and copy in written and "b/img0003.jpg" not in written
    assert m.duplicates["count"] == 2 and m.files_seen == 26
    crossing = 1 + (choose_split(halves, 0, "a/zz_again.jpg") != choose_split(halves, 0, "a/img0001.jpg"))
    assert m.duplicates["cross_split"] == {"train|validation": crossing}
    assert f"{crossing} duplicate files were in two splits (train/validation {crossing})" in capsys.readouterr().out
    for split in m.splits.values():
        sizes = [s.num_records for s in split.shards]
        assert max(sizes) - min(sizes) <= 1


@pytest.mark.slow
def test_a_split_folder_holding_only_copies_of_another_split_fails_with_one_line(tmp_path):
    """--dedup leaves such a split empty: no plan can be made for it, so the build says so (it used to crash)."""
    src = tmp_path / "in"
    write_images(src / "train", {"a": 6, "b": 6})
    (src / "validation" / "a").mkdir(parents=True)
    for photo in (src / "train" / "a").iterdir():
        (src / "validation" / "a" / photo.name).write_bytes(photo.read_bytes())
    done = run_cli("build", "--input", src, "--output", tmp_path / "out", "--dedup", "--num-cores", "2")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0].startswith("tpu-shards: error: split 'validation': every record in it is a duplicate")
    assert "6 duplicate" in lines[0] and not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.slow
def test_a_jpeg_with_a_trailer_is_kept_without_it_and_counted(images, tmp_path, capsys):
    photo_bytes = (images / "dog" / "img0002.jpg").read_bytes()
    (images / "dog" / "motion.jpg").write_bytes(photo_bytes + b"\x00\x00\x00\x18ftypmp42" + bytes(200))
    out = tmp_path / "out"
    m = run_job(images, out)
    assert m.rejected["count"] == 0 and m.splits["train"].num_records == 37
    rec = by_source(out)["dog/motion.jpg"]
    assert rec[schema.IMAGE_ENCODED] == photo_bytes
    assert "jpeg_trailers_dropped 1" in capsys.readouterr().out
