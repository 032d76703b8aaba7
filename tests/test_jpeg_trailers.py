"""The JPEG marker walk that finds where the primary image ends, and what prepare_image keeps of a JPEG
with bytes after its end-of-image marker (motion photos, maker data)."""
import io
import re
import struct
import warnings

import numpy as np
import pytest
from conftest import photo
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import ExifTags, Image

from shard_utils.format.jpeg import RESTARTS_SKIPPED, VECTOR_FROM, ScanEnds
from shard_utils.media.images import ImageOptions, Rejected, jpeg_primary_end, prepare_image


def jpeg(image, **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "JPEG", **kw)
    return buf.getvalue()


def with_exif_thumbnail(data: bytes, thumbnail: bytes) -> bytes:
    """`data` with an APP1 EXIF segment whose IFD1 carries `thumbnail` (a complete JPEG, SOI to EOI)."""
    ifd0 = struct.pack(">H", 0) + struct.pack(">I", 8 + 6)  # no entries; IFD1 follows
    ifd1 = struct.pack(">H", 2) + struct.pack(">HHII", 0x0201, 4, 1, 8 + 6 + 30) \
        + struct.pack(">HHII", 0x0202, 4, 1, len(thumbnail)) + struct.pack(">I", 0)
    tiff = b"MM\x00\x2a" + struct.pack(">I", 8) + ifd0 + ifd1 + thumbnail
    payload = b"Exif\x00\x00" + tiff
    return data[:2] + b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload + data[2:]


@pytest.fixture(scope="module")
def baseline() -> bytes:
    return jpeg(photo(64, 48, 1), quality=90)


def test_baseline_ends_at_its_last_byte(baseline):
    assert jpeg_primary_end(baseline) == len(baseline)


def test_progressive_with_many_scans_ends_at_its_last_byte():
    data = jpeg(photo(64, 48, 2), quality=90, progressive=True)
    assert data.count(b"\xff\xda") > 3
    assert jpeg_primary_end(data) == len(data)


def test_restart_markers_inside_the_scan_are_not_the_end():
    data = jpeg(photo(64, 48, 3), quality=90, restart_marker_blocks=1)
    assert sum(data.count(bytes([0xFF, m])) for m in range(0xD0, 0xD8)) > 5
    assert jpeg_primary_end(data) == len(data)


def test_exif_thumbnail_markers_do_not_end_the_image(baseline):
    thumb = jpeg(photo(8, 8, 4))
    data = with_exif_thumbnail(baseline, thumb)
    ifd1 = Image.open(io.BytesIO(data)).getexif().get_ifd(ExifTags.IFD.IFD1)  # Pillow finds the thumbnail
    start = 4 + 2 + 6 + ifd1[0x0201]  # SOI, APP1 marker and length, "Exif\0\0", then the TIFF offset
    assert data[start:start + ifd1[0x0202]] == thumb and data.find(b"\xff\xd9") < start + len(thumb)
    assert jpeg_primary_end(data) == len(data)
    assert jpeg_primary_end(data + b"trailer") == len(data)


def test_fill_bytes_before_markers_are_skipped(baseline):
    dqt = baseline.index(b"\xff\xdb")
    data = baseline[:dqt] + b"\xff\xff\xff" + baseline[dqt:-2] + b"\xff\xff\xff\xd9"
    Image.open(io.BytesIO(data)).load()  # libjpeg accepts it too
    assert jpeg_primary_end(data) == len(data)


@pytest.mark.parametrize("trailer", [
    b"\x00" * 100,
    b"MotionPhoto_Data" + b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 40,
    b"\xff\xd9\xff\xd9 maker notes \xff\xd8",
    "second_jpeg",
])
def test_trailer_is_not_part_of_the_image(baseline, trailer):
    trailer = jpeg(photo(16, 16, 5)) if trailer == "second_jpeg" else trailer
    assert jpeg_primary_end(baseline + trailer) == len(baseline)


@pytest.mark.parametrize("cut,why", [
    (1, "start-of-image"), (12, "truncated in the header"), (160, "truncated in the header"),
    ("half", "no end-of-image marker after the scan data"), (-1, "no end-of-image marker after the scan data"),
])
def test_truncated_jpeg_raises(baseline, cut, why):
    data = baseline[:len(baseline) // 2] if cut == "half" else baseline[:cut]
    with pytest.raises(ValueError, match=why):
        jpeg_primary_end(data)


@pytest.mark.parametrize("data,why", [
    (b"", "start-of-image"),
    (b"GIF89a not a jpeg", "start-of-image"),
    (b"\xff\xd8\xff\xd9", "no scan data"),
    (b"\xff\xd8" + b"random text without markers" * 10, "no end-of-image marker and no scan data"),
    (b"\xff\xd8\xff\xe0\x00\x01", "bad segment length"),
])
def test_garbage_raises(data, why):
    with pytest.raises(ValueError, match=why):
        jpeg_primary_end(data)


def test_a_thumbnail_whose_segment_length_is_wrong_is_not_taken_for_the_image(baseline):
    data = with_exif_thumbnail(baseline, jpeg(photo(8, 8, 4)))
    broken = data[:4] + b"\x00\x10" + data[6:]  # APP1 now claims 14 payload bytes: the thumbnail's SOI is next
    with pytest.raises(ValueError, match="second start-of-image"):
        jpeg_primary_end(broken)


@pytest.mark.parametrize("validate", ["decode", "structure"])
@pytest.mark.parametrize("ends_with_eoi", [False, True])  # was rejected as truncated / was kept whole
def test_pass_through_keeps_the_image_and_counts_the_dropped_trailer(baseline, validate, ends_with_eoi):
    video = b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 64 + (b"\xff\xd9" if ends_with_eoi else b"")
    out = prepare_image(baseline + video, ImageOptions(validate=validate))
    assert out.passed_through and out.encoded == baseline and out.trailer_bytes == len(video)
    assert (out.width, out.height, out.channels) == (64, 48, 3)


def test_pass_through_of_a_jpeg_followed_by_another_jpeg_keeps_the_first(baseline):
    second = jpeg(photo(16, 16, 6))
    out = prepare_image(baseline + second, ImageOptions())
    assert out.encoded == baseline and out.trailer_bytes == len(second)


def test_without_a_trailer_nothing_is_dropped(baseline):
    out = prepare_image(baseline, ImageOptions())
    assert out.encoded == baseline and out.trailer_bytes == 0


@pytest.mark.parametrize("validate", ["decode", "structure"])
def test_truncated_jpeg_with_something_appended_is_still_rejected(baseline, validate):
    with pytest.raises(Rejected) as info:
        prepare_image(baseline[:len(baseline) // 2] + b"\x00" * 64, ImageOptions(validate=validate))
    assert info.value.reason == "corrupt" and "truncated" in info.value.message


def test_reencoded_jpeg_with_a_trailer_decodes_and_drops_nothing_it_counts():
    source = photo(120, 90, 7)
    data = jpeg(source, quality=95) + b"MotionPhoto_Data" + bytes(range(256)) * 16
    for options in (ImageOptions(size=(30, 40)), ImageOptions(quality=100, size=(90, 120))):
        out = prepare_image(data, options)
        assert not out.passed_through and out.trailer_bytes == 0
        image = Image.open(io.BytesIO(out.encoded))
        image.load()
        assert image.format == "JPEG" and image.size == (options.size[1], options.size[0])
    reference = np.asarray(Image.open(io.BytesIO(data)), dtype=np.int16)  # same size as the last options
    assert np.abs(np.asarray(Image.open(io.BytesIO(out.encoded)), dtype=np.int16) - reference).mean() < 3


def mpo(first: Image.Image, second: Image.Image) -> bytes:
    buf = io.BytesIO()
    first.save(buf, "MPO", save_all=True, append_images=[second], quality=95)
    return buf.getvalue()


def test_mpo_is_reencoded_from_its_first_picture():
    data = mpo(Image.new("RGB", (32, 24), (200, 30, 30)), Image.new("RGB", (32, 24), (30, 30, 200)))
    assert Image.open(io.BytesIO(data)).format == "MPO"
    for options in (ImageOptions(), ImageOptions(size=(12, 16), resize="fill")):
        out = prepare_image(data, options)
        assert not out.passed_through and out.trailer_bytes == 0
        pixels = np.asarray(Image.open(io.BytesIO(out.encoded)).convert("RGB"), dtype=np.int16)
        assert np.abs(pixels.reshape(-1, 3).mean(0) - (200, 30, 30)).max() < 8


def _searching_walk(data: bytes) -> int | str:
    """The marker walk as a decoder does it, searching for every marker (no shortcut): the reference for
    jpeg_primary_end, which reads a marker in place when it is where a well-formed file has it."""
    if data[:2] != b"\xff\xd8":
        return "start-of-image"
    pos, scans = 2, 0
    while True:
        found = re.compile(rb"\xff[^\x00\xff]").search(data, pos)
        if found is None:
            return "no end-of-image marker"
        marker, pos = data[found.end() - 1], found.end()
        if marker == 0xD9:
            return pos if scans else "no scan data"
        if marker == 0xD8:
            return "second start-of-image"
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:
            continue
        length = int.from_bytes(data[pos:pos + 2], "big")
        if pos + 2 > len(data) or pos + length > len(data):
            return "truncated in the header"
        if length < 2:
            return "bad segment length"
        pos += length
        if marker == 0xDA:
            scans += 1
            found = re.compile(rb"\xff[^\x00\xd0-\xd7]").search(data, pos)
            if found is None:
                return "no end-of-image marker after the scan data"
            pos = found.start()


def _outcome(data: bytes) -> int | str:
    try:
        return jpeg_primary_end(data)
    except ValueError as exc:
        return str(exc)


def _edited(data: bytes, edits: list[tuple[float, bytes, int]]) -> bytes:
    """`data` with `cut` bytes at each relative position replaced by `insert`."""
    out = bytearray(data)
    for where, insert, cut in edits:
        at = int(where * len(out))
        out[at:at + cut] = insert
    return bytes(out)


@pytest.fixture(scope="module")
def kinds() -> list[bytes]:
    """Baseline, progressive, with restart markers, with an EXIF thumbnail, with fill bytes."""
    base = jpeg(photo(40, 32, 7), quality=90)
    return [base, jpeg(photo(40, 32, 8), progressive=True), jpeg(photo(40, 32, 9), restart_marker_blocks=2),
            with_exif_thumbnail(base, jpeg(photo(8, 8, 4))), base[:2] + b"\xff\xff" + base[2:]]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 4), st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.sampled_from(
    [b"", b"\xff", b"\x00", b"\xff\xd9", b"\xff\xd8", b"\xff\xda", b"\xff\xd0", b"\xff\xff", b"\x12"]),
    st.integers(0, 6)), max_size=4), st.binary(max_size=12))
def test_the_marker_walk_finds_what_a_searching_walk_finds(kinds, kind, edits, tail):
    data = _edited(kinds[kind], edits) + tail
    expected, got = _searching_walk(data), _outcome(data)
    assert got == expected if isinstance(expected, int) else expected in got


_EDITS = st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.sampled_from(
    [b"", b"\xff", b"\x00", b"\xff\xd9", b"\xff\xda", b"\xff\xd0\xff\xd9", b"\xff\xd3" * 40 + b"\xff\xc4", b"\xff\xff",
     b"\x12"]),
    st.integers(0, 6)), max_size=4)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 4), _EDITS, st.integers(1, 300), st.lists(st.floats(0, 1), min_size=1, max_size=12))
def test_the_vector_search_of_scan_data_finds_what_re_finds(kinds, kind, edits, block, places):
    """ScanEnds from increasing places, as the walk asks it (every search vectorised, in blocks as small as a byte,
    restart markers past RESTARTS_SKIPPED left to re), finds what the scan data's pattern searched from each finds."""
    data = _edited(kinds[kind], edits)
    ends = ScanEnds(data, vector_from=0, block=block)
    for pos in sorted(int(p * len(data)) for p in places):
        found = re.compile(rb"\xff[^\x00\xd0-\xd7]").search(data, pos)
        assert ends.first(pos) == (-1 if found is None else found.start())


@pytest.mark.parametrize("block", [1, 2, 5, 1000])
def test_a_marker_right_after_restart_markers_is_found_however_many_the_vector_search_skips(block):
    """Restart markers are skipped one by one, then left to re: a marker right after the last is found either way."""
    for count in range(RESTARTS_SKIPPED - 1, RESTARTS_SKIPPED + 3):
        data = b"\x12\xff\x00" * 5 + b"\xff\xd1" * count + b"\xff\xc4\x00"
        assert ScanEnds(data, vector_from=0, block=block).first(0) == 15 + 2 * count


@pytest.mark.parametrize("options", [dict(), dict(progressive=True), dict(restart_marker_rows=2),
                                     dict(restart_marker_blocks=4)])
def test_a_long_jpeg_is_walked_as_a_searching_walk_walks_it(options):
    """Scan data longer than VECTOR_FROM (searched with numpy, or with re after a restart interval): the same end as
    the searching walk finds, with a trailer, with a marker put in its middle, and cut there."""
    data = jpeg(photo(480, 360, 11), quality=90, **options)
    scan = data.find(b"\xff\xda")
    restarts = sum(data.count(bytes([0xFF, m])) for m in range(0xD0, 0xD8))
    assert len(data) - scan > 2 * VECTOR_FROM and (restarts > RESTARTS_SKIPPED) == ("restart_marker_blocks" in options)
    middle = scan + (len(data) - scan) // 2
    ends = [len(data), len(data), middle + 2, "no end-of-image marker after the scan data"]
    for case, end in zip((data, data + b"trailer", data[:middle] + b"\xff\xd9" + data[middle:], data[:middle]), ends,
                         strict=True):
        assert _searching_walk(case) == end
        assert _outcome(case) == end if isinstance(end, int) else end in _outcome(case)


def test_preparing_an_image_warns_of_nothing(monkeypatch, baseline):
    """Pillow's decompression-bomb warning (here at a lowered limit) is not for users: --max-pixels decides."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 2000)  # the 3,072-pixel image is over it, under twice it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Image.open(io.BytesIO(baseline))
        assert caught, "Pillow no longer warns here: this test checks nothing"
        caught.clear()
        for validate in ("decode", "structure"):
            assert prepare_image(baseline, ImageOptions(validate=validate)).passed_through
        assert not prepare_image(baseline, ImageOptions(size=(16, 16))).passed_through
    assert caught == []
