"""`tpu-shards verify`, the framing reader and the manifest loader against damage and hostility."""
import json
import shutil

import pytest
from conftest import run_cli, run_job
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shard_utils.format import manifest as manifest_mod
from shard_utils.format.manifest import ManifestError, parse
from shard_utils.format.tfrecord import FramingError, frame, iter_records
from shard_utils.read.verify import verify


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from conftest import write_images

    base = tmp_path_factory.mktemp("verify")
    write_images(base / "in", {"a": 10, "b": 10})
    run_job(base / "in", base / "pristine")
    return base / "pristine"


@pytest.fixture
def copy(dataset, tmp_path):
    target = tmp_path / "ds"
    shutil.copytree(dataset, target)
    return target


def shard(ds, i=3):
    return ds / json.loads((ds / "manifest.json").read_text())["splits"]["train"]["shards"][i]["path"]


@pytest.mark.slow
def test_intact_dataset_verifies(dataset):
    assert verify(str(dataset), deep=True) == []
    done = run_cli("verify", dataset, "--deep")
    size = sum(p.stat().st_size for p in dataset.glob("*.tfrecord"))
    assert done.returncode == 0 and done.stdout.strip() == (
        f"tpu-shards: {dataset} is intact: train 20 records in 8 shard files, {size / 1e6:.1f} MB; every record "
        "read, decoded and checked")


def test_flipped_byte_is_named(copy):
    path = shard(copy)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    problems = verify(str(copy))
    assert any(path.name in p and "crc32c" in p for p in problems)
    assert any(path.name in p and "record" in p and "checksum" in p for p in problems)
    done = run_cli("verify", copy)
    assert done.returncode == 1 and path.name in done.stderr and "Traceback" not in done.stderr


def test_truncated_and_deleted_shards_are_named(copy):
    cut = shard(copy, 1)
    cut.write_bytes(cut.read_bytes()[:-7])
    gone = shard(copy, 5)
    gone.unlink()
    problems = verify(str(copy))
    assert f"{gone.name}: missing" in problems
    # the size, from stat, says it all: a shard of another size than the manifest's is not read
    assert [p for p in problems if p.startswith(cut.name)] == [
        f"{cut.name}: size {cut.stat().st_size} bytes, manifest says {cut.stat().st_size + 7}"]


def test_deep_checks_records_against_the_schema(copy):
    path = shard(copy, 0)
    records = list(iter_records(open(path, "rb")))
    records[1] = b"\x0a\x03not an example"
    body = b"".join(frame(r) for r in records)
    path.write_bytes(body)
    m = json.loads((copy / "manifest.json").read_text())
    entry = m["splits"]["train"]["shards"][0]
    del m["splits"]["train"]["index"]  # the rewritten shard's offsets moved: this test is about the records
    from shard_utils.storage import Digest

    d = Digest()
    d.update(body)
    m["splits"]["train"]["num_bytes"] += len(body) - entry["num_bytes"]
    entry.update(num_bytes=len(body), crc32c=d.crc32c, sha256=d.sha256)
    (copy / "manifest.json").write_text(json.dumps(m))
    (copy / "croissant.json").unlink()  # it describes the shard and index the manifest no longer names
    assert verify(str(copy)) == []  # framing and checksums hold: only --deep sees the bad record
    problems = verify(str(copy), deep=True)
    assert problems and all(path.name in p and "record 1" in p for p in problems)


@pytest.mark.parametrize("change,fragment", [
    (lambda m: m["splits"]["train"]["shards"][0].update(path="/etc/passwd"), "refused"),
    (lambda m: m["splits"]["train"]["shards"][0].update(path="../train-00000-of-00008.tfrecord"), "refused"),
    (lambda m: m.update(format_version=99), "format_version 99"),
    (lambda m: m.update(format_version="1"), "format_version"),
    (lambda m: m.pop("features"), "missing field 'features'"),
    (lambda m: m["features"].pop("image/encoded"), "no image feature"),
    (lambda m: m["splits"]["train"]["shards"][0].update(num_records="5"), "num_records"),
    (lambda m: m.update(files_seen=1), "accounting"),
])
def test_hostile_manifests_are_refused_with_one_line(copy, change, fragment):
    m = json.loads((copy / "manifest.json").read_text())
    change(m)
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ManifestError, match=fragment.replace("(", r"\(")):
        manifest_mod.load(str(copy))
    done = run_cli("verify", copy)
    assert done.returncode == 1 and fragment in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_missing_and_garbage_manifest(tmp_path):
    with pytest.raises(ManifestError, match="no readable manifest"):
        manifest_mod.load(str(tmp_path))
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        manifest_mod.load(str(tmp_path))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_framing_reader_on_random_bytes_fails_cleanly(data):
    import io

    try:
        for record in iter_records(io.BytesIO(data)):
            assert isinstance(record, bytes)
    except FramingError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=50), max_size=5), st.data())
def test_framing_round_trip_and_any_single_corruption_is_caught(records, data):
    import io

    body = b"".join(frame(r) for r in records)
    assert list(iter_records(io.BytesIO(body))) == records
    if body:
        pos = data.draw(st.integers(0, len(body) - 1))
        damaged = bytearray(body)
        damaged[pos] ^= data.draw(st.integers(1, 255))
        with pytest.raises(FramingError):
            list(iter_records(io.BytesIO(bytes(damaged))))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=25)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_manifest_loader_on_random_json_fails_cleanly(value):
    try:
        parse(json.dumps(value))
    except ManifestError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_manifest_loader_on_mutated_real_manifests_fails_cleanly(dataset, data):
    m = json.loads((dataset / "manifest.json").read_text())
    target = m
    path = []
    while isinstance(target, (dict, list)) and target and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(target) if isinstance(target, dict) else range(len(target))))
        path.append(key)
        if not isinstance(target[key], (dict, list)):
            break
        target = target[key]
    if path:
        parent = m
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = data.draw(json_values)
    try:
        parse(json.dumps(m))
    except ManifestError:
        pass
