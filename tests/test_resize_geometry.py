"""Resize geometry for every mode and size: the pure box/size math on many cases, `resize` on blank images,
the JPEG draft against Pillow's own choice of scale, and `prepare_image` end to end on real JPEGs."""
import io
import math
from fractions import Fraction

import numpy as np
import pytest
from conftest import photo
from hypothesis import example, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps

from shard_utils.media.images import RESIZE_MODES, ImageOptions, _draft_size, fill_box, fit_size, prepare_image, resize

sides = st.integers(1, 5000)
targets = st.integers(1, 65535)


@settings(max_examples=1000, deadline=None)
@given(sides, sides, targets, targets)
@example(413, 386, 224, 224)
@example(386, 413, 512, 512)
def test_fill_box_is_centred_inside_the_picture_with_the_target_aspect(width, height, target_h, target_w):
    left, top, right, bottom = fill_box(width, height, (target_h, target_w))
    assert 0 <= left < right <= width and 0 <= top < bottom <= height
    assert (left, right) == (0, width) or (top, bottom) == (0, height)  # one side is kept whole
    assert math.isclose(left, width - right, abs_tol=1e-9) and math.isclose(top, height - bottom, abs_tol=1e-9)
    scale = max(width, height) * max(target_h, target_w)  # float error grows with the coordinates
    assert abs((right - left) * target_h - (bottom - top) * target_w) <= 1e-12 * scale


@settings(max_examples=1000, deadline=None)
@given(sides, sides, targets, targets)
def test_fit_size_fits_touches_one_side_and_keeps_the_aspect(width, height, target_h, target_w):
    new_w, new_h = fit_size(width, height, (target_h, target_w))
    assert 1 <= new_w <= target_w and 1 <= new_h <= target_h

    def rounded(side: int, exact: Fraction) -> bool:
        return abs(side - exact) <= Fraction(1, 2) or (side == 1 and exact < 1)

    assert (new_w == target_w and rounded(new_h, Fraction(height * target_w, width))
            or new_h == target_h and rounded(new_w, Fraction(width * target_h, height)))


@pytest.fixture(scope="module")
def header_jpeg() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16)).save(buf, "JPEG")
    return buf.getvalue()


def claiming(data: bytes, width: int, height: int) -> bytes:
    """The JPEG with its frame header (SOF0) claiming another size: Pillow's draft reads only the header."""
    sof = data.index(b"\xff\xc0") + 5
    return data[:sof] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + data[sof + 4:]


@settings(max_examples=500, deadline=None)
@given(st.integers(1, 8000), st.integers(1, 8000), st.integers(1, 2048), st.integers(1, 2048),
       st.sampled_from(RESIZE_MODES))
@example(766, 766, 384, 384, "fill")  # the old int() truncation asked for 383 and got a 1/2 scale: 383 px
@example(1195, 896, 299, 299, "fit")
def test_jpeg_draft_never_decodes_fewer_pixels_than_the_resize_needs(header_jpeg, width, height, target_h,
                                                                     target_w, mode):
    image = Image.open(io.BytesIO(claiming(header_jpeg, width, height)))
    drafted = image.draft("RGB", _draft_size((width, height), (target_h, target_w), mode))
    scale = round(width / drafted[1][2]) if drafted else 1
    assert drafted is None or drafted[1] == (0, 0, width / scale, height / scale)
    assert image.size == (math.ceil(width / scale), math.ceil(height / scale))
    if mode == "stretch":
        needed = (Fraction(target_w), Fraction(target_h))
    else:
        pick = max if mode == "fill" else min
        factor = pick(Fraction(target_w, width), Fraction(target_h, height))
        needed = (width * factor, height * factor)
    if scale > 1:  # a reduced decode keeps at least the pixels the output needs: no upsampling
        assert Fraction(width, scale) >= needed[0] and Fraction(height, scale) >= needed[1]


def check_size(out_size: tuple[int, int], width: int, height: int, target: tuple[int, int], mode: str) -> None:
    """The output (width, height) is exactly the target's, or for `fit` fits inside with the source aspect."""
    target_h, target_w = target
    if mode != "fit":
        assert out_size == (target_w, target_h)
    else:
        assert out_size == fit_size(width, height, target)


small_sides = st.integers(1, 5000)
small_targets = st.integers(1, 1024)


@settings(max_examples=100, deadline=None)
@given(small_sides, small_sides, small_targets, small_targets, st.sampled_from(RESIZE_MODES))
@example(413, 386, 224, 224, "fill")
@example(386, 413, 299, 299, "fill")
@example(4644, 4647, 1, 1, "fit")  # one reduce() by 1548 drifted the colour by 4
def test_resize_gives_the_requested_size_for_any_source(width, height, target_h, target_w, mode):
    out = resize(Image.new("RGB", (width, height), (10, 20, 30)), (target_h, target_w), mode)
    check_size(out.size, width, height, (target_h, target_w), mode)
    # A flat colour stays flat, also when reduced by factors in the thousands.
    assert np.abs(np.asarray(out, dtype=np.int16) - (10, 20, 30)).max() <= 1


@settings(max_examples=100, deadline=None)
@given(small_sides, small_sides, small_targets, small_targets, st.sampled_from(RESIZE_MODES),
       st.sampled_from([2, 4, 8]))
@example(413, 386, 28, 28, "fill", 8)
def test_resize_of_a_drafted_image_uses_the_picture_box(width, height, target_h, target_w, mode, scale):
    """A JPEG decoded at 1/scale is ceil(side / scale) pixels; the picture is the box (0, 0, side / scale)."""
    image = Image.new("RGB", (math.ceil(width / scale), math.ceil(height / scale)), (10, 20, 30))
    out = resize(image, (target_h, target_w), mode, box=(0, 0, width / scale, height / scale))
    check_size(out.size, width, height, (target_h, target_w), mode)


def jpeg_bytes(image: Image.Image, orientation: int = 1) -> bytes:
    exif = image.getexif()
    if orientation != 1:
        exif[0x0112] = orientation
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=92, exif=exif.tobytes())
    return buf.getvalue()


@pytest.fixture(scope="module")
def jpeg_413x386() -> bytes:
    return jpeg_bytes(photo(413, 386, 11))


@pytest.mark.parametrize("mode", RESIZE_MODES)
@pytest.mark.parametrize("size", [224, 256, 299, 384, 512])
def test_413x386_jpeg_resizes_at_common_sizes(jpeg_413x386, size, mode):
    out = prepare_image(jpeg_413x386, ImageOptions(size=(size, size), resize=mode))
    check_size((out.width, out.height), 413, 386, (size, size), mode)
    decoded = Image.open(io.BytesIO(out.encoded))
    assert decoded.format == "JPEG" and decoded.size == (out.width, out.height)


@pytest.mark.parametrize("width,height,size", [
    (374, 386, 224), (392, 397, 256), (443, 447, 299), (482, 483, 384), (737, 737, 512),
])
def test_photo_sizes_whose_float_crop_box_went_negative(width, height, size):
    """Sizes found where the old float crop box had an offset of about -3e-14 at each common size."""
    out = prepare_image(jpeg_bytes(photo(width, height, 13)), ImageOptions(size=(size, size), resize="fill"))
    assert (out.width, out.height) == (size, size) and Image.open(io.BytesIO(out.encoded)).size == (size, size)


def quadrants(width: int, height: int) -> Image.Image:
    """Four colours, one per quadrant, so any wrong rotation, flip or crop shows."""
    image = Image.new("RGB", (width, height))
    colours = [(230, 30, 30), (30, 230, 30), (30, 30, 230), (230, 230, 30)]
    for i, colour in enumerate(colours):
        x, y = (i % 2) * width // 2, (i // 2) * height // 2
        image.paste(colour, (x, y, x + width // 2 + width % 2, y + height // 2 + height % 2))
    return image


@pytest.mark.parametrize("orientation", [1, 2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("stored,size", [((386, 413), 224), ((386, 413), 512), ((1795, 1003), (150, 100))])
def test_orientation_then_fill_matches_an_independent_reference(orientation, stored, size):
    """EXIF orientation 5-8 swaps sides; the result must equal orient-then-centre-crop done by ImageOps,
    including on the JPEG draft path (1795x1003 at 150x100 decodes at reduced scale)."""
    data = jpeg_bytes(quadrants(*stored), orientation)
    target = (size, size) if isinstance(size, int) else size
    out = prepare_image(data, ImageOptions(size=target, resize="fill", quality=95))
    assert (out.height, out.width) == target
    shown = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    expected = ImageOps.fit(shown, (target[1], target[0]), Image.Resampling.BICUBIC)
    got = np.asarray(Image.open(io.BytesIO(out.encoded)), dtype=np.int16)
    assert np.abs(got - np.asarray(expected, dtype=np.int16)).mean() < 4


@pytest.mark.parametrize("orientation", [5, 6, 7, 8])
@pytest.mark.parametrize("mode", RESIZE_MODES)
def test_side_swapping_orientations_give_the_displayed_size(orientation, mode):
    data = jpeg_bytes(photo(1003, 1795, 12), orientation)  # stored portrait, displayed landscape
    for target in [(224, 224), (256, 320), (299, 150)]:
        out = prepare_image(data, ImageOptions(size=target, resize=mode))
        check_size((out.width, out.height), 1795, 1003, target, mode)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 700), st.integers(1, 700), st.integers(1, 160), st.integers(1, 160),
       st.sampled_from(RESIZE_MODES), st.integers(1, 8))
@example(413, 386, 28, 28, "fill", 1)
def test_prepare_image_never_rejects_a_valid_jpeg_for_its_size(width, height, target_h, target_w, mode,
                                                              orientation):
    data = jpeg_bytes(Image.new("RGB", (width, height), (90, 140, 40)), orientation)
    out = prepare_image(data, ImageOptions(size=(target_h, target_w), resize=mode))
    shown = (height, width) if orientation >= 5 else (width, height)
    check_size((out.width, out.height), *shown, (target_h, target_w), mode)
