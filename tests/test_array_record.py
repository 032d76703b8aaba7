"""--format array_record|both: ArrayRecord shards holding the TFRecord shards' records, in the same order and
balance, written locally and bucket to bucket, read with the real array_record, Grain and TFDS packages."""
from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import shutil
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
from array_record.python.array_record_module import ArrayRecordReader
from conftest import faults, run_cli, run_job, write_images
from readers import shard_bytes

from shard_utils.format import array_record, schema
from shard_utils.format.manifest import ManifestError, load, parse
from shard_utils.format.tfrecord import iter_records
from shard_utils.read.verify import verify

# Written from the manifest (its time, the output's name): compared through the manifest, not as bytes.
MADE_FROM_MANIFEST = ("manifest.json", "croissant.json", "README.md")

OPTS = ("--num-cores", "2", "--splits", "train=0.7,validation=0.3", "--image-size", "24", "--workers", "1")


def ar_records(path) -> list[bytes]:
    """Every record of an ArrayRecord file, read with the package's own reader."""
    reader = ArrayRecordReader(str(path), "readahead_buffer_size:0")
    try:
        return list(reader.read_all())
    finally:
        reader.close()


def tf_records(path) -> list[bytes]:
    with open(path, "rb") as f:
        return list(iter_records(f))


def built(root: Path, out: Path, *extra: str):
    with contextlib.redirect_stdout(io.StringIO()):
        return run_job(root, out, *OPTS, *extra)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """One input built three ways: tfrecord (the reference), both, and array_record alone."""
    base = tmp_path_factory.mktemp("array_record")
    root = base / "images"
    write_images(root, {"cat": 11, "dog": 9, "fish": 7}, size=(40, 30))
    return SimpleNamespace(root=root, base=base, **{fmt: (base / fmt, built(root, base / fmt, "--format", fmt))
                                                    for fmt in ("tfrecord", "both", "array_record")})


@pytest.mark.slow
def test_both_publishes_twins_with_the_tfrecord_shards_records_in_order(datasets):
    ref_out, ref = datasets.tfrecord
    out, m = datasets.both
    assert shard_bytes(out) == shard_bytes(ref_out)  # the TFRecord shards are what a tfrecord build writes
    assert m.formats == ("tfrecord", "array_record")
    for name, split in m.splits.items():
        assert split.index is not None and [s.path for s in split.shards] == [s.path for s in ref.splits[name].shards]
        assert [t.path for t in split.array_record_shards] == [s.path.replace(".tfrecord", ".array_record")
                                                               for s in split.shards]
        for shard, twin in zip(split.shards, split.array_record_shards, strict=True):
            records = ar_records(out / twin.path)
            assert records == tf_records(out / shard.path)
            assert twin.num_records == len(records) == shard.num_records
            assert twin.num_bytes == (out / twin.path).stat().st_size
    assert verify(str(out), deep=True) == []
    # Old readers: format_version 2, `shards` unchanged; the twins are an extra key per split.
    raw = json.loads((out / "manifest.json").read_text())
    assert raw["format_version"] == 2 and "shard_format" not in raw
    assert all("array_record_shards" in s for s in raw["splits"].values())


def test_array_record_alone_publishes_only_array_record_shards_of_the_same_records(datasets):
    ref_out, ref = datasets.tfrecord
    out, m = datasets.array_record
    assert m.formats == ("array_record",) and m.shard_format == "array_record" and m.format_version == 3
    names = sorted(p.name for p in out.iterdir())
    assert not [n for n in names if n.endswith((".tfrecord", ".avro"))] and ".tpu-shards-tmp" not in names
    for name, split in m.splits.items():
        assert split.index is None
        reference = ref.splits[name].shards
        assert [s.num_records for s in split.shards] == [s.num_records for s in reference]  # the same balance
        for shard, tf_shard in zip(split.shards, reference, strict=True):
            assert ar_records(out / shard.path) == tf_records(ref_out / tf_shard.path)
        assert m.array_record_paths(name) == [str(out / s.path) for s in split.shards]
    assert verify(str(out)) == [] and verify(str(out), deep=True) == []
    with pytest.raises(ManifestError, match="ArrayRecord shards only"):
        m.shard_paths("train")
    from shard_utils.read.random_access import RandomAccessSource

    with pytest.raises(ValueError, match=r"ArrayRecordDataSource\(manifest.array_record_paths\('train'\)\)"):
        RandomAccessSource(m, "train")


@pytest.mark.slow
def test_the_same_build_gives_the_same_array_record_bytes(datasets, tmp_path):
    out, _ = datasets.both
    again = tmp_path / "again"
    built(datasets.root, again, "--format", "both")
    assert {p.name: p.read_bytes() for p in again.glob("*.array_record")} == \
           {p.name: p.read_bytes() for p in out.glob("*.array_record")}


def test_grain_reads_the_shards_and_the_decoder_maps_them(datasets):
    grain = pytest.importorskip("grain")
    from shard_utils.read.random_access import Decoder

    out, m = datasets.array_record
    ref_out, ref = datasets.tfrecord
    expected = [r for s in ref.splits["train"].shards for r in tf_records(ref_out / s.path)]
    source = grain.sources.ArrayRecordDataSource(m.array_record_paths("train"))
    assert len(source) == len(expected) == m.num_records("train")
    assert [source[i] for i in reversed(range(len(source)))] == expected[::-1]
    ds = grain.MapDataset.source(source).seed(3).shuffle().map(Decoder.for_manifest(m)).batch(4)
    seen = [sid for batch in ds for sid in batch["source_id"]]
    assert sorted(seen) == sorted(schema.decode_example(r)[schema.SOURCE_ID].decode() for r in expected)
    first = Decoder.for_manifest(m)(source[0])
    assert first["image"].shape == (24, 24, 3) and m.labels[first["label"]] in ("cat", "dog", "fish")


def test_array_record_source_reads_a_split_expression_with_the_counts_of_the_manifest(datasets):
    grain = pytest.importorskip("grain")
    from shard_utils.read.array_record_source import ShardSlice, array_record_source, shard_slices
    from shard_utils.read.random_access import RandomAccessSource

    _, both = datasets.both
    _, alone = datasets.array_record
    for expression in ("train", "train[2:]+validation[:50%]", ["validation", "train[:3]"]):
        indexed = RandomAccessSource(both, expression)
        expected = [indexed[i] for i in range(len(indexed))]
        for m in (both, alone):
            src = array_record_source(m, expression)
            assert isinstance(src, grain.sources.ArrayRecordDataSource) and len(src) == len(expected)
            assert [src[i] for i in range(len(src))] == expected
            assert list(pickle.loads(pickle.dumps(src)).__getitems__(range(len(src))[::-1])) == expected[::-1]
    first = alone.splits["train"].shards[0]
    assert shard_slices(alone, "train[2:]")[0] == ShardSlice(str(datasets.array_record[0] / first.path), 2,
                                                             first.num_records - 2, first.num_records)
    with pytest.raises(ManifestError, match="has no ArrayRecord shards"):
        array_record_source(datasets.tfrecord[1], "train")


@pytest.mark.tf  # imports TensorFlow (the loader)
def test_tfds_reads_array_record_output(datasets):
    tfds = pytest.importorskip("tensorflow_datasets")
    from shard_utils.read.tfds_meta import array_record_builder

    for fmt in ("array_record", "both"):
        out, m = getattr(datasets, fmt)
        builder = array_record_builder(str(out))
        source = builder.as_data_source(split="validation")
        ids = [source[i][schema.SOURCE_ID] for i in range(len(source))]
        twins = m.array_record_paths("validation")
        assert ids == [schema.decode_example(r)[schema.SOURCE_ID] for p in twins for r in ar_records(p)]
    out, _ = datasets.both  # its TFRecord shards stay TFDS's default format: as_dataset works as before
    counted = sum(1 for _ in tfds.builder_from_directory(str(out)).as_dataset(split="train"))
    assert counted == datasets.both[1].num_records("train")


def test_verify_finds_a_damaged_twin_and_a_twin_of_other_records(datasets, tmp_path):
    out = tmp_path / "d"
    shutil.copytree(datasets.both[0], out)
    m = load(str(out))
    twin = m.splits["train"].array_record_shards[0]
    data = bytearray((out / twin.path).read_bytes())
    data[200] ^= 1
    (out / twin.path).write_bytes(bytes(data))
    assert any(twin.path in p and "crc32c" in p for p in verify(str(out)))
    assert any(twin.path in p and "cannot be read" in p for p in verify(str(out), deep=True))
    # A readable twin of other records, its manifest entry matching its bytes: only --deep's comparison sees it.
    other = m.splits["train"].shards[1]
    written = array_record.write_shard(list(reversed(tf_records(out / m.splits["train"].shards[0].path))),
                                       str(out / twin.path))
    raw = json.loads((out / "manifest.json").read_text())
    raw["splits"]["train"]["array_record_shards"][0].update(num_bytes=written.num_bytes, crc32c=written.crc32c,
                                                            sha256=written.sha256)
    (out / "manifest.json").write_text(json.dumps(raw))
    (out / "croissant.json").unlink()  # it describes the twin the manifest no longer names: verify would say so
    assert verify(str(out)) == []
    assert [p for p in verify(str(out), deep=True) if "differs from record 0" in p] and other.path


@pytest.mark.parametrize("change, message", [
    (lambda s: s["array_record_shards"].pop(), "one ArrayRecord shard per shard"),
    (lambda s: s["array_record_shards"][0].update(path="x-00000-of-00002.array_record"), "is not the twin"),
    (lambda s: s["array_record_shards"][0].update(num_records=1), "is not the twin"),
    (lambda s: s["array_record_shards"][0].update(path="../train-00000-of-00002.array_record"), "leaves"),
    (lambda s: s["array_record_shards"][0].update(path=s["shards"][1]["path"]), "array_record"),
    (lambda s: s.pop("array_record_shards"), "every split or for none"),
])
def test_manifest_twins_are_validated_on_load(datasets, change, message):
    raw = json.loads((datasets.both[0] / "manifest.json").read_text())
    change(raw["splits"]["train"])
    with pytest.raises(ManifestError, match=message):
        parse(json.dumps(raw))


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(format_version=2), "needs format_version 3"),
    (lambda m: m.update(shard_format="parquet"), "shard_format must be one of"),
    (lambda m: m["splits"]["train"]["shards"][0].update(path="train-00000-of-00002.tfrecord"), "array_record"),
    (lambda m: m["splits"]["train"].update(index={"path": "train.index.avro", "num_rows": 1, "num_bytes": 1,
                                                  "crc32c": "AAAAAA==", "sha256": "0" * 64}), "index"),
])
def test_an_array_record_manifest_is_validated_on_load(datasets, change, message):
    raw = json.loads((datasets.array_record[0] / "manifest.json").read_text())
    change(raw)
    with pytest.raises(ManifestError, match=message):
        parse(json.dumps(raw))


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (("--format", "parquet"), "--format"),
    (("--format", "array_record", "--shard-extension", "tfrec"), "--shard-extension tfrec"),
])
def test_bad_format_options_are_one_line(images, tmp_path, args, message):
    done = run_cli("build", "--input", images, "--output", tmp_path / "out", *args)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.slow
def test_a_rebuild_replaces_array_record_shards_it_does_not_write_again(datasets, tmp_path):
    out = tmp_path / "d"
    shutil.copytree(datasets.array_record[0], out)
    built(datasets.root, out, "--format", "tfrecord", "--overwrite")
    assert not list(out.glob("*.array_record")) and verify(str(out)) == []


@pytest.mark.slow
def test_a_build_killed_while_writing_a_twin_leaves_no_partial_file_and_a_rerun_is_identical(datasets, tmp_path):
    """Held with a twin written but not yet in place, then killed: the twin exists only under a hidden temporary
    name, the old dataset is untouched, and a rerun removes what was left and publishes the same dataset."""
    from test_runs_collide import start_build, wait_for

    def dataset(folder) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")}

    out = tmp_path / "d"
    shutil.copytree(datasets.tfrecord[0], out)
    old = dataset(out)
    hold = tmp_path / "release"
    build = start_build("--input", datasets.root, "--output", out, *OPTS, "--format", "both", "--overwrite",
                        env=faults(hold=f"shard_utils.format.array_record:_file_digest={hold}"))
    try:
        wait_for(Path(f"{hold}.reached"), build)
        partial = [p for p in out.rglob("*") if ".array_record" in p.name]
        assert [p.name.startswith(".") and p.name.endswith(".tmp") for p in partial] == [True]
    finally:
        os.killpg(build.pid, signal.SIGKILL)
        build.communicate()
    assert dataset(out) == old
    built(datasets.root, out, "--format", "both", "--overwrite")  # the rerun, in this process
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in datasets.both[0].iterdir())
    assert {n: b for n, b in dataset(out).items() if n not in MADE_FROM_MANIFEST} == \
           {n: b for n, b in dataset(datasets.both[0]).items() if n not in MADE_FROM_MANIFEST}
    assert load(str(out)).splits == datasets.both[1].splits


def split_records(out: Path) -> dict[str, list[bytes]]:
    """Every split's records (from TFRecord shards, else ArrayRecord ones), sorted: the dataset as a multiset."""
    m = load(str(out))
    found = {}
    for name, split in m.splits.items():
        if m.shard_format == "tfrecord":
            found[name] = sorted(r for s in split.shards for r in tf_records(out / s.path))
        else:
            found[name] = sorted(r for s in split.shards for r in ar_records(out / s.path))
    return found


@pytest.mark.slow
def test_reshard_between_formats_copies_the_records_as_they_are(datasets, tmp_path):
    from beam_jobs.jobs.reshard import run as reshard

    src_out, src = datasets.tfrecord
    with contextlib.redirect_stdout(io.StringIO()):
        to_ar = reshard([str(src_out), str(tmp_path / "ar"), "--num-cores", "1", "--format", "array_record"])
        back = reshard([str(tmp_path / "ar"), str(tmp_path / "back"), "--num-cores", "2", "--format", "tfrecord"])
        both = reshard([str(tmp_path / "ar"), str(tmp_path / "both"), "--num-cores", "2", "--format", "both"])
    assert to_ar.formats == ("array_record",) and to_ar.options["format"] == "array_record"
    assert back.formats == ("tfrecord",) and both.formats == ("tfrecord", "array_record")
    assert split_records(tmp_path / "ar") == split_records(tmp_path / "back") == split_records(src_out)
    # Back at the source's topology and seed, the TFRecord shards are the source's, byte for byte.
    assert shard_bytes(tmp_path / "back") == shard_bytes(src_out) == shard_bytes(tmp_path / "both")
    assert back.splits["train"].index is not None
    for out in ("ar", "back", "both"):
        assert verify(str(tmp_path / out), deep=True) == []
    assert [len(s.shards) for s in to_ar.splits.values()] != [len(s.shards) for s in src.splits.values()]


@pytest.mark.slow
def test_append_grows_both_and_array_record_datasets_with_the_same_records(tmp_path):
    root = tmp_path / "images"
    write_images(root, {"cat": 8, "dog": 8}, size=(40, 30))
    outs = {fmt: tmp_path / fmt for fmt in ("tfrecord", "both", "array_record")}
    for fmt, out in outs.items():
        built(root, out, "--format", fmt)
    write_images(root / "new", {"bird": 6, "cat": 5}, size=(40, 30), seed=50)
    grown, printed = {}, {}
    for fmt, out in outs.items():
        with contextlib.redirect_stdout(io.StringIO()) as said:
            grown[fmt] = run_job(root, out, *OPTS, "--format", fmt, "--append")
        printed[fmt] = said.getvalue().splitlines()
        assert len(grown[fmt].generations) == 2 and verify(str(out), deep=True) == []
    for fmt, m in grown.items():  # the append's summary names the new shards' format and the new twins' size
        for name, split in m.splits.items():
            [line] = [i for i, text in enumerate(printed[fmt]) if text.startswith(f"  {name}: ")]
            kind = "ArrayRecord shards" if fmt == "array_record" else "shards"
            assert f"in {len([s for s in split.shards if s.generation == 1])} {kind} of" in printed[fmt][line]
            twins = [t.num_bytes for t in split.array_record_shards or () if t.generation == 1]
            after = printed[fmt][line + 1] if line + 1 < len(printed[fmt]) else ""
            assert (after == f"    and their ArrayRecord twins, {sum(twins) / 1e6:.1f} MB") == (fmt == "both"), \
                printed[fmt]
    both, alone = grown["both"], grown["array_record"]
    assert both.formats == ("tfrecord", "array_record") and alone.formats == ("array_record",)
    assert split_records(outs["both"]) == split_records(outs["array_record"]) == split_records(outs["tfrecord"])
    for name, split in both.splits.items():
        assert [t.generation for t in split.array_record_shards] == [s.generation for s in split.shards]
        assert [s.num_records for s in alone.splits[name].shards] == [s.num_records for s in split.shards]
        for shard, twin, single in zip(split.shards, split.array_record_shards, alone.splits[name].shards, strict=True):
            assert ar_records(outs["both"] / twin.path) == tf_records(outs["both"] / shard.path) == \
                ar_records(outs["array_record"] / single.path)
    again = run_cli("build", "--append", "--input", root, "--output", outs["array_record"], *OPTS, "--format",
                    "array_record")
    assert again.returncode == 0 and "nothing to append" in again.stdout, again.stderr
    taken = run_cli("build", "--append", "--input", root, "--output", outs["both"], *OPTS)  # --format: the manifest's
    assert taken.returncode == 0 and "nothing to append" in taken.stdout, taken.stderr
    wrong = run_cli("build", "--append", "--input", root, "--output", outs["both"], *OPTS, "--format", "array_record")
    assert wrong.returncode == 2 and "--format array_record given, the dataset was built with --format both" in \
        wrong.stderr, wrong.stderr


@pytest.mark.slow
def test_a_small_append_rewrites_the_latest_generation_with_its_twins_or_is_refused_without_tfrecord(tmp_path):
    """One new file joins its split's latest generation: in a `both` dataset the generation's twins are written
    again with its shards and the replaced ones removed; an ArrayRecord-only dataset (no index to copy from)
    refuses in one line and keeps its bytes."""
    root = tmp_path / "images"
    write_images(root, {"cat": 8, "dog": 8}, size=(40, 30))
    outs = {fmt: tmp_path / fmt for fmt in ("tfrecord", "both", "array_record")}
    for fmt, out in outs.items():
        built(root, out, "--format", fmt)
    write_images(root / "new", {"bird": 1}, size=(40, 30), seed=51)
    before = {p.name: p.read_bytes() for p in outs["array_record"].iterdir() if p.is_file()}
    for fmt in ("tfrecord", "both"):
        with contextlib.redirect_stdout(io.StringIO()):
            run_job(root, outs[fmt], *OPTS, "--format", fmt, "--append")
        assert verify(str(outs[fmt]), deep=True) == []
    grown = load(str(outs["both"]))
    assert grown.generations[-1].carried, grown.generations[-1]
    assert split_records(outs["both"]) == split_records(outs["tfrecord"])
    named = set()
    for split in grown.splits.values():
        assert [t.generation for t in split.array_record_shards] == [s.generation for s in split.shards]
        for shard, twin in zip(split.shards, split.array_record_shards, strict=True):
            assert ar_records(outs["both"] / twin.path) == tf_records(outs["both"] / shard.path)
        named |= {s.path for s in split.shards + split.array_record_shards}
    on_disk = {p.name for p in outs["both"].iterdir() if p.suffix in (".tfrecord", ".array_record")}
    assert on_disk == named
    refused = run_cli("build", "--append", "--input", root, "--output", outs["array_record"], *OPTS, "--format",
                      "array_record")
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode != 0 and len(lines) == 1 and "too few for a generation of their own" in lines[0] \
        and "--format both" in lines[0], refused.stderr
    assert {p.name: p.read_bytes() for p in outs["array_record"].iterdir() if p.is_file()} == before


def test_inspect_and_extract_read_array_record_datasets(datasets, tmp_path):
    from shard_utils.read.extract import extract
    from shard_utils.read.report import sample_split

    ar_out, m = datasets.array_record
    tf_out, ref = datasets.tfrecord
    sample = sample_split(m, "train")
    assert sample.problems == [] and sample.scanned == m.num_records("train")
    def tiles(groups):
        return {c: [(t.source_id, t.index, t.shard.rsplit(".", 1)[0]) for t in ts] for c, ts in groups.items()}

    assert tiles(sample.groups) == tiles(sample_split(ref, "train").groups)
    extract(str(ar_out), str(tmp_path / "ar"))
    extract(str(tf_out), str(tmp_path / "tf"))
    def files(folder):  # the records' files, and the map naming their shards
        return {p.relative_to(folder): p.read_bytes().replace(b".array_record,", b".tfrecord,")
                for p in folder.rglob("*") if p.is_file()}

    assert len(files(tmp_path / "ar")) == m.files_seen + 1
    assert files(tmp_path / "ar") == files(tmp_path / "tf")
    summary = run_cli("inspect", ar_out)
    assert summary.returncode == 0 and "train" in summary.stdout, summary.stderr


def test_inspect_names_the_formats_and_the_twins_size(datasets):
    for fmt, formats in (("tfrecord", "TFRecord shards"), ("both", "TFRecord and ArrayRecord shards"),
                         ("array_record", "ArrayRecord shards")):
        out, m = getattr(datasets, fmt)
        done = run_cli("inspect", out)
        lines = done.stdout.splitlines()
        assert done.returncode == 0 and lines[0].endswith(f" 2 cores x 1 host, {formats}"), (done.stdout, done.stderr)
        for name, split in m.splits.items():
            kind = " ArrayRecord" if fmt == "array_record" else ""
            at = lines.index(f"  {name}: {split.num_records} records, {len(split.shards)}{kind} shards, "
                             f"{split.num_bytes / 1e6:.1f} MB")
            twins = sum(t.num_bytes for t in split.array_record_shards or ())
            assert (lines[at + 1] == f"    and their ArrayRecord twins, {twins / 1e6:.1f} MB") == (fmt == "both"), lines


def test_the_resumable_grain_dataset_gives_the_same_steps_from_array_record_shards(datasets):
    grain = pytest.importorskip("grain")
    from shard_utils.read.random_access import RandomAccessSource
    from shard_utils.read.resume import grain_dataset

    out, m = datasets.both
    indexed = grain_dataset(RandomAccessSource(m, "train"), seed=5, global_batch_size=4, process_index=1,
                            process_count=2)
    source = grain.sources.ArrayRecordDataSource(m.array_record_paths("train"))
    direct = grain_dataset(source, seed=5, global_batch_size=4, process_index=1, process_count=2)
    steps = [12, 0, 7, 3]  # in any order: element k is step k's records, whatever came before
    assert [list(direct[k]) for k in steps] == [list(indexed[k]) for k in steps]
    assert len({r for k in range(8) for r in direct[k]}) > 4


@pytest.mark.slow
def test_the_docs_grain_loop_runs_as_written(datasets, tmp_path):
    """docs/random-access.md's marked snippet, unchanged, beside an ArrayRecord dataset named `ds`."""
    import re
    import subprocess
    import sys

    from conftest import REPO

    page = (REPO / "docs" / "random-access.md").read_text(encoding="utf-8")
    [snippet] = re.findall(r"<!-- test: snippet -->\n```python\n(.*?)```", page, re.S)
    shutil.copytree(datasets.array_record[0], tmp_path / "ds")
    done = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert [line.split()[:3] for line in lines] == [[str(k), "(8,", "24,"] for k in range(3)]


@pytest.mark.slow
def test_without_the_package_array_record_is_one_line_naming_the_extra_and_tfrecord_needs_nothing(images, tmp_path):
    from base_install import environment

    env = environment(tmp_path / "site", {"array_record"})
    done = run_cli("build", "--input", images, "--output", tmp_path / "out", "--format", "both", env=env)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert 'pip install -e ".[array_record]"' in lines[0] and "--format both needs array_record" in lines[0]
    plain = run_cli("build", "--input", images, "--output", tmp_path / "plain", "--num-cores", "2", env=env)
    assert plain.returncode == 0, plain.stderr


@pytest.mark.slow
def test_without_the_package_verify_checks_array_record_bytes_and_deep_is_one_line_naming_the_extra(datasets,
                                                                                                    tmp_path):
    """Plain verify reads ArrayRecord shards as bytes (the base install checks any dataset); --deep, which reads
    their records, stops before any work with one line naming what needs the package and the pip command."""
    from base_install import environment

    env = environment(tmp_path / "site", {"array_record"})
    for fmt in ("both", "array_record"):
        out = tmp_path / fmt
        shutil.copytree(getattr(datasets, fmt)[0], out)
        intact = run_cli("verify", out, env=env)
        assert intact.returncode == 0 and "is intact" in intact.stdout, intact.stderr
        deep = run_cli("verify", out, "--deep", env=env)
        lines = deep.stderr.strip().splitlines()
        assert deep.returncode == 2 and len(lines) == 1, deep.stderr
        assert lines[0].startswith("tpu-shards: error: verify --deep") and "needs array_record" in lines[0] \
            and 'pip install -e ".[array_record]"' in lines[0], lines
        twin = load(str(out)).array_record_shards("train")[1]
        data = bytearray((out / twin.path).read_bytes())
        data[100] ^= 1
        (out / twin.path).write_bytes(bytes(data))
        damaged = run_cli("verify", out, env=env)
        assert damaged.returncode == 1 and f"{twin.path}: crc32c" in damaged.stderr, damaged.stderr
        # A reshard keeping the source's formats, or reading ArrayRecord shards, names what the user asked for.
        resharded = run_cli("reshard", out, tmp_path / f"re-{fmt}", *(("--format", "tfrecord") if fmt ==
                                                                       "array_record" else ()), env=env)
        lines = resharded.stderr.strip().splitlines()
        assert resharded.returncode == 2 and len(lines) == 1 and not (tmp_path / f"re-{fmt}").exists(), lines
        assert lines[0].startswith(f"tpu-shards: error: resharding a dataset of --format {fmt} needs array_record")
