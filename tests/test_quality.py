"""The quality checks' pure parts: the perceptual signature, the flags and the findings' format."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image, ImageDraw

from shard_utils.quality import findings
from shard_utils.quality.signature import NEAR_DISTANCE, from_hex, hamming, signature, to_hex


def scene(seed: int, size: tuple[int, int] = (160, 120)) -> Image.Image:
    """A small photo-like picture: a gradient and a few shapes in colours drawn from the seed."""
    rng = np.random.default_rng(seed)
    w, h = size
    image = Image.fromarray((np.linspace(0, 1, h)[:, None, None] * rng.integers(0, 256, 3)
                             * np.ones((1, w, 1))).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    for _ in range(6):
        x, y = rng.uniform(0, w), rng.uniform(0, h)
        box = [x, y, x + rng.uniform(10, w / 2), y + rng.uniform(10, h / 2)]
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape(box, fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    return image


def reencoded(image: Image.Image, quality: int, scale: float = 1.0) -> np.ndarray:
    image = image.resize((round(image.width * scale), round(image.height * scale)), Image.Resampling.BICUBIC)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality)
    return np.asarray(Image.open(out).convert("RGB"))


def test_a_picture_reencoded_and_resized_keeps_its_signature_within_the_near_distance():
    for seed in range(5):
        original = signature(np.asarray(scene(seed)))
        for quality, scale in ((40, 1.0), (90, 0.5), (70, 1.7)):
            assert hamming(original, signature(reencoded(scene(seed), quality, scale))) <= NEAR_DISTANCE // 2


def test_different_pictures_are_far_apart():
    signatures = [signature(np.asarray(scene(seed))) for seed in range(12)]
    distances = [hamming(a, b) for i, a in enumerate(signatures) for b in signatures[i + 1:]]
    assert min(distances) > NEAR_DISTANCE
    assert 24 <= float(np.mean(distances)) <= 40  # about half the 64 bits


def test_the_signature_reads_grey_rgb_and_rgba_pixels_alike():
    rgb = np.asarray(scene(3))
    grey = np.asarray(scene(3).convert("L"))
    rgba = np.concatenate([rgb, np.full(rgb.shape[:2] + (1,), 7, np.uint8)], axis=2)
    assert signature(rgba) == signature(rgb)
    assert signature(grey) == signature(rgb) == signature(grey[:, :, None])
    with pytest.raises(ValueError, match="HxW"):
        signature(np.zeros((4, 4, 2), np.uint8))
    with pytest.raises(ValueError, match="uint8"):
        signature(np.zeros((4, 4, 3), np.float32))


def test_hamming_and_hex():
    assert hamming(0, 2**64 - 1) == 64 and hamming(0b1011, 0b0001) == 2
    assert to_hex(0xAB) == "00000000000000ab" and from_hex(to_hex(2**64 - 1)) == 2**64 - 1
    with pytest.raises(ValueError):
        from_hex("abc")


def test_a_finding_round_trips_through_its_line_and_bad_ones_are_named():
    made = findings.finding(findings.NEAR_DUPLICATE, ["a.jpg", "b.jpg"], ["train", "test"], distance=3)
    assert findings.from_line(json.dumps(made)) == made and findings.leaks(made)
    assert not findings.leaks(findings.finding(findings.BLUR, ["a.jpg"], ["train"], value=1.5, threshold=20))
    for line, message in (('{"kind": "odd", "sources": ["a"], "splits": ["t"]}', "unknown finding kind"),
                          ('{"kind": "blur", "sources": ["a", "b"], "splits": ["t", "t"]}', "one image"),
                          ('{"kind": "near_duplicate", "sources": ["a"], "splits": ["t"]}', "two images"),
                          ('{"kind": "small", "sources": ["a"], "splits": []}', "split of each"),
                          ("[1]", "JSON object"), ("{", "not JSON")):
        with pytest.raises(findings.BadFinding, match=message):
            findings.from_line(line)
    assert findings.counts([made, made])[findings.NEAR_DUPLICATE] == 2
    assert set(findings.counts([])) == set(findings.KINDS)


def flagged(image: Image.Image) -> set[str]:
    from shard_utils.quality.flags import inspect, view_of
    view = view_of(image)
    seen = inspect(view, image.height, image.width)
    assert inspect(np.asarray(view), image.height, image.width) == seen  # a view's pixels say the same
    return {kind for kind, _, _ in seen.flags}


def test_each_flag_is_raised_by_its_planted_image_and_no_other():
    from PIL import ImageFilter

    sharp = scene(1, (320, 240))
    assert flagged(sharp) == set()
    assert flagged(sharp.filter(ImageFilter.GaussianBlur(6))) == {"blur"}
    assert flagged(sharp.resize((60, 45))) == {"small"}
    assert flagged(sharp.resize((400, 100))) == {"aspect"}
    assert flagged(sharp.convert("L").convert("RGB")) == {"grayscale"}
    bright = np.asarray(sharp).astype(np.int16) + 250
    assert "overexposed" in flagged(Image.fromarray(bright.clip(0, 255).astype(np.uint8)))
    dark = np.asarray(sharp).astype(np.int16) - 250
    assert "underexposed" in flagged(Image.fromarray(dark.clip(0, 255).astype(np.uint8)))


def test_without_pixels_only_the_size_flags_are_known():
    from shard_utils.quality.flags import inspect

    seen = inspect(None, 30, 200)
    assert seen.signature is None and {kind for kind, _, _ in seen.flags} == {"small", "aspect"}


def test_colourfulness_is_the_mean_spread_of_r_g_b_for_any_layout_of_pixels():
    from shard_utils.quality.flags import colourfulness

    rng = np.random.default_rng(7)
    rgba = rng.integers(0, 256, (9, 13, 4), dtype=np.uint8)
    for pixels in (rgba[:, :, :3].copy(), rgba, rgba[::-2, ::3], rgba[:1, :1, :3].copy()):
        rgb = pixels[:, :, :3].astype(np.int64)
        spread = rgb.max(axis=2) - rgb.min(axis=2)
        assert colourfulness(pixels) == int(spread.sum()) / spread.size
    assert colourfulness(rgba[:, :, 0]) == 0.0 and colourfulness(rgba[:, :, :2]) == 0.0


def as_measured_in_full(view, height: int, width: int):
    """What inspect found when every measure was taken over every pixel: the clipped shares counted on the grey
    levels, colourfulness summed over every row."""
    from shard_utils.quality.flags import Inspection, colourfulness, pixel_flags, size_flags
    from shard_utils.quality.signature import grey, signature_of_grey

    luma = view.convert("L") if isinstance(view, Image.Image) else grey(view)
    flags = pixel_flags(np.asarray(luma, dtype=np.float32), colourfulness(np.asarray(view)))
    return Inspection(signature_of_grey(luma), tuple(size_flags(height, width) + flags))


def test_inspect_finds_what_every_pixel_measured_in_full_finds():
    from PIL import ImageFilter

    from shard_utils.quality.flags import SAMPLED_ROWS, colour_below, inspect, view_of

    rng = np.random.default_rng(11)
    views = []
    for i in range(120):
        h, w = int(rng.integers(1, 129)), int(rng.integers(1, 129))
        level = rng.integers(0, 256, (h, w, 1))
        tint = rng.integers(-int(rng.integers(0, 4)), int(rng.integers(0, 4)) + 1, (h, w, 3))
        if i % 3 == 0:  # colour only on the sampled rows, or only off them
            tint[(slice(None, None, SAMPLED_ROWS) if i % 2 else slice(1, None, SAMPLED_ROWS))] *= 40
        if i % 5 == 0:  # mostly clipped, near the share that flags it
            level[: int(h * rng.uniform(0.4, 0.7))] = (0, 3, 5, 6, 249, 252, 255)[i // 5 % 7]
        views.append(Image.fromarray(np.clip(level + tint, 0, 255).astype(np.uint8), "RGB"))
    for spread in range(12, 20):  # colour on the sampled rows alone, the whole's mean spread either side of 2
        pixels = np.full((64, 40, 3), 100, np.uint8)
        pixels[::SAMPLED_ROWS, :, 0] += spread
        views.append(Image.fromarray(pixels, "RGB"))
    views += [view_of(scene(seed, (320, 240)).filter(ImageFilter.GaussianBlur(seed % 4))) for seed in range(20)]
    views += [view_of(Image.open(io.BytesIO(j)).convert("RGB"))
              for j in (_jpeg(scene(seed, (400, 300)), 90) for seed in range(20))]
    for view in views:
        assert inspect(view, 100, 100) == as_measured_in_full(view, 100, 100)
        pixels = np.asarray(view)
        assert inspect(pixels, 100, 100) == as_measured_in_full(pixels, 100, 100)
    kinds = {kind for view in views for kind, _, _ in inspect(view, 100, 100).flags}
    assert kinds == {"blur", "overexposed", "underexposed", "grayscale"}  # every pixel flag was compared
    assert colour_below(np.zeros((4, 4), np.uint8), 2.0) == 0.0 and colour_below(np.zeros((4, 4)), 0.0) is None


def _jpeg(image: Image.Image, quality: int) -> bytes:
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality)
    return out.getvalue()


def plain_sharpness(grey: np.ndarray) -> float:
    """The Laplacian's variance as first written: 2-D slices of the float32 levels."""
    if grey.shape[0] < 3 or grey.shape[1] < 3:
        return 0.0
    lap = grey[:-2, 1:-1] + grey[2:, 1:-1]
    lap += grey[1:-1, :-2]
    lap += grey[1:-1, 2:]
    lap -= 4 * grey[1:-1, 1:-1]
    lap = lap.ravel()
    mean = float(lap.sum()) / lap.size
    return float(np.dot(lap, lap)) / lap.size - mean * mean


def test_the_measures_read_from_raw_bytes_are_the_plain_ones():
    """sharpness on whole rows, pixels_of and the signature's thumbnail read through it give exactly what the
    plain forms give (2-D slices, np.asarray), on random levels of every view size and on decoded photos."""
    from shard_utils.quality.flags import sharpness, view_of
    from shard_utils.quality.signature import SIDE, _low_dct, pixels_of, signature_of_grey

    rng = np.random.default_rng(5)
    pictures = [Image.fromarray(rng.integers(0, 256, (int(rng.integers(1, 129)), int(rng.integers(1, 129)), 3),
                                             dtype=np.uint8), "RGB") for _ in range(150)]
    pictures += [view_of(Image.open(io.BytesIO(_jpeg(scene(seed, (400, 300)), 90)))) for seed in range(30)]
    pictures += [Image.fromarray(rng.integers(0, 256, (7, 5, 4), dtype=np.uint8), "RGBA")]
    m = _low_dct()
    for picture in pictures:
        luma = picture.convert("L")
        for image in (picture, luma):
            assert np.array_equal(pixels_of(image), np.asarray(image)) and pixels_of(image).dtype == np.uint8
        levels = np.asarray(luma, dtype=np.float32)
        assert sharpness(levels) == plain_sharpness(levels)
        thumb = np.asarray(luma.resize((SIDE, SIDE), Image.Resampling.BOX), dtype=np.float32)
        low = (m @ thumb @ m.T).ravel()
        bits = int.from_bytes(np.packbits(low > np.median(low)).tobytes(), "big")
        assert signature_of_grey(luma) == bits
