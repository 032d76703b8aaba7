"""The storage contract: every verb on a local folder and on a bucket of the emulator, errors included.

Buckets are real HTTP to gcp-storage-emulator, sometimes through FaultProxy (403s, transient faults,
request counts) or PreconditionProxy below (generation preconditions, which the emulator ignores).
"""
from __future__ import annotations

import gc
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import google_crc32c
import pytest
from gcs_fixtures import DENIED, FaultProxy, PreconditionProxy, storage_host

from shard_utils import storage
from shard_utils.storage import base as storage_base

REPO = Path(__file__).resolve().parents[1]
MESSAGE = re.compile(r"^cannot (\w+) (\S+)( to \S+)?: (.+)$")


def error_of(call, verb: str, uri: str, kind=storage.StorageError) -> str:
    """Run call, which must raise `kind` worded `cannot <verb> <uri>: ...` on one line; the reason."""
    with pytest.raises(kind) as caught:
        call()
    text = str(caught.value)
    assert "\n" not in text, text
    found = MESSAGE.match(text)
    assert found and found.group(1) == verb and found.group(2) == uri, text
    return found.group(4)


@pytest.fixture(params=["local", "gcs"])
def root(request, tmp_path) -> str:
    """A fresh, empty folder: under tmp_path, or gs://<new bucket>/root on the emulator."""
    if request.param == "local":
        return str(tmp_path / "root")
    gcs = request.getfixturevalue("gcs")
    return f"gs://{gcs.new_bucket('st')}/root"


def missing_reason(uri: str) -> str:
    return f"object {uri} does not exist" if storage.is_gcs(uri) else "No such file or directory"


# ---------------------------------------------------------------------------------------------- paths

def test_path_helpers():
    assert storage.join("gs://b", "a", "x") == "gs://b/a/x"
    assert storage.join("gs://b/", "/a") == "gs://b/a"  # a part never restarts a gs:// path
    assert storage.join("/p", "a") == "/p/a"
    assert storage.split_gcs("gs://b/a/x") == ("b", "a/x")
    assert [storage.parent(u) for u in ("gs://b/a/x", "gs://b/x", "gs://b/a/", "/p/a/x", "x.json")] == [
        "gs://b/a", "gs://b", "gs://b", "/p/a", "."]
    assert [storage.basename(u) for u in ("gs://b/a/x", "gs://b/a/", "/p/a/x", "/p/a/")] == ["x", "a", "x", "a"]
    for bad in ("gs://", "gs:///x"):
        with pytest.raises(storage.StorageError, match="gs://"):
            storage.split_gcs(bad)
    reason = error_of(lambda: storage.read_bytes("gs://"), "read", "gs://")
    assert reason == "'gs://' is not a gs://bucket/path URI"


# ---------------------------------------------------------------------------------------------- reading and writing

def test_write_read_size_exists_checksum(root):
    uri = storage.join(root, "a", "x.bin")
    data = os.urandom(3000)
    storage.write_bytes(uri, data)
    assert storage.read_bytes(uri) == data
    assert storage.size(uri) == 3000
    assert storage.checksum(uri) == (3000, storage.crc32c_base64(google_crc32c.value(data)))
    assert storage.exists(uri) and storage.exists(storage.join(root, "a")) and storage.exists(root)
    assert not storage.exists(storage.join(root, "b")) and not storage.exists(uri + ".no")
    storage.write_bytes(uri, b"new")  # an overwrite replaces the whole content
    assert storage.read_bytes(uri) == b"new" and storage.size(uri) == 3
    assert storage.checksum(uri + ".no") is None
    storage.write_bytes(storage.join(root, "empty"), b"")
    assert storage.read_bytes(storage.join(root, "empty")) == b"" and storage.size(storage.join(root, "empty")) == 0


def test_missing_files_are_not_found_errors(root):
    uri, deeper = storage.join(root, "nothing"), storage.join(root, "no", "deeper")
    other = storage.join(root, "other")
    for verb, subject, call in [("read", uri, lambda: storage.read_bytes(uri)),
                                ("read", uri, lambda: storage.read_range(uri, 0, 4)),
                                ("read", uri, lambda: storage.open_read(uri)),
                                ("stat", uri, lambda: storage.size(uri)),
                                ("read", deeper, lambda: storage.read_bytes(deeper))]:
        assert error_of(call, verb, subject, storage.NotFoundError) == missing_reason(subject)
    with pytest.raises(storage.NotFoundError, match=f"^cannot copy {re.escape(uri)} to {re.escape(other)}: "):
        storage.copy(uri, other)
    with pytest.raises(storage.NotFoundError, match=f"^cannot rename {re.escape(uri)} to {re.escape(other)}: "):
        storage.rename(uri, other)
    storage.delete(uri)  # missing is fine
    storage.delete_prefix(storage.join(root, "no-folder"))
    assert storage.list_names(storage.join(root, "no-folder")) == []
    assert storage.read_versioned(uri) is None and storage.checksum(uri) is None


def test_missing_bucket_names_the_bucket(gcs):
    uri = "gs://no-such-bucket-st/dir/x"
    gone = "bucket gs://no-such-bucket-st does not exist"
    for verb, call in [("read", lambda: storage.read_bytes(uri)), ("read", lambda: storage.read_range(uri, 0, 1)),
                       ("stat", lambda: storage.size(uri)), ("write", lambda: storage.write_bytes(uri, b"x")),
                       ("list", lambda: storage.list_names(uri)), ("list", lambda: list(storage.walk(uri))),
                       ("list", lambda: storage.top_level_dirs(uri)),
                       ("create", lambda: storage.create_exclusive(uri, b"x"))]:
        assert error_of(call, verb, uri) == gone
    assert not storage.exists(uri) and storage.checksum(uri) is None and storage.read_versioned(uri) is None
    source = f"gs://{gcs.new_bucket('src')}/x"
    storage.write_bytes(source, b"abc")
    with pytest.raises(storage.NotFoundError) as caught:
        storage.copy(source, uri)
    assert str(caught.value) == f"cannot copy {source} to {uri}: {gone}"
    with pytest.raises(storage.StorageError) as caught:
        with storage.open_write(uri) as w:
            w.write(b"abc")
    assert str(caught.value) == f"cannot write {uri}: {gone}"
    assert storage.read_bytes(source) == b"abc"


def test_read_range_is_exact_and_a_short_read_names_the_offset(root):
    uri = storage.join(root, "r.bin")
    data = bytes(range(256)) * 4
    storage.write_bytes(uri, data)
    assert storage.read_range(uri, 0, 10) == data[:10]
    assert storage.read_range(uri, 500, 24) == data[500:524]
    assert storage.read_range(uri, 1000, 24) == data[1000:]
    assert storage.read_range(uri, 5, 0) == b""
    assert error_of(lambda: storage.read_range(uri, 1000, 30), "read", uri) == (
        "short read at offset 1000: the file ends after 24 of the 30 bytes asked for")
    assert error_of(lambda: storage.read_range(uri, 5000, 8), "read", uri) == (
        "short read at offset 5000: the file ends after 0 of the 8 bytes asked for")
    with pytest.raises(ValueError):
        storage.read_range(uri, -1, 4)


def test_read_range_on_a_bucket_is_exactly_one_request(gcs):
    uri = f"gs://{gcs.new_bucket('range')}/r.bin"
    storage.write_bytes(uri, b"0123456789" * 100)
    with FaultProxy(gcs.url) as proxy, storage_host(proxy.url):
        assert storage.read_range(uri, 333, 7) == b"3456789"
    # Requests about the object; the library may also fetch the bucket's metadata in the background.
    about_object = [(method, path) for method, path in proxy.requests if re.search(r"/o(/|\?)", path)]
    assert len(about_object) == 1 and about_object[0][0] == "GET" and "alt=media" in about_object[0][1]


def test_open_read_streams_in_chunks_and_seeks(root, monkeypatch):
    monkeypatch.setattr(storage_base, "READ_CHUNK_SIZE", 256 * 1024)
    uri = storage.join(root, "big.bin")
    data = os.urandom(1024 * 1024 + 7)
    storage.write_bytes(uri, data)
    with storage.open_read(uri) as f:
        assert f.read(100) == data[:100]
        assert f.seek(1024 * 1024) == 1024 * 1024
        assert f.read() == data[1024 * 1024:]
        f.seek(10)
        buf = bytearray(20)
        assert f.readinto(buf) == 20 and bytes(buf) == data[10:30]
    assert f.closed


def test_open_read_on_a_bucket_does_not_download_the_whole_object(gcs, monkeypatch):
    monkeypatch.setattr(storage_base, "READ_CHUNK_SIZE", 256 * 1024)
    uri = f"gs://{gcs.new_bucket('stream')}/big.bin"
    data = os.urandom(1024 * 1024)
    storage.write_bytes(uri, data)
    with FaultProxy(gcs.url) as proxy, storage_host(proxy.url):
        with storage.open_read(uri) as f:
            assert f.read(1000) == data[:1000]
            downloads_after_first_read = sum("alt=media" in p for _, p in proxy.requests)
            blocks = []
            while block := f.read(300 * 1024):
                blocks.append(block)
    assert downloads_after_first_read == 1  # one chunk fetched, not the whole object
    assert b"".join([data[:1000], *blocks]) == data
    assert sum("alt=media" in p for _, p in proxy.requests) >= 4


def test_open_write_appears_whole_on_close_and_not_at_all_on_error(root, monkeypatch):
    monkeypatch.setattr(storage_base, "WRITE_CHUNK_SIZE", 256 * 1024)  # chunks reach the server before close
    folder = storage.join(root, "w")
    uri = storage.join(folder, "out.bin")
    part = os.urandom(300 * 1024)
    with storage.open_write(uri) as w:
        w.write(part)
        w.write(part)
        assert w.tell() == 2 * len(part)
        assert not storage.exists(uri) and "out.bin" not in storage.list_names(folder)
    assert storage.read_bytes(uri) == part * 2
    assert storage.list_names(folder) == ["out.bin"]  # no temp file left

    with pytest.raises(KeyError):
        with storage.open_write(uri) as w:
            w.write(b"x" * (600 * 1024))
            raise KeyError("the caller failed half way")
    assert storage.read_bytes(uri) == part * 2  # the old content stays
    with pytest.raises(RuntimeError):
        with storage.open_write(storage.join(folder, "never.bin")) as w:
            w.write(part * 2)
            raise RuntimeError("boom")
    assert storage.list_names(folder) == ["out.bin"]  # nothing created, no temp file left
    gc.collect()  # an abandoned upload object must not finish itself when collected
    assert storage.list_names(folder) == ["out.bin"]


def test_a_scratch_write_is_made_durable_in_the_background_then_waited_for(root, monkeypatch, capfd):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.fstat(fd).st_ino), real_fsync(fd)))
    uri = storage.join(root, "run.records")
    with storage.open_write(uri, durable=False) as w:
        w.write(b"records")
    assert synced == []  # a scratch write is not synced on close
    storage.start_sync(uri)
    storage.sync(uri)
    for thread in [t for t in __import__("threading").enumerate() if t.name == "tpu-shards-sync"]:
        thread.join(5)
    if storage.is_gcs(uri):
        assert synced == []  # an object is durable once written
    else:
        assert synced == [os.stat(uri).st_ino] * 2  # the background flush, then the wait for it
        missing = storage.join(root, "missing.records")
        storage.start_sync(missing)  # quiet: the sync that must succeed says what went wrong
        assert missing_reason(missing) in error_of(lambda: storage.sync(missing), "sync", missing)
    assert capfd.readouterr().err == ""


def test_write_creates_parent_folders_and_make_folder(root):
    deep = storage.join(root, "a", "b", "c", "x")
    storage.write_bytes(deep, b"1")
    assert storage.read_bytes(deep) == b"1"
    storage.make_folder(storage.join(root, "made", "here"))
    storage.make_folder(storage.join(root, "made", "here"))  # twice is fine
    if not storage.is_gcs(root):
        assert os.path.isdir(storage.join(root, "made", "here"))


# ---------------------------------------------------------------------------------------------- listing

def test_list_names_and_top_level_dirs(root):
    for name in ("top.txt", "a/x", "a/sub/y", "b/z", "ab"):
        storage.write_bytes(storage.join(root, name), name.encode())
    assert storage.list_names(root) == ["a/", "ab", "b/", "top.txt"]
    assert storage.list_names(storage.join(root, "a")) == ["sub/", "x"]
    assert storage.list_names(storage.join(root, "a") + "/") == ["sub/", "x"]
    assert storage.top_level_dirs(root) == ["a", "b"]
    entries = sorted(storage.walk(root), key=lambda e: e.rel_path)
    assert [(e.rel_path, e.size, e.reason) for e in entries] == [
        ("a/sub/y", 7, None), ("a/x", 3, None), ("ab", 2, None), ("b/z", 3, None), ("top.txt", 7, None)]


def test_walk_of_an_absent_prefix_is_empty_and_of_a_missing_local_root_an_error(gcs, tmp_path):
    assert list(storage.walk(f"gs://{gcs.new_bucket('walk')}/absent")) == []
    missing = str(tmp_path / "none")
    assert error_of(lambda: list(storage.walk(missing)), "list", missing, storage.NotFoundError) == (
        "No such file or directory")
    (tmp_path / "file").write_bytes(b"x")
    assert error_of(lambda: storage.top_level_dirs(str(tmp_path / "file")), "list", str(tmp_path / "file")) == (
        "Not a directory")


@pytest.fixture
def linked(tmp_path):
    """A folder with every kind of symlink, and a file outside it."""
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"o" * 50)
    root = tmp_path / "in"
    (root / "sub").mkdir(parents=True)
    (root / "file.bin").write_bytes(b"f" * 10)
    (root / "sub" / "deep.bin").write_bytes(b"d" * 20)
    os.symlink("file.bin", root / "inside_link")
    os.symlink(outside, root / "outside_link")
    os.symlink("nowhere", root / "dangling")
    os.symlink("loop", root / "loop")
    os.symlink("sub", root / "folder_link")
    os.mkfifo(root / "fifo")
    return root


def test_walk_never_follows_symlinks_out_of_root_or_into_folders(linked):
    got = {e.rel_path: (e.size, e.reason) for e in storage.walk(str(linked))}
    assert got == {"file.bin": (10, None), "sub/deep.bin": (20, None), "inside_link": (10, None),
                   "outside_link": (0, "symlink"), "dangling": (0, "symlink"), "loop": (0, "symlink"),
                   "folder_link": (0, "symlink"), "fifo": (0, "not_regular_file")}
    messages = {e.rel_path: e.message for e in storage.walk(str(linked))}
    assert "outside" in messages["outside_link"] and "dangling" in messages["dangling"]
    assert "loops" in messages["loop"] and "folder" in messages["folder_link"]


def test_walk_follow_symlinks_follows_links_to_files_anywhere(linked):
    got = {e.rel_path: (e.size, e.reason) for e in storage.walk(str(linked), follow_symlinks=True)}
    assert got["outside_link"] == (50, None) and got["inside_link"] == (10, None)
    assert got["dangling"] == got["loop"] == got["folder_link"] == (0, "symlink")
    assert "sub/deep.bin" in got and not any(k.startswith("folder_link/") for k in got)


def test_walk_leaves_a_folder_once_prune_says_so_as_it_goes(tmp_path, gcs):
    """prune is asked before each entry of a folder: what came out so far may decide it; pruned folders'
    sub-folders are not listed. gs:// ignores it (the caller must not rely on it there)."""
    names = ["a/1", "a/2", "a/sub/3", "a/sub/deeper/4", "b/5", "b/6", "c/sub/7", "top"]
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    seen: list[str] = []
    asked: set[str] = set()

    def prune(folder: str) -> bool:
        asked.add(folder)
        return folder.split("/")[0] in {p.split("/")[0] for p in seen if "/" in p}

    for entry in storage.walk(str(tmp_path), prune=prune):
        seen.append(entry.rel_path)
    assert sorted(seen) == ["a/1", "b/5", "c/sub/7", "top"]  # the first file of each top folder, then left
    assert "a/sub" not in asked and "a/sub/deeper" not in asked  # "a" was left before reaching them
    assert [e.rel_path for e in storage.walk(str(tmp_path), prune=lambda folder: False)] == \
        [e.rel_path for e in storage.walk(str(tmp_path))]
    bucket = gcs.new_bucket("prune")
    for name in names:
        gcs.client.bucket(bucket).blob("in/" + name).upload_from_string(b"x")
    assert sorted(e.rel_path for e in storage.walk(f"gs://{bucket}/in", prune=lambda folder: True)) == sorted(names)


def test_walk_on_a_bucket_skips_folder_placeholders(gcs):
    bucket = gcs.new_bucket("walk")
    for name, data in {"in/a/x.jpg": b"12345", "in/a/": b"", "in/b/y.jpg": b"1", "other/z": b"1"}.items():
        gcs.client.bucket(bucket).blob(name).upload_from_string(data)
    got = [(e.rel_path, e.size) for e in storage.walk(f"gs://{bucket}/in", follow_symlinks=True)]
    assert sorted(got) == [("a/x.jpg", 5), ("b/y.jpg", 1)]


# ---------------------------------------------------------------------------------------------- moving and deleting

def test_copy_rename_delete(root):
    src, dst = storage.join(root, "src.bin"), storage.join(root, "moved", "dst.bin")
    storage.write_bytes(src, b"payload")
    storage.copy(src, storage.join(root, "copy.bin"))
    assert storage.read_bytes(storage.join(root, "copy.bin")) == b"payload" and storage.exists(src)
    storage.write_bytes(dst, b"old")
    storage.rename(src, dst, size=7)
    assert storage.read_bytes(dst) == b"payload" and not storage.exists(src)
    storage.rename(src, dst, size=7)  # retried after it succeeded: done, not an error
    with pytest.raises(storage.NotFoundError):
        storage.rename(src, dst, size=8)  # dst is not what a finished move would leave
    with pytest.raises(storage.NotFoundError):
        storage.rename(src, dst)
    storage.delete(dst)
    assert not storage.exists(dst)
    storage.delete(dst)


def test_delete_prefix_removes_everything_under_a_folder_only(root, monkeypatch):
    monkeypatch.setattr(storage_base, "LIST_PAGE_SIZE", 3)
    for i in range(7):
        storage.write_bytes(storage.join(root, "tmp", f"part{i}"), b"x")
    storage.write_bytes(storage.join(root, "tmp", "deeper", "y"), b"y")
    storage.write_bytes(storage.join(root, "tmpfile"), b"keep")
    storage.write_bytes(storage.join(root, "tmp2", "z"), b"keep")
    storage.delete_prefix(storage.join(root, "tmp"))
    assert storage.list_names(root) == ["tmp2/", "tmpfile"]
    everything = storage.parent(root) if storage.is_gcs(root) else "/"
    assert error_of(lambda: storage.delete_prefix(everything), "delete", everything) == (
        "refusing to delete a whole bucket or file system")


def test_copy_and_rename_between_local_and_a_bucket(gcs, tmp_path, monkeypatch):
    monkeypatch.setattr(storage_base, "READ_CHUNK_SIZE", 256 * 1024)
    monkeypatch.setattr(storage_base, "WRITE_CHUNK_SIZE", 256 * 1024)
    data = os.urandom(700 * 1024)
    local = str(tmp_path / "a.bin")
    Path(local).write_bytes(data)
    remote = f"gs://{gcs.new_bucket('cross')}/x/a.bin"
    storage.copy(local, remote)
    assert storage.read_bytes(remote) == data
    storage.rename(remote, str(tmp_path / "back" / "b.bin"))
    assert Path(tmp_path / "back" / "b.bin").read_bytes() == data and not storage.exists(remote)


def test_transient_faults_are_retried(gcs):
    bucket = gcs.new_bucket("flaky")
    root = f"gs://{bucket}/r"
    with FaultProxy(gcs.url, rate=0.12, seed=3) as proxy, storage_host(proxy.url):
        for i in range(6):
            storage.write_bytes(f"{root}/d/{i}", str(i).encode())
        assert storage.read_bytes(f"{root}/d/3") == b"3" and storage.read_range(f"{root}/d/4", 0, 1) == b"4"
        assert storage.list_names(f"{root}/d") == [str(i) for i in range(6)]
        assert storage.create_exclusive(f"{root}/lock", b"me")
        storage.copy(f"{root}/d/1", f"{root}/c")
        storage.rename(f"{root}/d/2", f"{root}/m", size=1)
        assert storage.checksum(f"{root}/m") == (1, storage.crc32c_base64(google_crc32c.value(b"2")))
        storage.delete_prefix(f"{root}/d")
    assert proxy.faults >= 2
    assert gcs.names(bucket) == ["r/c", "r/lock", "r/m"]


# ---------------------------------------------------------------------------------------------- permissions

def test_permission_denied_on_a_bucket(gcs):
    bucket = gcs.new_bucket("readonly")
    readable = f"gs://{bucket}/r"
    storage.write_bytes(readable, b"keep")
    uri = f"gs://{bucket}/w"
    denied = f"permission denied on gs://{bucket} (403): {DENIED}"
    with FaultProxy(gcs.url, deny_writes_to=bucket) as proxy, storage_host(proxy.url):
        assert storage.read_bytes(readable) == b"keep"
        assert error_of(lambda: storage.write_bytes(uri, b"x"), "write", uri) == denied
        assert error_of(lambda: storage.create_exclusive(uri, b"x"), "create", uri) == denied
        assert error_of(lambda: storage.delete(readable), "delete", readable) == denied
        with pytest.raises(storage.StorageError) as caught:
            with storage.open_write(uri) as w:
                w.write(b"x")
        assert str(caught.value) == f"cannot write {uri}: {denied}"
        with pytest.raises(storage.StorageError) as caught:
            storage.copy(readable, uri)
        assert str(caught.value) == f"cannot copy {readable} to {uri}: {denied}"
    assert gcs.names(bucket) == ["r"]


LOCAL_DENIED = """
import os, sys
from shard_utils import storage
ro, secret = sys.argv[1], sys.argv[2]
for call in (lambda: storage.write_bytes(os.path.join(ro, "x"), b"x"),
             lambda: storage.open_write(os.path.join(ro, "y")).__enter__(),
             lambda: storage.create_exclusive(os.path.join(ro, "z"), b"z"),
             lambda: storage.delete(os.path.join(ro, "kept")),
             lambda: storage.read_bytes(secret),
             lambda: storage.checksum(secret)):
    try:
        call()
        print("no error")
    except storage.StorageError as exc:
        print(exc)
"""


def test_permission_denied_on_a_local_folder(tmp_path):
    """A read-only folder and an unreadable file. Root ignores file modes, so as root the check runs
    in a process without the capabilities that let it (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH)."""
    prefix = []
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: cannot make a folder read-only for this process")
        prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "kept").write_bytes(b"k")
    ro.chmod(0o555)
    secret = tmp_path / "secret"
    secret.write_bytes(b"s")
    secret.chmod(0)
    done = subprocess.run([*prefix, sys.executable, "-c", LOCAL_DENIED, str(ro), str(secret)], capture_output=True,
                          text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        f"cannot write {ro}/x: Permission denied", f"cannot write {ro}/y: Permission denied",
        f"cannot create {ro}/z: Permission denied", f"cannot delete {ro}/kept: Permission denied",
        f"cannot read {secret}: Permission denied", f"cannot read {secret}: Permission denied"]
    assert sorted(os.listdir(ro)) == ["kept"]


def test_missing_credentials_are_named_not_printed(monkeypatch, tmp_path):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-key.json"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    monkeypatch.setattr(storage_base, "_client", None)
    reason = error_of(lambda: storage.read_bytes("gs://b/x"), "read", "gs://b/x")
    assert reason.startswith("no Application Default Credentials: run `gcloud auth application-default login`")


def test_messages_stay_one_line_for_odd_names(tmp_path):
    odd = str(tmp_path / "line\nbreak")
    with pytest.raises(storage.NotFoundError) as caught:
        storage.read_bytes(odd)
    assert str(caught.value) == f"cannot read {tmp_path}/line\\nbreak: No such file or directory"


def test_problem_wording():
    assert storage.problem(PermissionError(13, "Permission denied"), "/p/x") == "Permission denied"
    assert storage.problem(ValueError("first line\nsecond"), "/p") == "first line"
    from google.api_core import exceptions as api

    assert storage.problem(api.Forbidden("GET x: nope", errors=[{"message": "you may not"}]), "gs://b/x") == (
        "permission denied on gs://b (403): you may not")


def test_client_is_renewed_when_the_emulator_host_changes(gcs):
    first = storage.gcs_client()
    assert storage.gcs_client() is first
    with FaultProxy(gcs.url) as proxy, storage_host(proxy.url):
        assert storage.gcs_client() is not first
    assert storage.gcs_client() is not None


# ---------------------------------------------------------------------------------------------- compare-and-swap

@pytest.fixture
def cas_root(root, request):
    """root; on gs://, with every request going through PreconditionProxy."""
    if not storage.is_gcs(root):
        yield root
        return
    gcs = request.getfixturevalue("gcs")
    with PreconditionProxy(gcs.url) as proxy, storage_host(proxy.url):
        yield root


def test_create_exclusive_and_compare_and_swap(cas_root):
    uri = storage.join(cas_root, "lease", "lock.json")
    assert storage.read_versioned(uri) is None
    assert storage.replace_if_version(uri, b"x", "1") is False  # nothing to replace
    assert storage.create_exclusive(uri, b"first") is True
    assert storage.create_exclusive(uri, b"second") is False
    data, v1 = storage.read_versioned(uri)
    assert data == b"first"
    assert storage.replace_if_version(uri, b"third", v1) is True
    data, v2 = storage.read_versioned(uri)
    assert data == b"third" and v2 != v1
    assert storage.replace_if_version(uri, b"stale", v1) is False
    assert storage.delete_if_version(uri, v1) is False
    assert storage.read_bytes(uri) == b"third"
    assert storage.delete_if_version(uri, v2) is True and not storage.exists(uri)
    assert storage.delete_if_version(uri, v2) is True  # already gone
    assert storage.create_exclusive(uri, b"again") is True
    assert storage.list_names(storage.parent(uri)) == ["lock.json"]  # no lock or temp files left


def _create_one(uri: str, i: int, results, barrier) -> None:
    storage_base._client = None  # a forked child makes its own connections
    barrier.wait()
    results.put((i, storage.create_exclusive(uri, f"owner {i}".encode())))


def _increment(uri: str, times: int, barrier) -> None:
    storage_base._client = None
    barrier.wait()
    done = 0
    while done < times:
        data, version = storage.read_versioned(uri)
        done += storage.replace_if_version(uri, str(int(data) + 1).encode(), version)


def _race(target, args_of, n: int) -> None:
    """n processes running target at once. Spawned, not forked: a fork of this many-threaded process can inherit
    a lock some other thread held (a child then waited a minute for a request's timeout)."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(n)
    procs = [ctx.Process(target=target, args=(*args_of(i), barrier)) for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * n


def test_two_processes_racing_to_create_one_file(cas_root):
    uri = storage.join(cas_root, "lock")
    results = multiprocessing.get_context("spawn").Queue()
    for _ in range(3):
        storage.delete(uri)
        _race(_create_one, lambda i: (uri, i, results), 2)
        outcome = dict(results.get(timeout=10) for _ in range(2))
        winners = [i for i, won in outcome.items() if won]
        assert len(winners) == 1
        assert storage.read_bytes(uri) == f"owner {winners[0]}".encode()


@pytest.mark.slow
def test_compare_and_swap_loses_no_update_between_processes(cas_root):
    uri = storage.join(cas_root, "counter")
    storage.write_bytes(uri, b"0")
    _race(_increment, lambda i: (uri, 8), 3)
    assert storage.read_bytes(uri) == b"24"
