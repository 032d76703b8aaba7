"""Hostile input folders: every file is written, rejected with a reason, or skipped, and the job finishes."""
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib

import pytest
from conftest import REPO, photo, run_job, write_images
from readers import by_source, decoded, rejected

from shard_utils.format import schema
from shard_utils.format.manifest import load


def jpeg(image, **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "JPEG", **kw)
    return buf.getvalue()


def png_claiming(width: int, height: int) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 99)) + chunk(b"IEND", b"")


def absurd_exif_jpeg() -> bytes:
    image = photo(24, 16, 4)
    exif = image.getexif()
    exif[0x0112] = 65535  # orientation far out of range
    exif[0x0100] = 2**31 - 1  # image width tag claiming 2 billion
    exif[0x9003] = "\x00" * 40  # garbage date
    return jpeg(image, exif=exif.tobytes())


# source path -> (content, expected outcome: "written", a reject reason, or "skip:<reason>")
def hostile_files(outside) -> dict[str, tuple[object, str]]:
    good = jpeg(photo(32, 24, 1))
    return {
        "ok/good.jpg": (good, "written"),
        "ok/truncated.jpg": (good[: len(good) // 3], "corrupt"),
        "ok/header_only.jpg": (good[:200], "corrupt"),
        "ok/zero.jpg": (b"", "empty"),
        "ok/page.jpg": (b"<!DOCTYPE html><html><body>404 Not Found</body></html>", "not_image"),
        "ok/readme.png": (b"just some text, not a PNG at all\n" * 5, "not_image"),
        "ok/bomb.png": (png_claiming(60000, 60000), "too_large"),
        "ok/absurd_exif.jpg": (absurd_exif_jpeg(), "written"),
        "ok/one_pixel.png": (photo(1, 1, 2), "written"),
        "ok/sliver.png": (photo(4000, 12, 3), "written"),
        "ok/png_named.jpg": (photo(10, 10, 5), "written"),
        "with space/a b.jpg": (good, "written"),
        "ünïcödé 猫/ç.jpeg": (good, "written"),
        ".dotted label/x.jpg": (good, "skip:hidden"),
        "ok/loop.jpg": ("symlink:loop.jpg", "symlink"),
        "ok/escape.jpg": (f"symlink:{outside}", "symlink"),
        "ok/dangling.jpg": ("symlink:nowhere.jpg", "symlink"),
        "linkdir": ("symlink:ok", "symlink"),
        "ok/fifo.jpg": ("fifo", "not_regular_file"),
        "ok/notes.txt": (b"hello", "skip:not_media"),
    }


def bit_flipped_jpeg() -> bytes:
    data = bytearray(jpeg(photo(48, 48, 8)))
    for pos in range(len(data) // 2, len(data) - 4, 97):
        data[pos] ^= 0xFF
    return bytes(data)


def materialize(root, files):
    for rel, (content, _) in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str) and content.startswith("symlink:"):
            os.symlink(content[len("symlink:"):], path)
        elif content == "fifo":
            os.mkfifo(path)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            content.save(path, "PNG")


@pytest.mark.slow
def test_hostile_folder_is_fully_accounted(tmp_path):
    outside = tmp_path / "secret.jpg"
    outside.write_bytes(jpeg(photo(8, 8, 0)))
    root = tmp_path / "in"
    files = hostile_files(outside)
    materialize(root, files)
    (root / "ok" / "flipped.jpg").write_bytes(bit_flipped_jpeg())
    out = tmp_path / "out"
    m = run_job(root, out, "--num-cores", "1", "--max-rejected", "100%")  # a hostile folder: mostly rejects
    written = by_source(out)
    rejects = rejected(out)
    for rel, (_, outcome) in files.items():
        if outcome == "written":
            assert rel in written, rel
            assert decoded(written[rel]).size[0] >= 1
        elif outcome.startswith("skip:"):
            assert rel not in written and rel not in rejects, rel
        else:
            assert rejects.get(rel) == outcome, (rel, rejects.get(rel))
    # A bit-flipped JPEG may still decode (JPEG has no checksum); either way it is accounted for.
    assert ("ok/flipped.jpg" in written) != ("ok/flipped.jpg" in rejects)
    assert "secret.jpg" not in json.dumps(list(written))
    assert m.files_seen == len(files) + 1 == m.splits["train"].num_records + m.rejected["count"] + m.skipped["count"]
    assert m.skipped["by_reason"] == {"hidden": 1, "not_media": 1}
    assert "with space" in m.labels and "ünïcödé 猫" in m.labels and ".dotted label" not in m.labels
    assert load(str(out)).labels == m.labels
    assert written["ok/sliver.png"][schema.IMAGE_WIDTH] == 4000 and written["ok/sliver.png"][schema.IMAGE_HEIGHT] == 12
    lines = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert all(set(entry) == {"source", "reason", "message"} and entry["message"] for entry in lines)


def test_unreadable_file_is_rejected(tmp_path):
    """A file that is gone by the time it is read, or cannot be opened, becomes a reject, not a crash."""
    from shard_utils.inputs import MediaItem
    from shard_utils.media.encode import EncodeSettings, encode_item

    settings = EncodeSettings(label_ids={"a": 0})
    gone = encode_item(MediaItem("a/missing.jpg", str(tmp_path / "a" / "missing.jpg"), 0, ("a",)), settings)
    assert gone["reason"] == "missing" and "does not exist" in gone["message"]
    (tmp_path / "a" / "folder.jpg").mkdir(parents=True)
    odd = encode_item(MediaItem("a/folder.jpg", str(tmp_path / "a" / "folder.jpg"), 0, ("a",)), settings)
    assert odd["reason"] == "not_regular_file" and odd["source"] == "a/folder.jpg" and "folder" in odd["message"]


@pytest.mark.slow
def test_permission_denied_file_is_rejected(tmp_path):
    """A file whose mode forbids reading is a reject. Root reads any file, so as root the job runs
    without the capabilities that let it (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH)."""
    prefix = []
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: cannot make a file unreadable")
        prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
    write_images(tmp_path / "in", {"a": 3})
    (tmp_path / "in" / "a" / "img0000.jpg").chmod(0)
    out = tmp_path / "out"
    done = subprocess.run(
        [*prefix, sys.executable, "-m", "beam_jobs.cli", "build", "--input", str(tmp_path / "in"),
         "--output", str(out), "--num-cores", "1"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert rejected(out) == {"a/img0000.jpg": "unreadable"}
    m = load(str(out))
    assert m.files_seen == 3 and m.splits["train"].num_records == 2
