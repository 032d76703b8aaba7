"""HEIC/HEIF (through the optional pillow-heif) and AVIF (Pillow itself): decoded, oriented once, re-encoded."""
import hashlib
import io
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, photo, run_job
from PIL import Image, features
from readers import by_source, decoded, rejected

from shard_utils.format import schema
from shard_utils.inputs import skip_reason
from shard_utils.media.images import HEIF_EXTRA_HINT, ImageOptions, Rejected, prepare_image

pillow_heif = pytest.importorskip("pillow_heif", reason="pillow-heif is in the [test] extra")


def encode(image: Image.Image, fmt: str, orientation: int = 1) -> bytes:
    """HEIF through pillow-heif's encoder, AVIF through Pillow's. Both turn an EXIF orientation into the
    container's rotation/mirror boxes; pillow-heif also keeps the EXIF tag, as phones do."""
    if fmt == "HEIF":
        pillow_heif.register_heif_opener()  # so that Image.save can write HEIF in this test process
    exif = image.getexif()
    if orientation != 1:
        exif[0x0112] = orientation
    buf = io.BytesIO()
    image.save(buf, fmt, quality=90, exif=exif.tobytes())
    return buf.getvalue()


def red_left_half() -> Image.Image:
    image = Image.new("RGB", (40, 20), (0, 0, 255))
    image.paste((255, 0, 0), (0, 0, 20, 20))
    return image


def pixels(data: bytes) -> np.ndarray:
    image = Image.open(io.BytesIO(data))
    assert image.format == "JPEG"
    return np.asarray(image.convert("RGB"), dtype=np.int16)


def mean_close(px: np.ndarray, rgb, tol) -> bool:
    return bool(np.abs(px.reshape(-1, 3).mean(0) - np.array(rgb)).max() <= tol)


def test_avif_needs_nothing_beyond_pillow():
    assert features.check("avif")


@pytest.mark.parametrize("fmt", ["HEIF", "AVIF"])
def test_decoded_and_reencoded_to_rgb_jpeg(fmt):
    data = encode(Image.new("RGB", (24, 16), (40, 90, 200)), fmt)
    out = prepare_image(data, ImageOptions(quality=100))
    assert not out.passed_through and (out.width, out.height, out.channels) == (24, 16, 3)
    assert mean_close(pixels(out.encoded), (40, 90, 200), 8)


@pytest.mark.parametrize("fmt", ["HEIF", "AVIF"])
@pytest.mark.parametrize("orientation,red", [(6, "top"), (8, "bottom"), (3, "right")])
def test_orientation_is_applied_exactly_once(fmt, orientation, red):
    """pillow-heif rotates while decoding (and resets the EXIF tag); Pillow's AVIF reader reports the rotation
    as EXIF. Applied twice or not at all, the red half ends up elsewhere."""
    data = encode(red_left_half(), fmt, orientation)
    if fmt == "HEIF":  # the file carries the EXIF tag and the rotation boxes; pillow-heif rotates on decode
        raw = Image.Exif()
        raw.load(pillow_heif.open_heif(io.BytesIO(data)).info["exif"])
        assert raw.get(0x0112) == orientation and Image.open(io.BytesIO(data)).getexif().get(0x0112) == 1
    else:  # Pillow reports the AVIF's rotation boxes as the EXIF tag and leaves the pixels as stored
        assert Image.open(io.BytesIO(data)).getexif().get(0x0112) == orientation
    out = prepare_image(data, ImageOptions(quality=100))
    px = pixels(out.encoded)
    if red in ("top", "bottom"):
        assert (out.width, out.height) == (20, 40)
        first, second = px[:15], px[25:]
    else:
        assert (out.width, out.height) == (40, 20)
        first, second = px[:, :15], px[:, 25:]
    if red in ("bottom", "right"):
        first, second = second, first
    assert mean_close(first, (255, 0, 0), 25) and mean_close(second, (0, 0, 255), 25)


@pytest.mark.parametrize("fmt", ["HEIF", "AVIF"])
def test_rotated_photo_resizes_in_displayed_orientation(fmt):
    out = prepare_image(encode(photo(300, 200, 3), fmt, 6), ImageOptions(size=(150, 50), resize="fill"))
    assert (out.height, out.width) == (150, 50)
    out = prepare_image(encode(photo(300, 200, 3), fmt, 6), ImageOptions(size=(100, 100), resize="fit"))
    assert (out.width, out.height) == (67, 100)


@pytest.mark.parametrize("fmt", ["HEIF", "AVIF"])
def test_alpha_is_composited_on_the_background(fmt):
    image = Image.new("RGBA", (16, 16), (255, 0, 0, 0))
    out = prepare_image(encode(image, fmt), ImageOptions(quality=100, background=(0, 255, 0)))
    assert mean_close(pixels(out.encoded), (0, 255, 0), 12)


@pytest.mark.parametrize("fmt", ["HEIF", "AVIF"])
def test_truncated_file_is_rejected_as_corrupt(fmt):
    data = encode(photo(64, 64, 4), fmt)
    with pytest.raises(Rejected) as info:
        prepare_image(data[: len(data) // 2], ImageOptions())
    assert info.value.reason == "corrupt" and info.value.message


def test_extensions_are_media():
    assert all(skip_reason(f"cat/IMG_0001{ext}") is None for ext in (".heic", ".HEIC", ".heif", ".avif", ".AVIF"))


WITHOUT_PILLOW_HEIF = """
import sys
if sys.argv[1] == "blocked":
    sys.modules["pillow_heif"] = None  # `import pillow_heif` now raises ImportError, as when it is missing
from pathlib import Path
from shard_utils.media.images import ImageOptions, Rejected, prepare_image
print("imported at start:", "pillow_heif" in sys.modules and sys.modules["pillow_heif"] is not None)
print("avif:", prepare_image(Path(sys.argv[3]).read_bytes(), ImageOptions()).width)
print("after avif:", "pillow_heif" in sys.modules and sys.modules["pillow_heif"] is not None)
try:
    print("heic:", prepare_image(Path(sys.argv[2]).read_bytes(), ImageOptions()).width)
except Rejected as exc:
    print("heic:", exc.reason, exc.message)
"""


def run_without(mode: str, heic: bytes, avif: bytes, tmp_path) -> list[str]:
    (tmp_path / "a.heic").write_bytes(heic)
    (tmp_path / "a.avif").write_bytes(avif)
    done = subprocess.run([sys.executable, "-c", WITHOUT_PILLOW_HEIF, mode, tmp_path / "a.heic", tmp_path / "a.avif"],
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines()


def test_heic_without_pillow_heif_is_rejected_naming_the_extra(tmp_path):
    heic, avif = encode(photo(30, 20, 1), "HEIF"), encode(photo(30, 20, 1), "AVIF")
    lines = run_without("blocked", heic, avif, tmp_path)
    assert lines == ["imported at start: False", "avif: 30", "after avif: False",
                     f"heic: unsupported_format {HEIF_EXTRA_HINT}"]
    assert HEIF_EXTRA_HINT.endswith('pip install pillow-heif (in a tpu-shards checkout: pip install -e ".[heif]")')


def test_pillow_heif_is_imported_only_when_a_heic_arrives(tmp_path):
    heic, avif = encode(photo(30, 20, 1), "HEIF"), encode(photo(30, 20, 1), "AVIF")
    assert run_without("available", heic, avif, tmp_path) == [
        "imported at start: False", "avif: 30", "after avif: False", "heic: 30"]


@pytest.mark.slow
def test_job_builds_records_from_heic_avif_and_motion_photo_jpegs(tmp_path):
    src = tmp_path / "in" / "phone"
    src.mkdir(parents=True)
    buf = io.BytesIO()
    photo(48, 32, 7).save(buf, "JPEG", quality=90)
    primary = buf.getvalue()
    motion = primary + b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 32 + b"\xff\xd9"
    files = {"IMG_1.HEIC": encode(red_left_half(), "HEIF", 6), "IMG_2.avif": encode(red_left_half(), "AVIF", 6),
             "PXL_3.MP.jpg": motion, "IMG_4.heif": encode(photo(48, 32, 8), "HEIF")}
    for name, data in files.items():
        (src / name).write_bytes(data)
    out = tmp_path / "out"
    m = run_job(tmp_path / "in", out, "--num-cores", "1", "--jpeg-quality", "100")
    recs = by_source(out)
    assert sorted(recs) == sorted(f"phone/{name}" for name in files) and rejected(out) == {}
    for name in ("IMG_1.HEIC", "IMG_2.avif"):
        image = decoded(recs[f"phone/{name}"])
        assert image.size == (20, 40)
        assert mean_close(np.asarray(image.convert("RGB"), dtype=np.int16)[:15], (255, 0, 0), 25), name
    kept = recs["phone/PXL_3.MP.jpg"]
    assert kept[schema.IMAGE_ENCODED] == primary
    assert kept[schema.SHA256].decode() == hashlib.sha256(motion).hexdigest()  # of the whole source file
    assert decoded(recs["phone/IMG_4.heif"]).size == (48, 32)
    assert m.files_seen == 4
