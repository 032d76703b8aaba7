"""Random access through the index: exact bytes, batched and coalesced reads, damage, hostile rows, Grain."""
import io
import pickle
import random
import shutil
from concurrent.futures import ThreadPoolExecutor

import grain
import numpy as np
import pytest
from conftest import run_job, write_images
from index_helpers import add_index, framed_records, image_record, rewrite_index, write_dataset
from PIL import Image

from shard_utils import storage
from shard_utils.format import manifest as manifest_mod
from shard_utils.format import schema
from shard_utils.format.index import IndexFormatError
from shard_utils.format.schema import ExtraSpec
from shard_utils.read.random_access import (
    Decoder,
    RandomAccessSource,
    RecordReadError,
    host_slice,
    load_indexes,
    sources,
)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A job-built dataset (3 labels, 2 splits, 4 + 2 shards) given an index by the test-only scanner."""
    base = tmp_path_factory.mktemp("random_access")
    write_images(base / "in", {"cat": 14, "dog": 13, "fish": 13}, size=(40, 30))
    run_job(base / "in", base / "out", "--splits", "train=0.75,validation=0.25", "--image-size", "32",
            "--resize", "fill", "--num-cores", "2")
    add_index(base / "out")
    return base / "out"


@pytest.fixture
def copy(dataset, tmp_path):
    shutil.copytree(dataset, tmp_path / "ds")
    return tmp_path / "ds"


def shard_records(out, split="train"):
    m = manifest_mod.load(str(out))
    return [data for s in m.split(split).shards for _, _, data in framed_records(out / s.path)]


class CountingReader:
    """The real ranged reader, counting its calls."""

    def __init__(self):
        self.calls = []

    def __call__(self, uri, start, length):
        self.calls.append((uri, start, length))
        return storage.read_range(uri, start, length)


def test_every_record_reads_back_exactly(dataset):
    src = RandomAccessSource(str(dataset), "train")
    expected = shard_records(dataset)
    assert len(src) == len(expected) == manifest_mod.load(str(dataset)).num_records("train")
    assert [src[i] for i in range(len(src))] == expected
    assert src[-1] == expected[-1] and src[np.int64(2)] == expected[2]
    with pytest.raises(IndexError, match="outside split 'train'"):
        src[len(src)]
    assert repr(src) == f"RandomAccessSource(dataset={str(dataset)!r}, split='train', num_records={len(src)})"


def test_batched_reads_group_by_shard_and_coalesce(dataset):
    reader = CountingReader()
    src = RandomAccessSource(str(dataset), "train", read_range=reader)
    expected = shard_records(dataset)
    order = list(range(len(src))) * 2
    random.Random(3).shuffle(order)
    assert src._getitems(order) == [expected[i] for i in order]
    num_shards = len(src.manifest.split("train").shards)
    assert len(reader.calls) == num_shards  # one read per shard: every record is adjacent to the next
    reader.calls.clear()
    assert src._getitems([0, 2]) == [expected[0], expected[2]]
    assert len(reader.calls) == 2  # not adjacent: two reads, nothing between them fetched


def test_threads_read_the_same_bytes(dataset):
    src = RandomAccessSource(str(dataset), "train")
    expected = shard_records(dataset)
    order = list(range(len(src))) * 4
    random.Random(1).shuffle(order)
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(src.__getitem__, order)) == [expected[i] for i in order]


def test_pickles_without_handles_and_reads_after(dataset):
    src = RandomAccessSource(str(dataset), "validation")
    again = pickle.loads(pickle.dumps(src))
    assert len(again) == len(src) and again[3] == src[3] and repr(again) == repr(src)


def test_all_splits_load_once(dataset):
    m = manifest_mod.load(str(dataset))
    indexes = load_indexes(m)
    assert set(indexes) == {"train", "validation"}
    assert indexes["train"].offsets.dtype == np.int64 and len(indexes["train"]) == m.num_records("train")
    srcs = sources(m)
    assert srcs["validation"]._index is not None and srcs["validation"][0] == shard_records(dataset, "validation")[0]


def test_decoder_gives_numpy_image_label_and_source(dataset):
    src = RandomAccessSource(str(dataset), "train")
    decode = Decoder.for_source(src)
    record = schema.decode_example(src[5])
    out = decode(src[5])
    assert out["image"].dtype == np.uint8 and out["image"].shape == (32, 32, 3)
    with Image.open(io.BytesIO(record[schema.IMAGE_ENCODED])) as image:
        assert np.array_equal(out["image"], np.asarray(image.convert("RGB")))
    assert out["label"] == record[schema.LABEL] and out["source_id"] == record[schema.SOURCE_ID].decode()
    assert pickle.loads(pickle.dumps(decode))(src[5])["source_id"] == out["source_id"]


def test_damaged_record_names_split_index_and_shard(dataset, copy):
    src = RandomAccessSource(str(copy), "train")
    shard = src.manifest.split("train").shards[1]
    first = src.manifest.split("train").shards[0].num_records
    offset, length, _ = framed_records(copy / shard.path)[2]
    data = bytearray((copy / shard.path).read_bytes())
    data[offset + length // 2] ^= 0x40
    (copy / shard.path).write_bytes(bytes(data))
    with pytest.raises(RecordReadError, match=rf"record {first + 2} \({shard.path} at byte {offset}\).*data checksum"):
        src[first + 2]
    with pytest.raises(RecordReadError, match=f"record {first + 2}"):
        src._getitems([first + 1, first + 2, first + 3])
    assert src[first + 3] == shard_records(dataset)[first + 3]  # its neighbours still read


def test_truncated_shard_is_a_read_error(copy):
    src = RandomAccessSource(str(copy), "train")
    shard = src.manifest.split("train").shards[0]
    (copy / shard.path).write_bytes((copy / shard.path).read_bytes()[:-100])
    with pytest.raises(RecordReadError, match=f"record {shard.num_records - 1} .*short read"):
        src[shard.num_records - 1]


@pytest.mark.parametrize("change, message", [
    (lambda r: r.__class__(**{**r.__dict__, "offset": r.offset + 10**6}), "outside the shard"),
    (lambda r: r.__class__(**{**r.__dict__, "length": 1 << 40}), "exceeds"),
    (lambda r: r.__class__(**{**r.__dict__, "length": 3}), "shorter than a framed record"),
    (lambda r: r.__class__(**{**r.__dict__, "shard": r.shard + 1}), "counts put it in shard"),
])
def test_hostile_rows_are_refused_before_any_read(copy, change, message):
    rewrite_index(copy, "train", lambda rows: [change(r) if i == 7 else r for i, r in enumerate(rows)])
    reader = CountingReader()
    with pytest.raises(IndexFormatError, match=f"row 7 .*{message}"):
        RandomAccessSource(str(copy), "train", read_range=reader)
    assert reader.calls == []


def test_damaged_or_missing_index_is_refused(copy):
    path = copy / "train.index.avro"
    data = bytearray(path.read_bytes())
    data[-5] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match="crc32c .* the index is damaged"):
        RandomAccessSource(str(copy), "train")
    m = manifest_mod.load(str(copy))
    raw = m.to_dict()
    del raw["splits"]["validation"]["index"]
    (copy / "manifest.json").write_text(manifest_mod.from_dict(raw).to_json())
    with pytest.raises(IndexFormatError, match="split 'validation' has no index"):
        RandomAccessSource(str(copy), "validation")


def ids(batches):
    return [s for b in batches for s in b["source_id"]]


def grain_pipeline(src, seed, batch=4, host=None):
    ds = grain.MapDataset.source(src)
    if host is not None:
        ds = ds[host_slice(len(src), *host)]
    return ds.seed(seed).shuffle().map(Decoder.for_source(src)).batch(batch)


def test_grain_epoch_sees_every_record_once(dataset):
    src = RandomAccessSource(str(dataset), "train")
    every = sorted(schema.decode_example(r)[schema.SOURCE_ID].decode() for r in shard_records(dataset))
    batches = list(grain_pipeline(src, seed=7))
    assert batches[0]["image"].shape == (4, 32, 32, 3) and batches[0]["label"].shape == (4,)
    seen = ids(batches)
    assert sorted(seen) == every and len(set(seen)) == len(seen)
    assert ids(grain_pipeline(src, seed=7)) == seen  # deterministic for a seed
    assert ids(grain_pipeline(src, seed=8)) != seen
    assert seen != sorted(seen)


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7])
def test_hosts_get_disjoint_equal_slices_covering_the_split(dataset, count):
    src = RandomAccessSource(str(dataset), "train")
    n = len(src)
    per_host = [ids(grain_pipeline(src, seed=1, batch=1, host=(i, count))) for i in range(count)]
    assert {len(h) for h in per_host} == {n // count}
    flat = [s for h in per_host for s in h]
    assert len(set(flat)) == len(flat) == n - n % count  # disjoint; only the last n % count records dropped
    dropped = {schema.decode_example(src[i])[schema.SOURCE_ID].decode() for i in range(n - n % count, n)}
    assert not dropped & set(flat)
    assert per_host == [ids(grain_pipeline(src, seed=1, batch=1, host=(i, count))) for i in range(count)]


def test_host_slice_refuses_bad_arguments():
    with pytest.raises(ValueError, match="process_index 2"):
        host_slice(10, 2, 2)
    with pytest.raises(ValueError, match="cannot give each of 4 hosts"):
        host_slice(3, 0, 4)


def test_multi_label_extras_and_label_offset(tmp_path):
    labels = ["a", "b", "c", "d"]
    extras = [ExtraSpec("box", "float32", True), ExtraSpec("score", "int64"), ExtraSpec("note", "string")]

    def rec(i):
        values = ((extras[0], (i * 0.5, 1.0)), (extras[1], (i,) if i % 2 else ()), (extras[2], (f"n{i}",)))
        return image_record(i, [i % 4, (i + 2) % 4], labels, multi_label=True, label_offset=1, extras=values)

    write_dataset(tmp_path / "ml", {"train": [[rec(i) for i in range(s * 5, s * 5 + 5)] for s in range(2)]}, labels,
                  multi_label=True, label_offset=1, extras=extras)
    src = RandomAccessSource(str(tmp_path / "ml"), "train")
    out = Decoder.for_source(src)(src[3])
    assert out["label"].tolist() == [0.0, 1.0, 0.0, 1.0] and out["source_id"] == "img/00003.jpg"
    assert out["extra/box"].tolist() == [1.5, 1.0] and out["extra/score"] == 3 and out["extra/note"] == "n3"
    assert out["image"].shape == (16, 24, 3)
    assert Decoder.for_source(src)(src[4])["extra/score"].shape == (0,)  # no value: an empty array
    from shard_utils.read.verify import check_indexes

    assert check_indexes(src.manifest, deep=True) == []  # every row's fields match its record


def test_grain_over_the_emulator_bucket(dataset, gcs, tmp_path):
    bucket = gcs.new_bucket("ra")
    gcs.upload_tree(dataset, bucket, "ds")
    src = RandomAccessSource(f"gs://{bucket}/ds", "train")
    expected = shard_records(dataset)
    assert src._getitems([5, 0, 5]) == [expected[5], expected[0], expected[5]]
    seen = ids(grain_pipeline(pickle.loads(pickle.dumps(src)), seed=3))
    assert sorted(seen) == sorted(schema.decode_example(r)[schema.SOURCE_ID].decode() for r in expected)
    shard = src.manifest.split("train").shards[0]
    data = bytearray((dataset / shard.path).read_bytes())
    data[200] ^= 1
    gcs.client.bucket(bucket).blob(f"ds/{shard.path}").upload_from_string(bytes(data))
    with pytest.raises(RecordReadError, match=f"record 0 \\({shard.path}"):
        src[0]


@pytest.mark.slow  # worker processes import JAX through Grain when it is installed: 3 CPU-s
def test_grain_worker_processes_read_the_pickled_source(dataset):
    from absl import flags

    # Grain 0.2.18 reads an absl flag before worker processes start when JAX is installed, and absl refuses
    # unparsed flags outside absl.app (google/grain#1355): docs/random-access.md gives users this same line.
    flags.FLAGS.mark_as_parsed()
    src = RandomAccessSource(str(dataset), "train")
    ds = grain.MapDataset.source(src).seed(5).shuffle().map(Decoder.for_source(src)).batch(4).to_iter_dataset()
    seen = ids(ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=2)))
    assert sorted(seen) == sorted(ids(grain_pipeline(src, seed=5)))
    assert len(set(seen)) == len(src)


def docs_snippet(marker: str) -> str:
    """The Python block after `<!-- test: MARKER -->` in docs/random-access.md."""
    import re

    from conftest import REPO

    page = (REPO / "docs" / "random-access.md").read_text(encoding="utf-8")
    [snippet] = re.findall(rf"<!-- test: {marker} -->\n```python\n(.*?)```", page, re.S)
    return snippet


def test_the_docs_random_access_snippet_runs_as_written_without_jax(dataset, tmp_path):
    """docs/random-access.md's RandomAccessSource snippet, unchanged, beside a dataset named `out`, in a process
    where jax is not installed (it is not a dependency of tpu-shards)."""
    import subprocess
    import sys

    from base_install import environment
    from conftest import REPO

    shutil.copytree(dataset, tmp_path / "out")
    env = environment(tmp_path / "site", {"jax"})
    env["PYTHONPATH"] += __import__("os").pathsep + str(REPO)
    done = subprocess.run([sys.executable, "-c", docs_snippet("random-access snippet")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    shapes = [line.split(")")[0] + ")" for line in done.stdout.splitlines()]
    assert shapes == [f"({len(RandomAccessSource(str(dataset), 'train'))}, 32, 32, 3)"], done.stdout


def test_the_docs_name_an_extra_that_brings_grain_before_each_grain_snippet():
    """Every Python block of docs/random-access.md that imports grain follows a `pip install -e ".[EXTRA]"` line
    (since the previous block) whose extra in setup.py lists grain."""
    import ast
    import re

    from conftest import REPO

    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    [call] = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup"]
    extras = ast.literal_eval(next(k.value for k in call.keywords if k.arg == "extras_require"))
    page = (REPO / "docs" / "random-access.md").read_text(encoding="utf-8")
    parts = re.split(r"```python\n(.*?)```", page, flags=re.S)  # text, code, text, code, ...
    checked = 0
    for before, code in zip(parts[0::2], parts[1::2], strict=False):
        if re.search(r"^import grain|^from grain", code, re.M):
            named = re.findall(r'pip install -e "\.\[([a-z_,]+)\]"', before)
            assert any(any(r.startswith("grain") for e in n.split(",") for r in extras.get(e, [])) for n in named), \
                (named, code[:80])
            checked += 1
    assert checked >= 2
