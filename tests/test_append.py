"""build --append on the real runner: a new generation of shards, the old ones byte for byte, every reader sees all."""
from __future__ import annotations

import contextlib
import io
import json
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import faults, photo, run_cli, run_job, write_images
from readers import records

from shard_utils.format import filenames, generations, manifest, schema, shard_formats
from shard_utils.format.manifest import ManifestError, load
from shard_utils.read.verify import verify
from shard_utils.sharding import plan

OPTS = ("--num-cores", "2", "--splits", "train=0.75,validation=0.25", "--image-size", "24")


def add_images(root: Path, label: str, count: int, seed: int, stem: str = "new") -> list[Path]:
    """`count` new, distinct JPEGs under root/label."""
    folder = root / label
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        path = folder / f"{stem}{i:03d}.jpg"
        photo(40, 30, seed + i).save(path, "JPEG", quality=90)
        paths.append(path)
    return paths


def files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def quiet(fn, *args):
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        result = fn(*args)
    return result, printed.getvalue()


@pytest.fixture(scope="module")
def appended(tmp_path_factory):
    """A dataset built from cat/dog, then appended to with new cats and a new label, bird."""
    base = tmp_path_factory.mktemp("append")
    root = base / "images"
    write_images(root, {"cat": 12, "dog": 12}, size=(40, 30))
    out = base / "out"
    first, _ = quiet(run_job, root, out, *OPTS)
    before = files(out)
    add_images(root, "cat", 7, seed=5000, stem="more")  # 4 of the 14 new files go to validation
    add_images(root, "bird", 7, seed=6000, stem="more")
    grown, printed = quiet(run_job, root, out, "--append", *OPTS)
    return SimpleNamespace(root=root, out=out, first=first, before=before, grown=grown, printed=printed)


@pytest.mark.slow
def test_old_shards_and_reports_are_byte_identical_and_a_generation_is_added(appended):
    first, grown, out = appended.first, appended.grown, appended.out
    after = files(out)
    old_names = [s.path for split in first.splits.values() for s in split.shards] + ["rejected.jsonl"]
    assert all(after[name] == appended.before[name] for name in old_names)
    assert [g.generation for g in grown.generations] == [0, 1]
    assert grown.generations[1].already_in_dataset == 24 and grown.generations[1].files_seen == 14
    assert sum(grown.generations[1].num_records.values()) == 14 and grown.files_seen == 38
    for name, split in grown.splits.items():
        assert split.shards[:len(first.splits[name].shards)] == first.splits[name].shards
        new = [s for s in split.shards if s.generation == 1]
        assert [s.path for s in new] == [shard_formats.TFRECORD.shard_name(name, i, len(new), generation=1)
                                         for i in range(len(new))]
        sizes = [s.num_records for s in new]
        assert len(new) % 2 == 0 and max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
        assert sum(sizes) == grown.generations[1].num_records[name]
        assert [len(records(out / s.path)) for s in new] == sizes
        assert split.index.path == filenames.index_name(name, 1)
    # Files only the old manifest named are gone; nothing temporary is left.
    assert not any(n.endswith(".index.avro") and ".g001." not in n for n in after)
    assert not (out / ".tpu-shards-tmp").exists()
    assert "appended generation 1" in appended.printed and "bird (id 2)" in appended.printed


@pytest.mark.slow
def test_new_label_gets_the_next_id_and_old_ids_never_change(appended):
    first, grown, out = appended.first, appended.grown, appended.out
    assert first.labels == ["cat", "dog"] and grown.labels == ["cat", "dog", "bird"]
    assert grown.generations[1].labels_added == ["bird"]
    seen = {}
    for split in grown.splits.values():
        for shard in split.shards:
            for r in records(out / shard.path):
                seen[r[schema.SOURCE_ID].decode()] = (r[schema.LABEL], r[schema.LABEL_TEXT].decode())
    assert len(seen) == 38
    assert all(grown.labels[label] == text == source.split("/")[0] for source, (label, text) in seen.items())
    total = {name: sum(s.class_counts[name] for s in grown.splits.values()) for name in grown.labels}
    assert total == {"cat": 19, "dog": 12, "bird": 7}


@pytest.mark.slow
def test_hosts_stay_balanced_across_generations(appended):
    grown = appended.grown
    for split in grown.splits.values():
        for hosts in (1, 2):
            per_host = [sum(s.num_records for s in split.shards[h::hosts]) for h in range(hosts)]
            assert max(per_host) - min(per_host) <= 1, per_host


def assert_every_reader_sees_each_record_once(out: Path, m: manifest.Manifest, expected: set[str]) -> None:
    """verify --deep is clean, and random access, the loader and TFDS give every record of every split once."""
    assert verify(str(out), deep=True) == []
    from shard_utils.read.random_access import RandomAccessSource

    ids = []
    for name in m.splits:
        src = RandomAccessSource(str(out), name)
        assert len(src) == m.splits[name].num_records
        ids += [schema.decode_example(src[i])[schema.SOURCE_ID].decode() for i in range(len(src))]
    assert sorted(ids) == sorted(expected)

    from shard_utils.read.loader import make_dataset

    for name in m.splits:
        ds = make_dataset(str(out), name, batch_size=1, training=False, repeat=False)
        assert sum(int(w[0]) for _, _, w in ds.as_numpy_iterator()) == m.splits[name].num_records

    import tensorflow_datasets as tfds

    from shard_utils.read.tfds_meta import split_expression

    builder = tfds.builder_from_directory(str(out))
    ids = []
    for name in m.splits:
        examples = list(builder.as_dataset(split=split_expression(m, name)))
        ids += [e[schema.SOURCE_ID].numpy().decode() for e in examples]
        assert max(int(e[schema.LABEL]) for e in examples) < len(m.labels)
    assert sorted(ids) == sorted(expected)


def source_ids(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*.jpg")}


@pytest.mark.slow
def test_verify_random_access_loader_and_tfds_see_every_generation(appended):
    out, grown = appended.out, appended.grown
    assert "bird/more000.jpg" in source_ids(appended.root)
    assert_every_reader_sees_each_record_once(out, grown, source_ids(appended.root))
    import tensorflow_datasets as tfds

    from shard_utils.read.tfds_meta import split_expression

    builder = tfds.builder_from_directory(str(out))
    assert split_expression(grown, "train") == "train-g000+train-g001"
    # The split's bare name would read generation 0 alone: TFDS refuses it, naming the generations.
    with pytest.raises(ValueError, match=r"Unknown split 'train'. Should be one of \['train-g000', 'train-g001'"):
        builder.as_dataset(split="train")
    assert "read them whole with split= train: 'train-g000+train-g001'" in builder.info.description


@pytest.mark.slow
def test_nothing_new_is_one_message_and_exit_0(appended):
    before = files(appended.out)
    done = run_cli("build", "--append", "--input", appended.root, "--output", appended.out, *OPTS)
    assert done.returncode == 0, done.stderr
    assert "nothing to append" in done.stdout and "38 already in it" in done.stdout
    assert files(appended.out) == before and not (appended.out / ".tpu-shards-tmp").exists()


@pytest.fixture(scope="module")
def small_built(tmp_path_factory):
    """A single-split dataset (2 cores), built once: `small` hands each test a copy of its own."""
    base = tmp_path_factory.mktemp("small")
    write_images(base / "images", {"cat": 6, "dog": 6}, size=(40, 30))
    quiet(run_job, base / "images", base / "out", "--num-cores", "2")
    return base


@pytest.fixture
def small(small_built, tmp_path):
    """A fresh single-split dataset (2 cores) to grow or break."""
    return copy_of(small_built, tmp_path)


def assert_generations_balanced(m: manifest.Manifest, unit: int) -> None:
    """Each generation of each split: a multiple of `unit` shards, none empty, sizes within one record; and
    every host's records within one of every other's."""
    for split in m.splits.values():
        for g in {s.generation for s in split.shards}:
            sizes = [s.num_records for s in split.shards if s.generation == g]
            assert len(sizes) % unit == 0 and min(sizes) >= 1 and max(sizes) - min(sizes) <= 1, sizes
        for hosts in (1, 2):
            per_host = [sum(s.num_records for s in split.shards[h::hosts]) for h in range(hosts)]
            assert max(per_host) - min(per_host) <= 1, per_host


@pytest.fixture(scope="module")
def two_splits(tmp_path_factory):
    """A dataset with splits train and validation (2 cores), kept as it was built."""
    base = tmp_path_factory.mktemp("two-splits")
    write_images(base / "images", {"cat": 12, "dog": 12}, size=(40, 30))
    quiet(run_job, base / "images", base / "out", *OPTS)
    return base


def copy_of(two_splits, tmp_path: Path) -> tuple[Path, Path]:
    import shutil

    shutil.copytree(two_splits / "images", tmp_path / "images")
    shutil.copytree(two_splits / "out", tmp_path / "out")
    return tmp_path / "images", tmp_path / "out"


@pytest.mark.slow
def test_one_new_file_joins_the_latest_generation_of_its_split(two_splits, tmp_path):
    """Too few new records for shards of their own: the split's latest generation is written again with them (its
    records copied), replacing it; the other split keeps its shards byte for byte; every reader sees each record
    once; a second small append replaces that generation in turn."""
    root, out = copy_of(two_splits, tmp_path)
    first = load(str(out))
    for step, seed in ((1, 7000), (2, 7001)):
        before, old = files(out), load(str(out))
        add_images(root, "dog", 1, seed=seed, stem=f"one{step}")
        grown, printed = quiet(run_job, root, out, "--append", *OPTS)
        g = grown.generations[step]
        (split,) = g.num_records
        assert g.num_records == {split: 1} and g.files_seen == 1
        assert g.carried == {split: old.splits[split].num_records}
        assert f"{split}: 1 new record together with the {g.carried[split]} records of its latest generation" in printed
        assert [s.generation for s in grown.splits[split].shards] == [step] * g.num_shards[split]
        assert grown.splits[split].num_records == old.splits[split].num_records + 1
        for other in set(grown.splits) - {split}:
            assert grown.splits[other] == old.splits[other]
        kept = [s.path for name in set(grown.splits) - {split} for s in old.splits[name].shards]
        assert kept and all(files(out)[p] == before[p] for p in kept)
        assert_generations_balanced(grown, 2)
        named = {s.path for sp in grown.splits.values() for s in sp.shards} | {
            sp.index.path for sp in grown.splits.values()}
        assert {n for n in files(out) if n.endswith((".tfrecord", ".avro"))} == named  # replaced files are gone
        assert not (out / ".tpu-shards-tmp").exists()
        assert_every_reader_sees_each_record_once(out, grown, source_ids(root))
    assert sum(s.num_records for s in grown.splits.values()) == 26 and grown.files_seen == 26
    assert grown.labels == first.labels and sum(sum(s.class_counts.values()) for s in grown.splits.values()) == 26
    resharded = tmp_path / "resharded"
    done = run_cli("reshard", out, resharded, "--num-cores", "4")
    assert done.returncode == 0, done.stderr
    assert_every_reader_sees_each_record_once(resharded, load(str(resharded)), source_ids(root))


@pytest.mark.slow
def test_a_small_append_gives_the_same_bytes_twice(two_splits, tmp_path):
    made = []
    for attempt in ("a", "b"):
        root, out = copy_of(two_splits, tmp_path / attempt)
        add_images(root, "cat", 1, seed=7700)
        grown, _ = quiet(run_job, root, out, "--append", *OPTS)
        assert any(g for g in grown.generations[1].carried.values())
        made.append({n: b for n, b in files(out).items() if n.endswith((".tfrecord", ".avro"))})
    assert made[0] == made[1]


@pytest.mark.slow
def test_a_small_append_checks_every_shard_it_copies(small, tmp_path):
    """A shard of the right size with other bytes passes the cheap check; an append that copies it refuses it."""
    from hostile import CORRUPTIONS

    root, out = small
    CORRUPTIONS["shard_swapped"](out, tmp_path)
    before = files(out)
    add_images(root, "dog", 1, seed=7000)
    assert_append_refused(root, out, before, "tpu-shards: error: cannot append to a damaged dataset: "
                          "train-00000-of-00002.tfrecord: record 0: data checksum mismatch (tpu-shards verify --deep "
                          "lists every problem); nothing was written")


def assert_append_refused(root: Path, out: Path, before: dict[str, bytes], line: str) -> None:
    """An append of root into out (2 cores) fails with exactly this line, exit 1, and changes no file."""
    done = run_cli("build", "--append", "--input", root, "--output", out, "--num-cores", "2")
    assert (done.returncode, done.stderr.strip().splitlines()) == (1, [line])
    assert files(out) == before


@pytest.mark.slow
def test_a_split_the_dataset_does_not_have_is_one_line_and_nothing_changes(tmp_path):
    """Split folders: new files in a split of their own are refused however few they are (nothing to join)."""
    root, out = tmp_path / "images", tmp_path / "out"
    write_images(root / "train", {"cat": 4, "dog": 4}, size=(40, 30))
    quiet(run_job, root, out, "--num-cores", "2")
    before = files(out)
    add_images(root / "test", "cat", 1, seed=7800)
    assert_append_refused(root, out, before, "tpu-shards: error: split 'test' is not in the dataset (it has train); "
                          "an append adds records to the dataset's splits; nothing was written")


@pytest.mark.slow
def test_new_files_that_are_all_rejected_are_an_error_and_nothing_changes(small):
    root, out = small
    before = files(out)
    (root / "dog" / "broken.jpg").write_bytes(b"not a JPEG")
    done = run_cli("build", "--append", "--input", root, "--output", out, "--num-cores", "2")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tpu-shards: error: nothing to append: none of the new files could "
                                                   "be used; nothing was written; rejected: 1 not_image")
    assert files(out) == before


@pytest.mark.slow
def test_an_append_takes_the_first_builds_options_and_refuses_other_values_naming_both(small):
    root, out = small
    add_images(root, "dog", 4, seed=7100)
    before = files(out)
    done = run_cli("build", "--append", "--input", root, "--output", out, "--image-size", "16")
    assert done.returncode == 2 and files(out) == before
    assert done.stderr.strip() == (f"tpu-shards: error: cannot append to {out}: --image-size 16,16 given, the dataset "
                                   "was built without --image-size; an append uses the first build's options "
                                   "(reshard or rebuild to change them)")
    grown = run_cli("build", "--append", "--input", root, "--output", out)  # 2 cores: from the manifest
    assert grown.returncode == 0, grown.stderr
    assert "train: 4 new records in 2 shards of 2 records" in grown.stdout
    nothing = run_cli("build", "--append", "--input", root, "--output", out.parent / "none", "--num-cores", "2")
    assert nothing.returncode == 2 and "build it first without --append" in nothing.stderr


RECORDED = {"splits": {"train": 0.75, "validation": 0.25}, "stratify": True, "image_size": [24, 24],
            "jpeg_quality": 80, "format": "both", "num_cores": 2, "num_hosts": 1, "tpu": None, "dedup": False,
            "label_from_name": None, "label_column": "label", "label_separator": " ", "extra_columns": ["age:int64"],
            "path_template": None, "max_rejected": "5%"}


def inherited(argv: list[str], recorded=RECORDED):
    from beam_jobs.jobs import inherit, options

    args, _ = options.parse(["--append", "--output", "ds", *argv])
    return inherit.take_recorded(args, options.given(["--append", "--output", "ds", *argv]), recorded)


def test_every_recorded_option_not_given_is_taken_from_the_manifest():
    args = inherited(["--input", "in", "--max-rejected", "0"])
    assert (args.splits, args.stratify, args.image_size, args.jpeg_quality, args.format) == (
        "train=0.75,validation=0.25", True, "24,24", 80, "both")
    assert (args.num_cores, args.num_hosts, args.tpu, args.max_rejected) == (2, 1, None, "0")  # this run's limit
    assert (args.label_separator, args.extra_columns) == (None, None)  # a listing's shape: only with a listing
    listed = inherited(["--listing", "more.csv", "--input", "in"])
    assert (listed.label_separator, listed.extra_columns, listed.label_column) == (" ", "age:int64", "label")
    by_tpu = inherited(["--input", "in"], {**RECORDED, "tpu": "v5e-16", "num_cores": 4, "num_hosts": 4})
    assert (by_tpu.tpu, by_tpu.num_cores, by_tpu.num_hosts) == ("v5e-16", None, None)
    assert inherited(["--input", "in", "--num-cores", "4"]).num_cores == 4  # compared as a topology later


@pytest.mark.parametrize("recorded,now,given,line", [
    ({"format": "both"}, {"format": "array_record"}, {"format"},
     "x: --format array_record given, the dataset was built with --format both; an append uses the first build's "
     "options (reshard or rebuild to change them)"),
    ({"stratify": False}, {"stratify": True}, {"stratify"}, "x: --stratify given, the dataset was built without "
                                                            "--stratify; an append uses"),
    ({"label_separator": " "}, {"label_separator": None}, set(),
     "x: the dataset was built with --label-separator ' ' (a space), which this append cannot take (it reads a "
     "listing's columns: give --listing)"),
    ({"splits": "from folders"}, {"splits": {"train": 1.0}}, set(), "x: the dataset was built with splits from "
                                                                     "folders, which this append cannot take"),
])
def test_a_value_other_than_the_recorded_one_is_one_line_naming_both(recorded, now, given, line):
    from beam_jobs.errors import UsageError
    from beam_jobs.jobs.inherit import check_same

    with pytest.raises(UsageError) as refused:
        check_same(recorded, now, given, "x")
    assert str(refused.value).startswith(line)
    check_same({**recorded, "dedup": False, "target_shard_mb": 128.0}, {**recorded, "dedup": True,
                                                                         "target_shard_mb": 8.0}, given, "x")


@pytest.mark.slow
def test_dedup_drops_new_files_with_the_bytes_of_a_record(small):
    root, out = small
    (root / "bird").mkdir()
    (root / "bird" / "copy_of_cat.jpg").write_bytes((root / "cat" / "img0002.jpg").read_bytes())
    add_images(root, "bird", 3, seed=7200)
    grown, _ = quiet(run_job, root, out, "--append", "--num-cores", "2", "--dedup")
    rejected = [json.loads(line) for line in (out / grown.rejected["path"]).read_text().splitlines()]
    assert rejected == [{"source": "bird/copy_of_cat.jpg", "reason": "duplicate", "generation": 1,
                         "message": "same bytes as cat/img0002.jpg (already in the dataset, in split train)"}]
    assert grown.generations[1].num_records == {"train": 3} and grown.duplicates["count"] == 1
    assert grown.rejected == {"count": 1, "by_reason": {"duplicate": 1}, "path": "rejected.g001.jsonl"}
    assert verify(str(out), deep=True) == []
    # The rejected copy is accounted for: the next append does not read it again.
    done = run_cli("build", "--append", "--input", root, "--output", out, "--num-cores", "2", "--dedup")
    assert done.returncode == 0 and "nothing to append" in done.stdout and "16 already in it" in done.stdout


@pytest.mark.slow
def test_group_moves_the_one_new_file_into_a_split_whose_latest_generation_takes_it(two_splits, tmp_path):
    """--near-dups group: the only new file, a byte copy of a validation record that its own hash puts in train,
    moves to validation; one record is too few for a generation of its own, so validation's latest generation is
    written again with it (the step that copies that generation had not counted moved records: an internal
    error)."""
    from shard_utils.format.order import choose_split
    from shard_utils.read.random_access import RandomAccessSource

    root, out = copy_of(two_splits, tmp_path)
    old = load(str(out))
    src = RandomAccessSource(str(out), "validation")
    original = schema.decode_example(src[0])[schema.SOURCE_ID].decode()
    fractions = list(old.options["splits"].items())
    name = next(n for n in (f"dog/copy{i}.jpg" for i in range(50))
                if choose_split(fractions, old.options["seed"], n) == "train")
    (root / name).write_bytes((root / original).read_bytes())
    grown, _ = quiet(run_job, root, out, "--append", *OPTS, "--near-dups", "group")
    g = grown.generations[1]
    assert g.num_records == {"validation": 1} and g.carried == {"validation": old.splits["validation"].num_records}
    assert grown.splits["train"] == old.splits["train"] and verify(str(out), deep=True) == []
    src = RandomAccessSource(str(out), "validation")
    assert [schema.decode_example(src[i])[schema.SOURCE_ID].decode() for i in range(len(src))].count(name) == 1


@pytest.mark.slow
@pytest.mark.parametrize("stage, new", [
    ("publish-start", 4), ("publish-renaming", 4), ("publish-before-manifest", 4),  # a generation of its own
    ("publish-renaming", 1), ("publish-before-manifest", 1),  # too few for that: the latest one written again
])
def test_kill_while_publishing_an_append_leaves_the_old_dataset(small, stage, new):
    root, out = small
    before = files(out)
    add_images(root, "bird", new, seed=7300)
    killed = run_cli("build", "--append", "--input", root, "--output", out, "--num-cores", "2",
                     env=faults(kill=stage))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert verify(str(out), deep=True) == []
    after = files(out)
    assert {n: after[n] for n in before} == before  # the manifest and every file it names
    assert load(str(out)).generations is None
    quiet(run_job, root, out, "--append", "--num-cores", "2")  # the rerun: in this process, no second start-up
    grown = load(str(out))
    assert grown.generations[1].num_records == {"train": new} and verify(str(out), deep=True) == []
    assert grown.splits["train"].num_records == 12 + new
    named = {s.path for s in grown.splits["train"].shards} | {grown.splits["train"].index.path}
    assert {n for n in files(out) if n.endswith((".tfrecord", ".avro"))} == named  # no leftovers


def test_append_on_a_bucket(gcs, tmp_path):
    root = tmp_path / "images"
    write_images(root, {"cat": 4, "dog": 4}, size=(40, 30))
    raw = gcs.new_bucket("append-raw")
    out = f"gs://{gcs.new_bucket('append-out')}/ds"
    gcs.upload_tree(root, raw, "photos")
    quiet(run_job, f"gs://{raw}/photos", out, "--num-cores", "2")
    add_images(root, "bird", 4, seed=7400)
    gcs.upload_tree(root / "bird", raw, "photos/bird")
    grown, _ = quiet(run_job, f"gs://{raw}/photos", out, "--append", "--num-cores", "2")
    assert grown.labels == ["cat", "dog", "bird"] and grown.splits["train"].num_records == 12
    assert verify(out, deep=True) == []
    bucket = out[5:].split("/")[0]
    assert sorted(n for n in gcs.names(bucket) if n.endswith(".tfrecord")) == [
        "ds/train-00000-of-00002.tfrecord", "ds/train-00001-of-00002.tfrecord",
        "ds/train-g001-00000-of-00002.tfrecord", "ds/train-g001-00001-of-00002.tfrecord"]


# ---------------------------------------------------------------------------------------------- pure pieces


def test_host_offset_deals_extra_records_round_robin_across_generations():
    assert generations.host_offset([13, 12], 2) == 1
    assert generations.host_offset([3, 3, 2, 2], 4) == 2
    assert generations.host_offset([5, 5, 5, 5], 4) == 0
    per_host = [0] * 4
    shards: list[int] = []
    for records_ in (10, 7, 5, 13, 6):  # five generations of 4 shards each
        offset = generations.host_offset(shards, 4)
        sizes = plan.shard_sizes(records_, 4)
        placed = [0] * 4
        for k, n in enumerate(sizes):
            placed[generations.position(k, 4, offset)] = n
        shards += placed
        per_host = [sum(shards[h::4]) for h in range(4)]
        assert max(per_host) - min(per_host) <= 1, (records_, per_host)


def test_label_order_keeps_known_ids():
    assert generations.label_order({"dog", "cat"}) == ["cat", "dog"]
    assert generations.label_order({"ant", "dog", "zebra"}, ["dog", "cat"]) == ["dog", "cat", "ant", "zebra"]


@pytest.mark.slow
def test_manifest_generations_are_checked(appended):
    text = json.loads((appended.out / "manifest.json").read_text())
    assert manifest.from_dict(text).generations[1].labels_added == ["bird"]
    bad = json.loads(json.dumps(text))
    bad["generations"][1]["num_records"]["train"] += 1
    with pytest.raises(ManifestError, match="generation 1: split 'train' has"):
        manifest.from_dict(bad)
    bad = json.loads(json.dumps(text))
    bad["generations"][1]["carried"] = {"train": 3}  # generation 0 holds more: it was not replaced
    with pytest.raises(ManifestError, match="generation 1: split 'train' carries 3 records, but its latest earlier "
                                            "generation holds"):
        manifest.from_dict(bad)
    bad = json.loads(json.dumps(text))
    del bad["generations"]
    with pytest.raises(ManifestError, match="lists no generations"):
        manifest.from_dict(bad)
    bad = json.loads(json.dumps(text))
    bad["generations"][1]["generation"] = 5
    with pytest.raises(ManifestError, match="numbered 0, 1, 2"):
        manifest.from_dict(bad)


@pytest.mark.slow
def test_a_build_with_overwrite_replaces_every_generation(small):
    root, out = small
    add_images(root, "bird", 4, seed=7500)
    quiet(run_job, root, out, "--append", "--num-cores", "2")
    (root / "cat" / "img0000.jpg").unlink()
    rebuilt, _ = quiet(run_job, root, out, "--num-cores", "2", "--overwrite")
    assert rebuilt.generations is None and rebuilt.splits["train"].num_records == 15
    names = sorted(files(out))
    assert not [n for n in names if ".g0" in n or "-g0" in n], names
    assert verify(str(out), deep=True) == []


@pytest.mark.slow
def test_an_append_takes_the_first_builds_label_options_and_refuses_others(tmp_path):
    """A multi-label listing built with --label-separator: an append that leaves it out takes it from the manifest
    (without it 'cat flower' would be a new label of its own); another separator is refused naming both."""
    write_images(tmp_path / "images", {"all": 24}, size=(32, 24))
    rows = [f"all/img{i:04d}.jpg,{'cat flower' if i % 2 else 'dog'}" for i in range(24)]
    (tmp_path / "train.csv").write_text("path,label\n" + "\n".join(rows[:16]) + "\n")
    out = tmp_path / "out"
    first = run_cli("build", "--listing", tmp_path / "train.csv", "--input", tmp_path / "images", "--output", out,
                    "--num-cores", "2", "--label-separator", " ")
    assert first.returncode == 0, first.stderr
    before = files(out)
    (tmp_path / "more.csv").write_text("path,label\n" + "\n".join(rows[16:]) + "\n")
    again = run_cli("build", "--append", "--listing", tmp_path / "more.csv", "--input", tmp_path / "images",
                    "--output", out, "--label-separator", ",")
    assert again.returncode == 2
    assert again.stderr.strip() == (f"tpu-shards: error: cannot append to {out}: --label-separator , given, the "
                                    "dataset was built with --label-separator ' ' (a space); an append uses the "
                                    "first build's options (reshard or rebuild to change them)")
    assert files(out) == before
    grown = run_cli("build", "--append", "--listing", tmp_path / "more.csv", "--input", tmp_path / "images",
                    "--output", out)  # the separator and the 2 cores are the manifest's
    assert grown.returncode == 0, grown.stderr
    assert load(str(out)).labels == ["cat", "dog", "flower"]


def test_an_append_rewrites_croissant_json_and_the_card(appended):
    from described import assert_described

    m = assert_described(appended.out)
    assert "bird" in m.labels and m.generations and len(m.generations) == 2
