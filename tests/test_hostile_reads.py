"""Hostile datasets against the tools that read them (tests/hostile.py makes them): names that would steer writes
out of a folder, special files in place of dataset files, sizes that would allocate without bound, and damage
that `verify` must not call intact. Tools run in subprocesses with a time limit (and a memory limit where the
attack is on memory), so a hang or a crash fails the test instead of the run."""
from __future__ import annotations

import dataclasses
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, write_images
from hostile import CORRUPTIONS, build_valid, edit_manifest, first_shard, hostile_copy, index_of

from shard_utils.format.manifest import ManifestError, load
from shard_utils.read.verify import verify

PY_LIMIT = 2 << 30  # address space of a tool without TensorFlow
TF_LIMIT = 4 << 30  # TensorFlow reserves about 3 GB of address space as it starts
READ_WITH = str(REPO / "tests" / "read_with.py")


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> Path:
    return build_valid(tmp_path_factory.mktemp("valid"))


@pytest.fixture(scope="module")
def new_images(tmp_path_factory) -> Path:
    """Images an append would add to the valid dataset (a new label, so nothing is already in it)."""
    root = tmp_path_factory.mktemp("new")
    write_images(root, {"bird": 2}, size=(40, 30), seed=77)
    return root


def hostile(valid: Path, tmp_path: Path, corruption: str) -> Path:
    return hostile_copy(valid, tmp_path / "ds", corruption, tmp_path / "outside")


def tool_command(tool: str, ds: Path, tmp_path: Path, new_images: Path | None = None) -> list[str]:
    cli = [sys.executable, "-m", "beam_jobs.cli"]
    return {
        "verify": cli + ["verify", str(ds)],
        "extract": cli + ["extract", str(ds), str(tmp_path / "extracted")],
        "inspect": cli + ["inspect", str(ds), "--report", str(tmp_path / "report")],
        "reshard": cli + ["reshard", str(ds), str(tmp_path / "resharded"), "--num-cores", "1"],
        "append": cli + ["build", "--append", "--input", str(new_images), "--output", str(ds), "--splits",
                         "train=0.5,validation=0.5", "--num-cores", "1"],
        "random_access": [sys.executable, READ_WITH, "random_access", str(ds)],
        "loader": [sys.executable, READ_WITH, "loader", str(ds)],
    }[tool]


def run_limited(args: list[str], memory: int | None = None, timeout: int = 90) -> subprocess.CompletedProcess:
    """Run a tool; a hang (past `timeout` seconds) fails the test, as does any exit by signal."""
    def limit() -> None:
        if memory is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=REPO, preexec_fn=limit,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPO)})
    except subprocess.TimeoutExpired:
        pytest.fail(f"{args[2:4]} still running after {timeout}s: it hangs")
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}: {proc.stderr[-2000:]}"
    return proc


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    """The tool's own lines on stderr (TensorFlow's start-up notes left out)."""
    notes = ("I0000", "WARNING: All log messages")
    return [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith(notes)]


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str, codes=(1, 2)) -> str:
    lines = error_lines(proc)
    assert proc.returncode in codes and len(lines) == 1, (proc.returncode, proc.stderr[-3000:])
    assert "internal error" not in lines[0] and all(n in lines[0] for n in needles), lines[0]
    return lines[0]


def snapshot(root: Path, skip: Path | None = None) -> dict[str, bytes | None]:
    """Every path under root with its bytes (None for folders), `skip` and what is under it left out."""
    return {str(p): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))
            if skip is None or (p != skip and skip not in p.parents)}


# ------------------------------------------------------------------ the manifest: names, sizes, counts


@pytest.mark.parametrize("corruption, says", [
    ("split_absolute", "split name"), ("split_climbing", "split name"), ("split_control", "split name"),
    ("split_long", "longer than 200"),
])
def test_split_names_that_are_not_plain_tokens_are_refused_on_load_and_by_verify(valid, tmp_path, corruption, says):
    ds = hostile(valid, tmp_path, corruption)
    with pytest.raises(ManifestError, match=says) as err:
        load(str(ds))
    assert "\n" not in str(err.value)
    problems = verify(str(ds))
    assert len(problems) == 1 and says in problems[0]


@pytest.mark.slow
@pytest.mark.parametrize("corruption", ["split_absolute", "split_climbing"])
def test_reshard_of_a_split_named_to_escape_writes_nothing_outside(valid, tmp_path, corruption):
    ds = hostile(valid, tmp_path, corruption)
    dst = tmp_path / "a" / "b" / "dst"
    dst.parent.mkdir(parents=True)
    victims = [tmp_path / "outside" / "victim-00000-of-00001.tfrecord", tmp_path / "outside" / "victim.index.avro",
               tmp_path / "a" / "victim-00000-of-00001.tfrecord", tmp_path / "a" / "victim.index.avro"]
    for victim in victims:
        victim.write_bytes(b"another dataset's file")
    before = snapshot(tmp_path, skip=dst)
    proc = run_limited([sys.executable, "-m", "beam_jobs.cli", "reshard", str(ds), str(dst), "--num-cores", "1"])
    assert_one_line_error(proc, "split name")
    assert snapshot(tmp_path, skip=dst) == before
    assert all(v.read_bytes() == b"another dataset's file" for v in victims)


@pytest.mark.parametrize("corruption, says", [
    ("image_size_huge", "image_size must be null or [height, width], each in 1..65535"),
    ("image_pixels_huge", "image_size 20000x20000 is more than 268435456 pixels"),
    ("records_beyond_bytes", "20000000 records cannot fit in"),
    ("feature_shape_huge", "holds up to 10000000000 values per record"),
    ("options_nested", "manifest: 'options': nests objects and lists more than 32 deep; refused"),
    ("options_shard_mb_list", "manifest: options.target_shard_mb must be number or null, got list; refused"),
])
def test_sizes_in_a_manifest_are_bounded_before_any_reader_allocates(valid, tmp_path, corruption, says):
    """One check on load, so the loader, the Grain source, verify, reshard and append refuse the same line."""
    ds = hostile(valid, tmp_path, corruption)
    with pytest.raises(ManifestError) as err:
        load(str(ds))
    assert says in str(err.value)
    assert verify(str(ds)) == [str(err.value)]


@pytest.mark.parametrize("corruption, says", [
    ("shard_listed_twice", "as split 'train' shard 0 does; every file must be listed once"),
    ("shard_shared_between_splits", "as split 'train' shard 0 does; every file must be listed once"),
    ("class_counts_negative", "a count must be in 0..4"),
    ("class_counts_impossible", "a count must be in 0..4"),
])
def test_verify_does_not_call_a_file_listed_twice_or_impossible_counts_intact(valid, tmp_path, corruption, says):
    ds = hostile(valid, tmp_path, corruption)
    problems = verify(str(ds))
    assert problems and any(says in p for p in problems), problems


# ------------------------------------------------------------ special files, and sizes read from files


READS = {  # the dataset files each tool reads (inspect says on its page what it cannot read, but for the manifest)
    "verify": {"manifest", "shard", "index", "rejected"}, "extract": {"manifest", "shard"},
    "inspect": {"manifest", "shard", "rejected"}, "reshard": {"manifest", "shard", "index", "rejected"},
    "append": {"manifest", "shard", "index", "rejected"}, "random_access": {"manifest", "shard", "index"},
    "loader": {"manifest", "shard"},
}


def readers_of(kinds: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(tool, kind) for tool in sorted(READS) for kind in kinds if kind in READS[tool]]


@pytest.mark.slow
@pytest.mark.parametrize("tool, kind", readers_of(("manifest", "shard", "index", "rejected")))
def test_a_named_pipe_in_place_of_a_dataset_file_is_refused_not_waited_on(valid, new_images, tmp_path, tool, kind):
    ds = hostile(valid, tmp_path, f"{kind}_fifo")
    proc = run_limited(tool_command(tool, ds, tmp_path, new_images), timeout=60)
    assert_refused(proc, tool, kind, tmp_path / "report" / "index.html")


@pytest.mark.slow
@pytest.mark.parametrize("tool, kind", readers_of(("manifest", "shard", "index")))
def test_dev_zero_in_place_of_a_dataset_file_is_refused_within_a_memory_limit(valid, new_images, tmp_path, tool,
                                                                              kind):
    ds = hostile(valid, tmp_path, f"{kind}_dev_zero")
    memory = TF_LIMIT if tool == "loader" else PY_LIMIT
    proc = run_limited(tool_command(tool, ds, tmp_path, new_images), memory=memory, timeout=60)
    assert_refused(proc, tool, kind, tmp_path / "report" / "index.html")


def assert_refused(proc: subprocess.CompletedProcess, tool: str, kind: str, page: Path) -> None:
    """The tool refuses the file saying why: in one line (verify: among its findings; inspect: on its page, but
    for the manifest)."""
    if tool == "verify":
        assert proc.returncode == 1 and "internal error" not in proc.stderr
        assert "not a regular file" in proc.stderr, proc.stderr[-3000:]
    elif tool == "inspect" and kind != "manifest":
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "not a regular file" in page.read_text(encoding="utf-8")
    else:
        assert_one_line_error(proc, "not a regular file")


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["verify", "reshard", "append", "random_access"])
def test_an_index_block_declaring_20m_rows_is_refused_within_a_memory_limit(valid, new_images, tmp_path, tool):
    ds = hostile(valid, tmp_path, "index_huge_block")
    proc = run_limited(tool_command(tool, ds, tmp_path, new_images), memory=PY_LIMIT, timeout=60)
    if tool == "verify":
        assert proc.returncode == 1 and "declares 20000000 rows" in proc.stderr, proc.stderr[-3000:]
    else:
        assert_one_line_error(proc, "declares 20000000 rows")


@pytest.mark.slow
def test_a_record_length_of_2_to_the_40_never_reaches_tensorflows_reader(valid, tmp_path):
    ds = hostile(valid, tmp_path, "record_length_2_40")
    proc = run_limited(tool_command("loader", ds, tmp_path), memory=TF_LIMIT)
    assert_one_line_error(proc, "ManifestError", "length 1099511627776 runs past the end of the file")


# ---------------------------------------------------------------------------------------------- verify


def test_verify_names_a_shard_linked_outside_the_folder_and_a_garbage_rejected_report(valid, tmp_path):
    ds = hostile(valid, tmp_path / "link", "shard_link_outside")
    assert [p for p in verify(str(ds)) if "symbolic link" in p] == [
        f"train-00000-of-00002.tfrecord: a symbolic link leading outside the dataset folder (to "
        f"{tmp_path / 'link' / 'outside' / 'copied.tfrecord'})"]
    ds = hostile(valid, tmp_path / "garbage", "rejected_garbage")
    assert verify(str(ds)) == ["rejected.jsonl line 1 is not a report entry (a JSON object with a source and a "
                               "reason)"]


def test_verify_names_a_rejected_report_that_lists_fewer_files_than_counted(valid, tmp_path):
    ds = hostile(valid, tmp_path, "rejected_garbage")
    (ds / "rejected.jsonl").write_text("")
    assert verify(str(ds)) == ["rejected.jsonl: 0 rejected files listed, the manifest says 1"]


def test_verify_deep_names_a_stored_jpeg_with_too_many_scans_without_decoding_it(tmp_path):
    from handmade import image_record, write_dataset
    from hostile import scan_bomb_jpeg

    records = [image_record(0, 0, "cat", "cat/bomb.jpg", scan_bomb_jpeg(150)), image_record(1, 0, "cat", "cat/ok.jpg")]
    write_dataset(tmp_path / "ds", {"train": records}, ["cat"], shards_per_split=1)
    assert verify(str(tmp_path / "ds")) == []
    assert verify(str(tmp_path / "ds"), deep=True) == [
        "train-00000-of-00001.tfrecord: record 0: image is too complex to decode: JPEG has more than 100 scans "
        "(progressive images have about 10)"]


# ------------------------------------------------------------------------------------- one-line errors


@pytest.mark.slow
@pytest.mark.parametrize("tool, corruption, says", [
    ("reshard", "rejected_garbage", "rejected.jsonl line 1 is not a report entry"),
    ("append", "rejected_garbage", "rejected.jsonl line 1 is not a report entry"),
    ("append", "index_not_avro", "not an Avro index file"),  # reshard already said so in one line
])
def test_reshard_and_append_on_a_damaged_report_or_index_are_one_line_errors(valid, new_images, tmp_path, tool,
                                                                            corruption, says):
    ds = hostile(valid, tmp_path, corruption)
    before = (ds / "manifest.json").read_bytes()
    proc = run_limited(tool_command(tool, ds, tmp_path, new_images))
    assert_one_line_error(proc, says)
    assert (ds / "manifest.json").read_bytes() == before and not (tmp_path / "resharded" / "manifest.json").exists()


def names_and_manifest(ds: Path) -> tuple[list[str], bytes]:
    return sorted(p.name for p in ds.iterdir()), (ds / "manifest.json").read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("corruption, says", [
    ("shard_wrong_size", "train-00000-of-00002.tfrecord: size {longer} bytes, manifest says {size}"),
    ("shard_fifo", "train-00000-of-00002.tfrecord: cannot read: not a regular file"),
    ("shard_dev_zero", "train-00000-of-00002.tfrecord: cannot read: not a regular file"),
    ("shard_link_outside", "train-00000-of-00002.tfrecord: a symbolic link leading outside the dataset folder"),
    ("index_not_avro", "train.index.avro: not an Avro index file"),
    ("index_fifo", "train.index.avro: cannot read: not a regular file"),
])
def test_append_checks_the_dataset_it_extends_before_any_work(valid, new_images, tmp_path, corruption, says):
    """The cheap part of verify (sizes, special files, links, index headers) refuses the dataset in one line, exit 2,
    before anything is listed or written (no temporary folder is made)."""
    size = load(str(valid)).splits["train"].shards[0].num_bytes
    says = says.format(size=size, longer=size + 7)
    ds = hostile(valid, tmp_path, corruption)
    before = names_and_manifest(ds)
    proc = run_limited(tool_command("append", ds, tmp_path, new_images), timeout=60)
    line = assert_one_line_error(proc, f"tpu-shards: error: cannot append to {ds}: it is damaged: {says}", codes=(2,))
    assert line.endswith("; tpu-shards verify lists every problem; nothing was written"), line
    assert names_and_manifest(ds) == before and not (ds / ".tpu-shards-tmp").exists()


def test_append_onto_a_swapped_shard_it_does_not_read_is_not_checked_cheaply(valid, tmp_path):
    """A shard of the right size with other bytes passes the cheap check on local disk (catching it means reading
    every shard); `verify` finds it. (An append that rewrites that shard's generation checks it: test_append.)"""
    from shard_utils.read.verify import check_cheap

    ds = hostile(valid, tmp_path, "shard_swapped")
    assert check_cheap(load(str(ds))) == []
    assert "train-00000-of-00002.tfrecord: crc32c" in " ".join(verify(str(ds)))
    size = load(str(valid)).splits["train"].shards[0].num_bytes
    assert check_cheap(load(str(hostile(valid, tmp_path / "size", "shard_wrong_size")))) == [
        f"train-00000-of-00002.tfrecord: size {size + 7} bytes, manifest says {size}"]


def in_read_only(folder: Path, args: list[str]) -> list[str]:
    """The command run with folder read-only: by its mode, or for root (who writes anyway) as a read-only bind
    mount in a mount namespace of its own; skips the test where neither can be had."""
    folder.chmod(0o555)
    if os.geteuid() != 0:
        return args
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("running as root without a way to make a folder read-only (unshare -m)")
    return ["unshare", "-m", "sh", "-c", 'mount -o bind,ro "$0" "$0" && exec "$@"', str(folder), *args]


def test_extract_into_a_read_only_folder_is_a_one_line_error(valid, tmp_path):
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    out = read_only / "out"
    command = [sys.executable, "-m", "beam_jobs.cli", "extract", str(valid), str(out)]
    proc = run_limited(in_read_only(read_only, command))
    assert_one_line_error(proc, f"cannot write into {out}")
    assert list(read_only.iterdir()) == []


def test_extract_under_a_file_is_a_one_line_error(valid, tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    proc = run_limited([sys.executable, "-m", "beam_jobs.cli", "extract", str(valid), str(tmp_path / "a-file" / "out")])
    assert_one_line_error(proc, "cannot write into")


# ----------------------------------------------------------------------------------------- gs:// paths


@pytest.mark.parametrize("argv, code", [
    (["verify", "gs://b/a/../ds"], 1),
    (["extract", "gs://b//ds", "out"], 1),
    (["build", "--input", "gs://b/a/../images", "--output", "out"], 2),
    (["build", "--input", "in", "--output", "gs://b//out"], 2),
    (["build", "--listing", "gs://b/./list.csv", "--output", "out"], 2),
    (["reshard", "src", "gs://b/x/../dst"], 2),
])
def test_gcs_paths_with_empty_or_dot_parts_are_one_line_errors(argv, code, capsys, tmp_path, monkeypatch):
    from beam_jobs.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(argv) == code
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "has an empty, '.' or '..' part" in lines[0], lines


@pytest.mark.slow
def test_a_record_length_of_2_to_the_40_in_a_bucket_never_reaches_tensorflows_reader(valid, tmp_path, gcs):
    """With check_files="framing" the loader walks a gs:// shard's record headers through the storage layer
    (ranged reads) before tf.data reads it; the valid dataset in the same bucket passes the check."""
    from shard_utils.read.loader import make_dataset

    ds = hostile(valid, tmp_path, "record_length_2_40")
    bucket = gcs.new_bucket("framing")
    gcs.upload_tree(ds, bucket, "hostile")
    gcs.upload_tree(valid, bucket, "valid")
    shard = f"gs://{bucket}/hostile/train-00000-of-00002.tfrecord"
    with pytest.raises(ManifestError, match=f"shard {shard} cannot be read safely: record 0: length "
                                            "1099511627776 runs past the end of the file"):
        make_dataset(load(f"gs://{bucket}/hostile"), "train", 1, training=False, repeat=False, image_size=8,
                     check_files="framing")
    assert make_dataset(load(f"gs://{bucket}/valid"), "train", 1, training=False, repeat=False, image_size=8,
                        check_files="framing") is not None


@pytest.mark.slow
def test_by_default_a_bucket_shard_is_checked_by_its_stored_checksum_without_reading_it(valid, tmp_path, gcs,
                                                                                        monkeypatch):
    """A shard changed since the build (its manifest entry left as it was) is refused from its object metadata
    alone; the valid dataset passes; no shard's bytes are read before tf.data reads them."""
    from shard_utils import storage
    from shard_utils.read import loader

    ds = tmp_path / "changed"
    shutil.copytree(valid, ds)
    shard = ds / "train-00000-of-00002.tfrecord"
    data = bytearray(shard.read_bytes())
    data[-5] ^= 0xFF  # same size, another CRC32C
    shard.write_bytes(bytes(data))
    bucket = gcs.new_bucket("stored")
    gcs.upload_tree(ds, bucket, "changed")
    gcs.upload_tree(valid, bucket, "valid")
    opened: list[str] = []
    real_open = storage.open_read
    monkeypatch.setattr(storage, "open_read", lambda uri, *a, **k: opened.append(uri) or real_open(uri, *a, **k))
    with pytest.raises(ManifestError, match=r"shard train-00000-of-00002.tfrecord: crc32c .*, manifest says .* \(it "
                                            f"changed since the build\\). Run `tpu-shards verify gs://{bucket}/changed`"):
        loader.make_dataset(load(f"gs://{bucket}/changed"), "train", 1, training=False, repeat=False, image_size=8)
    assert loader.make_dataset(load(f"gs://{bucket}/valid"), "train", 1, training=False, repeat=False,
                               image_size=8) is not None
    assert not [uri for uri in opened if uri.endswith(".tfrecord")]


@pytest.mark.tf  # imports TensorFlow (the loader)
def test_check_files_takes_true_false_or_framing(valid):
    from shard_utils.read.loader import make_dataset

    with pytest.raises(ValueError, match="check_files='deep': give True, False or 'framing'"):
        make_dataset(str(valid), "train", 1, check_files="deep")


def test_a_manifest_with_a_million_labels_is_written_back_in_linear_time(valid, tmp_path):
    """Every tool that writes a manifest copies it to a dict first: a million labels and a million class counts
    per split in well under a CPU second (dataclasses.asdict copied them value by value: seconds)."""
    import time
    from dataclasses import replace

    m = load(str(hostile(valid, tmp_path, "labels_million")))
    m = replace(m, splits={name: replace(s, class_counts=dict.fromkeys(m.labels, 0)) for name, s in m.splits.items()})
    started = time.process_time()
    plain = m.to_dict()
    spent = time.process_time() - started
    assert plain["labels"] == m.labels and len(plain["splits"]["train"]["class_counts"]) == len(m.labels)
    assert spent < 1.0, spent


@pytest.mark.slow
def test_append_to_a_dataset_with_a_split_named_like_a_generation_is_one_line(valid, new_images, tmp_path):
    """A split named `train-g001` beside `train` (builds refuse such names now; older ones could make it)."""
    ds = hostile(valid, tmp_path, "split_generation_name")
    proc = run_limited(tool_command("append", ds, tmp_path, new_images), timeout=90)
    assert_one_line_error(proc, f"tpu-shards: error: cannot append to {ds}: split 'train-g001' is also the name of "
                                "generation 1 of split 'train'", codes=(2,))


# ------------------------------------------------------------------- manifests whose values are hostile


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["verify", "reshard", "append", "random_access"])
@pytest.mark.parametrize("corruption", ["options_nested", "options_shard_mb_list"])
def test_tools_refuse_a_hostile_options_value_in_one_line_never_exit_3(valid, new_images, tmp_path, tool, corruption):
    ds = hostile(valid, tmp_path, corruption)
    before = names_and_manifest(ds)
    proc = run_limited(tool_command(tool, ds, tmp_path, new_images))
    if tool == "verify":
        assert proc.returncode == 1 and error_lines(proc)[-1].startswith("tpu-shards: manifest: "), proc.stderr
    else:
        assert_one_line_error(proc, "manifest: ", "; refused")
    assert names_and_manifest(ds) == before and not (tmp_path / "resharded" / "manifest.json").exists()


def test_depth_and_numbers_are_checked_without_recursion():
    from shard_utils.format.json_values import depth_problem, option_problem

    deep: list = []
    for _ in range(100_000):  # far past Python's recursion limit
        deep = [deep]
    assert depth_problem({"x": deep}) == "'x': nests objects and lists more than 32 deep"
    assert depth_problem({"a": [1.5, float("nan")]}) == "'a': holds nan, not a finite number"
    assert depth_problem({"n": 2**64}) == "'n': holds an integer beyond 64 bits"
    assert depth_problem({"fine": [[{"k": 1}]]}) is None
    assert option_problem({"seed": True}) == "options.seed must be int or null, got bool"
    assert option_problem({"splits": {"train": "0.5"}}) == ("options.splits must be split fractions or string, "
                                                           "got dict")
    assert option_problem({"splits": "from folders", "metadata": {"name": "x"}, "unknown": [1, {"a": 2}]}) is None


# ------------------------------------------------------------------------- records over indexes


def test_plain_verify_finds_index_rows_whose_ids_and_labels_are_not_their_records(valid, tmp_path):
    ds = hostile(valid, tmp_path, "index_rows_disagree")
    assert load(str(ds)).splits["train"].index is not None  # the index's checksums match the manifest
    problems = verify(str(ds))
    assert len(problems) == 4 and problems[0] == (
        "train.index.avro: row 0: train-00000-of-00002.tfrecord record 0: its index row gives source id "
        "'x/cat/img0000.jpg', the record 'cat/img0000.jpg'"), problems


def test_plain_verify_finds_a_row_10_mb_past_its_shard(valid, tmp_path):
    ds = hostile(valid, tmp_path, "index_row_past_end")
    problems = verify(str(ds))
    assert any("fall outside the shard's" in p and "train-00000-of-00002.tfrecord" in p for p in problems), problems


def test_a_row_that_is_not_its_record_stops_a_copy(valid, tmp_path):
    """What reshard and an append's carry copy from: the record wins, a disagreeing row is a DamagedShard."""
    from shard_utils import storage
    from shard_utils.format.index import read_index
    from shard_utils.sharding.copy_records import DamagedShard, shard_records

    ds = hostile(valid, tmp_path, "index_rows_disagree")
    m = load(str(ds))
    with open(ds / m.splits["train"].index.path, "rb") as f:
        rows = tuple(r for r in read_index(f) if r.shard == 0)
    shard = m.splits["train"].shards[0]
    with pytest.raises(DamagedShard, match=r"^train-00000-of-00002.tfrecord: record 0: its index row gives source "
                                           r"id 'x/cat/img0000.jpg', the record 'cat/img0000.jpg'$"):
        list(shard_records(storage.join(m.location, shard.path), shard, rows, seed=0))
    same_ids = tuple(dataclasses.replace(r, source_id=r.source_id[2:]) for r in rows)  # labels still shifted
    with pytest.raises(DamagedShard, match=r"record 0: its index row gives labels \[1\], the record \[0\]$"):
        list(shard_records(storage.join(m.location, shard.path), shard, same_ids, seed=0))


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["reshard", "append"])
@pytest.mark.parametrize("corruption, says", [
    ("index_rows_disagree", "train-00000-of-00002.tfrecord: record 0: its index row gives source id "
                            "'x/cat/img0000.jpg', the record 'cat/img0000.jpg'"),
    ("index_row_past_end", "train-00000-of-00002.tfrecord"),
])
def test_reshard_and_append_refuse_an_index_that_is_not_its_records(valid, new_images, tmp_path, tool, corruption,
                                                                    says):
    ds = hostile(valid, tmp_path, corruption)
    before = names_and_manifest(ds)
    proc = run_limited(tool_command(tool, ds, tmp_path, new_images))
    line = assert_one_line_error(proc, "damaged")
    assert says.replace(": record 0", " record 0") in line or says in line, line
    if corruption == "index_row_past_end":
        assert ("fall outside the shard's" if tool == "append" else "its index row says 10001331..") in line, line
    assert names_and_manifest(ds) == before and not (tmp_path / "resharded" / "manifest.json").exists()


# ------------------------------------------------------------------- reads bounded by the manifest


@pytest.mark.slow
def test_verify_says_a_6_gb_shard_and_a_2_gb_index_differ_in_size_without_reading_them(valid, tmp_path):
    """Sparse files (nothing on disk) of 6 GB in place of a shard and 2 GB in place of an index, verify under an
    address-space limit below either: their sizes come from stat, each one line, and nothing is read."""
    ds = hostile(valid, tmp_path, "shard_sparse_6g")
    CORRUPTIONS["index_sparse_2g"](ds, tmp_path / "outside")  # in place: a copy of the 6 GB hole writes 6 GB of zeros
    m = load(str(valid))
    shard, index = m.splits["train"].shards[0], m.splits["train"].index
    proc = run_limited(tool_command("verify", ds, tmp_path), memory=PY_LIMIT)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert error_lines(proc) == [
        f"tpu-shards: {shard.path}: size {6 << 30} bytes, manifest says {shard.num_bytes}",
        f"tpu-shards: {index.path}: size {2 << 30} bytes, manifest says {index.num_bytes}"], proc.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["verify", "reshard", "append", "inspect"])
def test_a_rejected_report_of_one_3_gb_line_is_refused_within_a_memory_limit(valid, new_images, tmp_path, tool):
    ds = hostile(valid, tmp_path, "rejected_garbage")
    (ds / "rejected.jsonl").write_bytes(b"")
    os.truncate(ds / "rejected.jsonl", 3 << 30)  # no line break in 3 GB
    proc = run_limited(tool_command(tool, ds, tmp_path, new_images), memory=PY_LIMIT)
    says = "rejected.jsonl line 1 is longer than 1048576 bytes; not a report entry"
    if tool == "verify":
        assert proc.returncode == 1 and error_lines(proc) == [f"tpu-shards: {says}"], proc.stderr[-3000:]
    elif tool == "inspect":  # the page lists the line for what it is
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "(longer than 1048576 bytes)" in (tmp_path / "report" / "index.html").read_text(encoding="utf-8")
    else:
        assert_one_line_error(proc, says)


@pytest.mark.slow
def test_a_shard_larger_than_verify_holds_is_streamed_with_its_index_rows(valid, tmp_path):
    """A shard over IN_MEMORY_SHARD_BYTES (its manifest entry and index made to match) is checked whole, records and
    index rows, without its bytes in memory at once; a row that is not its record is still found."""
    import tracemalloc

    from index_helpers import redescribed, rewrite_index

    from shard_utils import storage
    from shard_utils.format import schema, tfrecord
    from shard_utils.format.index import IndexRow
    from shard_utils.read.verify import IN_MEMORY_SHARD_BYTES

    ds = tmp_path / "ds"
    shutil.copytree(valid, ds)
    rel = first_shard(ds)
    end = (ds / rel).stat().st_size
    pads = []
    with open(ds / rel, "ab") as f:
        while end + sum(pads) <= IN_MEMORY_SHARD_BYTES:
            record = schema.encode_example(schema.ImageRecord(bytes(16 << 20), 1, 1, 3, 0, "cat", f"pad/{len(pads)}",
                                                              "0" * 64))
            pads.append(f.write(tfrecord.frame(record)))

    def grown(rows: list, source_ids=lambda i: f"pad/{i}") -> list:
        added = [IndexRow(source_ids(i), 0, end + sum(pads[:i]), n, 0, (0,), "0" * 64, 1, 1)
                 for i, n in enumerate(pads)]
        return [*[r for r in rows if r.shard == 0], *added, *[r for r in rows if r.shard != 0]]

    def change(obj: dict) -> None:
        digest = storage.Digest()
        with open(ds / rel, "rb") as f:
            while block := f.read(1 << 24):
                digest.update(block)
        split = obj["splits"]["train"]
        split["shards"][0].update(num_bytes=digest.size, crc32c=digest.crc32c, sha256=digest.sha256,
                                  num_records=split["shards"][0]["num_records"] + len(pads))
        split["num_bytes"] = sum(s["num_bytes"] for s in split["shards"])
        split["num_records"] = split["index"]["num_rows"] = sum(s["num_records"] for s in split["shards"])
        obj["files_seen"] += len(pads)

    rewrite_index(ds, "train", grown)
    edit_manifest(ds, change)
    redescribed(ds)
    tracemalloc.start()
    assert verify(str(ds)) == []
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 3 * pads[0] + (16 << 20), peak  # a record or two at a time, never the shard's 270 MB

    with open(ds / index_of(ds), "rb") as f:
        kept = [r for r in __import__("shard_utils.format.index", fromlist=["x"]).read_index(f)
                if not r.source_id.startswith("pad/")]
    rewrite_index(ds, "train", lambda rows: grown(kept, lambda i: "evil" if i == 1 else f"pad/{i}"))
    redescribed(ds)
    first = load(str(ds)).splits["train"].shards[0].num_records - len(pads)
    assert verify(str(ds)) == [f"train.index.avro: row {first + 1}: {rel} record {first + 1}: its index row gives "
                               "source id 'evil', the record 'pad/1'"]


def _reshard_cost(ds: Path, out: Path) -> tuple[float, float]:
    """(CPU seconds, peak resident MB) of `tpu-shards reshard ds out` in its own process, which must succeed."""
    cli = [sys.executable, "-m", "beam_jobs.cli", "reshard", str(ds), str(out), "--num-cores", "1"]
    proc = subprocess.Popen(cli, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        proc.returncode = 0  # reaped by wait4
    assert os.waitstatus_to_exitcode(status) == 0, proc.stderr.read().decode()[-2000:]
    proc.stderr.close()
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


@pytest.mark.slow
def test_reshard_of_a_million_labels_costs_little_more_than_without(valid, tmp_path):
    """A million labels no record has (a 17 MB manifest): the reshard within 8 times the CPU of the same reshard
    without them (4.6-6.6 measured: the plain one's 2-3 s is mostly start-up, and moves with the machine's load;
    14 before) and 1000 MB more memory at its peak (about 700 measured; 1900 before; issue 38 asks for 500: not
    met yet), its manifest no larger than its source's, and verify finds it intact."""
    ds = hostile(valid, tmp_path, "labels_million")
    plain_cpu, plain_mb = _reshard_cost(valid, tmp_path / "plain")
    cpu, mb = _reshard_cost(ds, tmp_path / "million")
    assert (tmp_path / "million" / "manifest.json").stat().st_size <= (ds / "manifest.json").stat().st_size
    assert cpu < 8 * plain_cpu and mb - plain_mb < 1000, (cpu, plain_cpu, mb, plain_mb)
    assert verify(str(tmp_path / "million")) == []  # its croissant.json (89 MB) is within what verify reads


def test_a_reshard_worker_refuses_a_source_whose_manifest_changed_after_the_job_was_made(valid, tmp_path):
    """The workers compare the manifest's bytes with the ones the job was made from, instead of parsing it again."""
    from beam_jobs.jobs.reshard import load_source, split_tasks

    ds = tmp_path / "ds"
    shutil.copytree(valid, ds)
    source, digest = load_source(str(ds))
    assert [(t.split, t.position, len(t.rows)) for t in split_tasks("train", source, digest)] == [("train", 0, 2),
                                                                                                  ("train", 1, 2)]
    edit_manifest(ds, lambda obj: obj["options"].update(seed=5))
    [out] = split_tasks("train", source, digest)
    assert (out.tag, out.value) == ("damaged", "the source dataset changed after this job was made")
    (ds / "manifest.json").unlink()
    [out] = split_tasks("train", source, digest)
    assert out.tag == "damaged" and out.value.startswith("the source's manifest cannot be read: "), out.value
