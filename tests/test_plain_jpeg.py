"""A JPEG with a plain header: what plain_jpeg reads of it is what Pillow and jpeg_primary_end read, prepare_image
keeps the same bytes and geometry as for any other JPEG, its decode check and the readers' Pillow path the same
pixels, flags and refusals as Pillow's open, draft and load; every other header is Pillow's."""
import io
import random
import re
import warnings

import numpy as np
import pytest
from conftest import photo
from PIL import Image, ImageCms, ImageFile

from shard_utils import storage
from shard_utils.format.jpeg import PlainJpeg, jpeg_primary_end, plain_header, plain_jpeg
from shard_utils.media.images import ImageOptions, Rejected, _check_draft, prepare_image
from shard_utils.quality.flags import inspect, view_of
from shard_utils.read.random_access import _jpeg, _plain_picture

STRUCTURE = ImageOptions(validate="structure")
ICC = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()


def jpeg(image, **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "JPEG", **kw)
    return buf.getvalue()


def with_segment(data: bytes, marker: int, payload: bytes) -> bytes:
    """`data` with a segment right after its start-of-image marker."""
    return data[:2] + bytes((0xFF, marker)) + (len(payload) + 2).to_bytes(2, "big") + payload + data[2:]


def pillow_reads(data: bytes) -> PlainJpeg | None:
    """What Pillow and jpeg_primary_end make of the bytes, as a PlainJpeg; None when either refuses them, or Pillow
    finds more than a plain header (EXIF, XMP, ICC, MPO) or another mode than L or RGB."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            image = Image.open(io.BytesIO(data))
        end = jpeg_primary_end(data)
    except Exception:  # noqa: BLE001 - any refusal: plain_jpeg must refuse too
        return None
    if image.format != "JPEG" or image.mode not in ("L", "RGB") or image.info.keys() & {"exif", "xmp", "mp"}:
        return None
    return PlainJpeg(*image.size, 1 if image.mode == "L" else 3, end)


@pytest.fixture(scope="module")
def plain() -> dict[str, bytes]:
    colour, grey = photo(40, 24, 1), photo(40, 24, 2).convert("L")
    return {
        "baseline": jpeg(colour, quality=90),
        "grey": jpeg(grey),
        "progressive": jpeg(colour, progressive=True, optimize=True),
        "4:4:4 and 16-bit tables": jpeg(colour, subsampling=0, qtables=[[300] * 64, [2] * 64]),
        "restart markers and a comment": jpeg(colour, restart_marker_blocks=1, comment=b"made here"),
        "trailer": jpeg(colour) + b"maker data \xff\xd9",
        "icc profile": jpeg(colour, icc_profile=ICC),
        "adobe": with_segment(jpeg(colour), 0xEE, b"Adobe\x00\x64\x00\x00\x00\x00\x01"),
    }


def test_a_plain_header_is_read_as_pillow_reads_it(plain):
    for name, data in plain.items():
        found = plain_jpeg(data)
        assert found is not None, name
        assert found == pillow_reads(data), name
        image = prepare_image(data, STRUCTURE)
        assert (image.encoded, image.width, image.height, image.channels, image.passed_through,
                image.trailer_bytes) == (data[:found.end], 40, 24, found.components, True, len(data) - found.end), name
        assert image.inspection is not None and image.inspection.signature is None


def with_longer_frame(data: bytes) -> bytes:
    """`data` with a byte more in its frame header, past its last whole component entry (Pillow refuses it)."""
    at = data.index(b"\xff\xc0") + 2
    end = at + int.from_bytes(data[at:at + 2], "big")
    return data[:at] + (end - at + 1).to_bytes(2, "big") + data[at + 2:end] + b"\x01" + data[end:]


def test_any_other_header_is_left_to_pillow(plain):
    data = plain["baseline"]
    others = {
        "frame with a partial component entry": with_longer_frame(data),
        "exif": with_segment(data, 0xE1, b"Exif\x00\x00MM\x00\x2a\x00\x00\x00\x08\x00\x00"),
        "mpf": with_segment(data, 0xE2, b"MPF\x00" + bytes(16)),
        "short icc piece": with_segment(data, 0xE2, b"ICC_PROFILE\x00\x01"),
        "short adobe": with_segment(data, 0xEE, b"Adobe\x00"),
        "photoshop": with_segment(data, 0xED, b"Photoshop 3.0\x00"),
        "cmyk": jpeg(photo(16, 16, 3).convert("CMYK")),
        "short jfif": with_segment(data[:2] + data[2 + 2 + int.from_bytes(data[4:6], "big"):], 0xE0, b"JFIF\x00"),
        "fill byte": data[:2] + b"\xff" + data[2:],
        "truncated": data[:-2],
        "no image": b"\xff\xd8\xff\xd9",
        "png": b"\x89PNG\r\n\x1a\n" + bytes(32),
    }
    for name, other in others.items():
        assert plain_jpeg(other) is None, name


def test_plain_jpeg_never_reads_a_header_pillow_refuses_or_reads_otherwise(plain):
    """Every byte of each header changed, and each header cut short: whenever plain_jpeg reads one, Pillow and
    jpeg_primary_end read the same (so the path without Pillow keeps or refuses the same files)."""
    rng = random.Random(7)
    read = 0
    for data in (plain["baseline"], plain["grey"], plain["progressive"], plain["adobe"],
                 with_segment(plain["baseline"], 0xE2, b"ICC_PROFILE\x00\x01\x01" + ICC[:40])):
        header = data.index(b"\xff\xda") + 14
        variants = [data[:cut] for cut in range(header)]
        for at in range(2, header):
            for value in (0x00, 0x01, 0x08, 0xC0, 0xDA, 0xFF, rng.randrange(256)):
                variants.append(data[:at] + bytes((value,)) + data[at + 1:])
        for variant in variants:
            found = plain_jpeg(variant)
            if found is not None:
                read += 1
                assert found == pillow_reads(variant), variant[:header].hex()
    assert read > 1000  # most one-byte changes (a table's value, a comment's) keep a header plain


def test_over_max_pixels_is_refused_as_before(plain):
    with pytest.raises(Rejected) as refused:
        prepare_image(plain["baseline"], ImageOptions(validate="structure", max_pixels=100))
    assert refused.value.reason == "too_large"


def pillow_checked(data: bytes, inspecting: bool):
    """What the decode check of any JPEG makes of the bytes: the quality checks' Inspection (None without them)
    from Image.open, draft and load of the primary image, or the message of the decoder's refusal."""
    encoded = data[:jpeg_primary_end(data)]
    image = Image.open(io.BytesIO(encoded))
    image.draft(image.mode, _check_draft(image.width, image.height, inspecting))
    try:
        image.load()
    except OSError as exc:
        return f"cannot decode JPEG data: {exc}"
    return inspect(view_of(image), *reversed(Image.open(io.BytesIO(encoded)).size)) if inspecting else None


def checked(data: bytes, inspecting: bool):
    try:
        return prepare_image(data, ImageOptions(inspect=inspecting)).inspection
    except Rejected as refused:
        return refused.message


@pytest.mark.parametrize("inspecting", [True, False], ids=["checks", "no checks"])
def test_a_plain_jpeg_is_decoded_as_pillow_decodes_it(plain, inspecting):
    """The same flags and signature at every draft scale (1/1 to 1/8, grey and colour, progressive, with a
    trailer), and the same refusal of damaged scan data, as Pillow's own open, draft and load give."""
    rng = random.Random(11)
    sizes = [(40, 24), (130, 70), (300, 260), (1030, 90), (9, 700)]
    cases = dict(plain) | {f"{w}x{h} {kind}": jpeg(photo(w, h, w).convert(kind), progressive=w > 200)
                           for w, h in sizes for kind in ("RGB", "L")}
    damaged = {}
    for name, data in cases.items():
        scan = data.index(b"\xff\xda") + 12
        for n in range(4):
            at = rng.randrange(scan, jpeg_primary_end(data) - 2)
            damaged[f"{name} damaged {n}"] = data[:at] + bytes((rng.randrange(256),)) + data[at + 1:]
    refused = 0
    for name, data in (cases | damaged).items():
        if plain_jpeg(data) is None:
            continue
        expected = pillow_checked(data, inspecting)
        refused += isinstance(expected, str)
        assert checked(data, inspecting) == expected, name
    assert refused  # some damage the decoder refuses


@pytest.mark.parametrize("validate", ["decode", "structure"])
def test_the_check_raises_pillows_pixel_limit_as_opening_does(plain, monkeypatch, validate):
    """Pillow refuses over twice its MAX_IMAGE_PIXELS; --max-pixels above it raises it, as the path through
    Image.open always did (a structural check too, which decodes nothing), so a later open of the record in the same
    worker (--embed-model's) is not refused."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    prepare_image(plain["baseline"], ImageOptions(validate=validate, max_pixels=5000))
    assert Image.MAX_IMAGE_PIXELS == 5000
    assert Image.open(io.BytesIO(plain["baseline"])).size == (40, 24)


# ----------------------------------------------------------------------------- the readers' Pillow path


def opened(data: bytes, size=None) -> np.ndarray | str:
    """The readers' pixels of any image as they were before the plain path (Image.open, draft, load, convert,
    resize), or the message of their refusal."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            if size is not None and image.size != (size[1], size[0]):
                image.draft("RGB", (size[1], size[0]))
                rgb = image if image.mode == "RGB" else image.convert("RGB")
                return np.asarray(rgb.resize((size[1], size[0]), Image.Resampling.BILINEAR))
            image.load()
            return np.asarray(image if image.mode == "RGB" else image.convert("RGB"))
    except Exception as exc:  # noqa: BLE001 - any refusal: the reader must refuse alike
        return f"record 'r': image does not decode: {storage.problem(exc)}"


def read(data: bytes, size=None) -> np.ndarray | str:
    try:
        return _jpeg(data, "r", size)
    except ValueError as exc:
        return str(exc)


def same(got, expected) -> bool:
    """The same pixels, or the same refusal (but for the address of the BytesIO a message may name)."""
    if isinstance(expected, str):
        return isinstance(got, str) and re.sub(" at 0x[0-9a-f]+", "", got) == re.sub(" at 0x[0-9a-f]+", "", expected)
    return isinstance(got, np.ndarray) and got.dtype == expected.dtype and np.array_equal(got, expected)


def targets(w: int, h: int) -> list:
    """Reader sizes (height, width): none, the picture's own, each draft scale, larger, and other shapes."""
    return [None, (h, w), (max(1, h // 2), max(1, w // 2)), (max(1, h // 3), max(1, w // 5)),
            (max(1, h // 8), max(1, w // 8)), (max(1, h // 9), max(1, w // 11)), (h * 2 + 1, w + 3), (7, 224)]


@pytest.fixture(scope="module")
def generated(plain) -> dict[str, bytes]:
    """Plain JPEGs of many shapes: 4:4:4, 4:2:2 and 4:2:0 colour and grey, baseline and progressive, with restart
    markers, odd and tiny sizes, and the plain fixture's headers (ICC, Adobe, 16-bit tables, a trailer)."""
    out = dict(plain)
    out["adobe untransformed"] = with_segment(jpeg(photo(40, 24, 5)), 0xEE, b"Adobe\x00\x64\x00\x00\x00\x00\x00")
    out["over 64 KiB"] = jpeg(photo(520, 390, 6), quality=95)  # Image.open's load feeds it to the decoder in pieces
    for w, h in [(40, 24), (130, 70), (301, 257), (9, 700), (1, 1), (17, 33)]:
        for kind, options in (("4:4:4", {"subsampling": 0}), ("4:2:2", {"subsampling": 1}),
                              ("4:2:0", {"subsampling": 2}), ("grey", {})):
            image = photo(w, h, w + h)
            image = image.convert("L") if kind == "grey" else image
            out[f"{w}x{h} {kind}"] = jpeg(image, quality=85, **options)
            out[f"{w}x{h} {kind} progressive"] = jpeg(image, progressive=True, **options)
            out[f"{w}x{h} {kind} restarts"] = jpeg(image, restart_marker_rows=1, **options)
    return out


def test_a_reader_decodes_a_plain_jpeg_as_image_open_does(generated):
    """The plain path (no Image.open) gives the pixels Pillow's open, draft and load gave, bit for bit, at every
    draft scale, with and without a target size, grey and colour."""
    assert len(generated["over 64 KiB"]) > 65536
    for name, data in generated.items():
        w, h = Image.open(io.BytesIO(data)).size
        for size in targets(w, h):
            assert _plain_picture(data, size) is not None, (name, size)  # the plain path decoded it
            assert same(read(data, size), opened(data, size)), (name, size)


def test_damaged_bytes_give_the_reader_the_same_error_or_the_same_pixels(generated):
    """A changed byte anywhere (header or scan data), a cut anywhere, junk after the end: the same refusal, worded
    the same, or the same pixels (libjpeg finishes some damaged scans) as through Image.open."""
    rng = random.Random(5)
    outcomes = {"refused": 0, "decoded damaged": 0}
    for name in ("40x24 4:2:0", "130x70 4:4:4 progressive", "130x70 grey restarts", "17x33 4:2:2", "icc profile",
                 "trailer"):
        data = generated[name]
        variants = [data[:cut] for cut in sorted(rng.sample(range(2, len(data)), 12))] + [data + b"\x00\xff\xd8junk"]
        for _ in range(30):
            at = rng.randrange(2, len(data))
            variants.append(data[:at] + bytes((rng.choice((0x00, 0xFF, 0xD9, rng.randrange(256))),)) + data[at + 1:])
        for variant in variants:
            w, h = Image.open(io.BytesIO(data)).size
            for size in (None, (max(1, h // 4), max(1, w // 4))):
                expected = opened(variant, size)
                assert same(read(variant, size), expected), (name, variant.hex(), size)
                plain_read = plain_header(variant) is not None and _plain_picture(variant, size) is not None
                outcomes["refused"] += isinstance(expected, str)
                outcomes["decoded damaged"] += plain_read and variant[:len(data)] != data
    assert outcomes["refused"] > 20 and outcomes["decoded damaged"] > 20, outcomes  # both kinds were met


def test_other_images_take_image_opens_path(plain):
    """EXIF, CMYK, PNG: no plain header, so Image.open reads them, as before."""
    exif = Image.Exif()
    exif[0x0112] = 6  # the readers give the stored picture, unturned
    others = {"exif": jpeg(photo(40, 24, 1), exif=exif.tobytes()),
              "cmyk": jpeg(photo(16, 16, 3).convert("CMYK"))}
    png = io.BytesIO()
    photo(16, 12, 4).save(png, "PNG")
    others["png"] = png.getvalue()
    for name, data in others.items():
        for size in (None, (8, 8)):
            assert _plain_picture(data, size) is None, name
            expected = opened(data, size)
            assert isinstance(expected, np.ndarray) and same(read(data, size), expected), name


def test_truncated_images_loaded_by_pillow_are_pillows(plain, monkeypatch):
    """With ImageFile.LOAD_TRUNCATED_IMAGES, Pillow finishes a cut image itself: its path decodes it."""
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    data = plain["progressive"][:len(plain["progressive"]) * 2 // 3]
    assert _plain_picture(data, None) is None
    expected = opened(data)
    assert isinstance(expected, np.ndarray) and same(read(data), expected)


def test_the_readers_keep_pillows_pixel_limit(plain, monkeypatch):
    """Over Pillow's MAX_IMAGE_PIXELS Image.open warns, over twice it refuses: the reader still does both."""
    data = plain["baseline"]
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 40 * 24 - 1)
    with pytest.warns(Image.DecompressionBombWarning):
        assert same(read(data), opened(data))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 40 * 24 // 2 - 1)
    got = read(data)
    assert isinstance(got, str) and "decompression bomb" in got and got == opened(data)


# ----------------------------------------------------------------------------- hostile headers, both paths


def frame_changed(data: bytes, marker: int | None = None, bits: int | None = None, height: int | None = None,
                  sampling: tuple[int, ...] = ()) -> bytes:
    """`data` with its frame header's marker, precision, height or components' sampling bytes changed."""
    at = re.search(rb"\xff[\xc0\xc2]", data).start()
    out = bytearray(data)
    if marker is not None:
        out[at + 1] = marker
    if bits is not None:
        out[at + 4] = bits
    if height is not None:
        out[at + 5:at + 7] = height.to_bytes(2, "big")
    for k, value in enumerate(sampling):
        out[at + 11 + 3 * k] = value
    return bytes(out)


def without_jfif(data: bytes) -> bytes:
    return data[:2] + data[4 + int.from_bytes(data[4:6], "big"):]


def dqt_after_frame(data: bytes) -> bytes:
    """`data` with its first quantisation table segment moved to just after its frame header."""
    at = data.index(b"\xff\xdb")
    dqt = data[at:at + 2 + int.from_bytes(data[at + 2:at + 4], "big")]
    rest = data[:at] + data[at + len(dqt):]
    frame = rest.index(b"\xff\xc0")
    end = frame + 2 + int.from_bytes(rest[frame + 2:frame + 4], "big")
    return rest[:end] + dqt + rest[end:]


def hostile_headers() -> dict[str, bytes]:
    colour, grey = photo(67, 45, 3), photo(67, 45, 4).convert("L")
    base = jpeg(colour, quality=90, subsampling=0)
    adobe = b"Adobe\x00\x64\x00\x00\x00\x00"
    icc = jpeg(colour, icc_profile=bytes(70000))  # in two APP2 pieces
    piece = icc.index(b"ICC_PROFILE\x00")
    cases = {
        "extended frame": frame_changed(base, marker=0xC1),
        "restart interval": jpeg(colour, restart_marker_blocks=3),
        "comment before the frame": with_segment(base, 0xFE, b"made here"),
        "empty comment": with_segment(base, 0xFE, b""),
        "icc profile in two pieces": icc,
        "icc pieces miscounted": icc[:piece + 13] + b"\x03" + icc[piece + 14:],
        "jfif thumbnail": with_segment(without_jfif(base), 0xE0,
                                       b"JFIF\x00\x01\x02\x00\x00\x01\x00\x01\x02\x01" + bytes(6)),
        "jfxx thumbnail": with_segment(base, 0xE0, b"JFXX\x00\x10" + jpeg(photo(8, 8, 1))),
        "app0 not jfif": with_segment(without_jfif(base), 0xE0, b"AVI1\x00\x00\x00\x00"),
        "app0 of two bytes": with_segment(without_jfif(base), 0xE0, b"AV"),
        "4:1:1 sampling": frame_changed(base, sampling=(0x41, 0x11, 0x11)),
        "4:4:0 sampling": frame_changed(base, sampling=(0x12, 0x11, 0x11)),
        "chroma sampled more than luma": frame_changed(base, sampling=(0x11, 0x21, 0x11)),
        "zero sampling": frame_changed(base, sampling=(0x00, 0x11, 0x11)),
        "grey, adobe transform 1": with_segment(jpeg(grey), 0xEE, adobe + b"\x01"),
        "colour, adobe transform 2": with_segment(base, 0xEE, adobe + b"\x02"),
        "two adobe segments": with_segment(with_segment(base, 0xEE, adobe + b"\x00"), 0xEE, adobe + b"\x01"),
        "tables after the frame": dqt_after_frame(base),
        "cmyk": jpeg(photo(32, 24, 3).convert("CMYK")),
        "12-bit": frame_changed(base, bits=12),
        "lossless": frame_changed(base, marker=0xC3),
        "arithmetic": frame_changed(base, marker=0xC9),
        "arithmetic progressive": frame_changed(jpeg(colour, progressive=True), marker=0xCA),
        "no height (DNL)": frame_changed(base, height=0),
        "stray byte between segments": base[:20] + b"\x00" + base[20:],
    }
    return cases


def through_pillow(data: bytes, options: ImageOptions, monkeypatch):
    """prepare_image's outcome (its image, or its refusal's reason and message) along the path every image takes."""
    with monkeypatch.context() as m:
        m.setattr("shard_utils.media.images.plain_jpeg", lambda *args, **kwargs: None)
        return prepared(data, options)


def prepared(data: bytes, options: ImageOptions):
    try:
        return prepare_image(data, options)
    except Rejected as refused:
        return refused.reason, refused.message


def test_hostile_headers_give_what_pillows_path_gives(monkeypatch):
    """CMYK, 12-bit, lossless, arithmetic-coded, DNL frames, odd sampling, Adobe transforms on grey, ICC pieces,
    thumbnails, comments and tables in odd places: the build's check (both modes) and the readers give the outcome of
    Pillow's own open, draft and load, the plain path reading only the headers Pillow reads as plain."""
    plain_read = 0
    for name, data in hostile_headers().items():
        found = plain_jpeg(data)
        assert found is None or found == pillow_reads(data), name
        plain_read += plain_header(data) is not None
        for options in (ImageOptions(), ImageOptions(validate="structure"), ImageOptions(inspect=False)):
            assert prepared(data, options) == through_pillow(data, options, monkeypatch), (name, options)
        for size in (None, (7, 224), (11, 16)):
            assert same(read(data, size), opened(data, size)), (name, size)
    assert plain_read == 18  # all but the last seven are read without Image.open


HEADER_PIECES = [b"\xff\xfe\x00\x05abc", b"\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00",
                 b"\xff\xe1\x00\x08Exif", b"\xff\xdd\x00\x04\x00\x01", b"\xff\xee\x00\x0eAdobe\x00\x64" + bytes(5),
                 b"\xff\xe2\x00\x10ICC_PROFILE\x00\x01\x01", b"\xff\xe2\x00\x08MPF\x00\x00\x00", b"\xff\xed\x00\x04ab",
                 b"\xff\x01", b"\xff\xd0", b"\xff\xff", b"\x00", b"\xff\xdc\x00\x04\x00\x10", b"\xff\xc4\x00\x02"]


def header_segments(data: bytes) -> tuple[list[bytes], int]:
    """The marker segments before the first start-of-scan, and where it is."""
    pos, found = 2, []
    while data[pos + 1] != 0xDA:
        end = pos + 2 + int.from_bytes(data[pos + 2:pos + 4], "big")
        found.append(data[pos:end])
        pos = end
    return found, pos


def test_headers_with_segments_moved_repeated_dropped_or_added_give_what_pillows_path_gives(plain, monkeypatch):
    """Whole segments shuffled: a table or frame twice or missing, a comment, EXIF, MPF, a restart marker, fill or a
    stray byte among them. Wherever the header is still read as plain, the same facts, outcome and pixels."""
    rng = random.Random(3)
    bases = [plain[name] for name in ("baseline", "grey", "progressive", "restart markers and a comment", "adobe")]
    kept = 0
    for _ in range(150):
        data = rng.choice(bases)
        pieces, scan = header_segments(data)
        for _ in range(rng.randint(1, 3)):
            at, choice = rng.randrange(len(pieces) + 1), rng.random()
            if choice < 0.3 and pieces:
                del pieces[at - 1]
            elif choice < 0.6 and pieces:
                pieces.insert(at, rng.choice(pieces))
            else:
                pieces.insert(at, rng.choice(HEADER_PIECES))
        variant = data[:2] + b"".join(pieces) + data[scan:]
        found = plain_jpeg(variant)
        if found is None:
            continue
        kept += 1
        assert found == pillow_reads(variant), variant.hex()
        for options in (ImageOptions(), ImageOptions(validate="structure")):
            assert prepared(variant, options) == through_pillow(variant, options, monkeypatch), variant.hex()
        assert same(read(variant, (9, 8)), opened(variant, (9, 8))), variant.hex()
    assert 40 < kept < 150  # both kinds met
