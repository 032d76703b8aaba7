"""Flags on one image: very small, extreme aspect ratio, blurred, over- or under-exposed, grey in a colour set.

Pixel flags are measured on the image's *view*: the decoded picture averaged down to fit VIEW_SIDE pixels (smaller
ones as they are), so a measure means about the same for any source size. Size flags use the source's own dimensions.
Each flag is (kind, measured value, threshold); the thresholds are THRESHOLDS' (docs/quality.md states them).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from shard_utils.quality import findings
from shard_utils.quality.signature import grey, pixels_of, signature_of_grey

__all__ = [
    "VIEW_SIDE", "SAMPLED_ROWS", "Flag", "Thresholds", "THRESHOLDS", "view_of", "sharpness", "colourfulness",
    "colour_below", "size_flags",
    "pixel_flags", "Inspection", "inspect", "flag_findings"
]

VIEW_SIDE = 128  # the longer side of the view the pixel flags and the signature are measured on
SAMPLED_ROWS = 8  # colour_below sums every 8th row first

Flag = tuple[str, float, float]  # (kind, value, threshold)


@dataclass(frozen=True)
class Thresholds:
    """Where each flag starts."""

    min_side: int = 64  # small: the shorter side below this many pixels
    max_aspect: float = 3.0  # aspect: longer side over shorter side above this
    min_sharpness: float = 30.0  # blur: variance of the Laplacian of the view's grey levels below this
    clipped_share: float = 0.5  # over/under-exposed: more than this share of the view's pixels clipped
    bright: int = 250  # a pixel at or above this grey level is clipped white
    dark: int = 5  # a pixel at or below this grey level is clipped black
    max_colour: float = 2.0  # grayscale: mean spread between a pixel's R, G and B below this


THRESHOLDS = Thresholds()


def view_of(image: Image.Image) -> Image.Image:
    """The decoded picture in RGB, averaged down by the smallest whole factor that fits it in VIEW_SIDE (its longer
    side then between VIEW_SIDE / 2 and VIEW_SIDE); smaller pictures as they are."""
    image = image if image.mode == "RGB" else image.convert("RGB")
    factor = -(-max(image.size) // VIEW_SIDE)
    return image.reduce(factor) if factor > 1 else image  # a whole factor: three times cheaper than resize()


def sharpness(grey: np.ndarray) -> float:
    """Variance of the 4-neighbour Laplacian of float32 grey levels (0 for a picture under 3x3): low is blurred.
    Summed in place, in the order of the plain expression, so the value is the same; on whole rows of the flat
    levels (numpy adds contiguous runs faster than 2-D slices), each row's two edge values then dropped."""
    height, width = grey.shape
    if height < 3 or width < 3:
        return 0.0
    flat, inner = grey.ravel(), (height - 2) * width
    lap = flat[:inner] + flat[2 * width:]  # above + below
    lap += flat[width - 1:width - 1 + inner]  # left (a row's first value wraps: dropped below)
    lap += flat[width + 1:width + 1 + inner]  # right
    lap -= 4 * flat[width:width + inner]
    lap = lap.reshape(height - 2, width)[:, 1:-1].ravel()
    mean = float(lap.sum()) / lap.size
    return float(np.dot(lap, lap)) / lap.size - mean * mean


def colourfulness(pixels: np.ndarray) -> float:
    """Mean spread between the largest and smallest of a pixel's R, G and B of uint8 pixels (0 for grey ones),
    summed exactly in integers."""
    if pixels.ndim == 2 or pixels.shape[2] < 3:
        return 0.0
    return _spread_sum(pixels) / (pixels.shape[0] * pixels.shape[1])


def colour_below(pixels: np.ndarray, limit: float, rows: int = SAMPLED_ROWS) -> float | None:
    """colourfulness(pixels) when it is below `limit`, else None. Every `rows`-th row is summed first: a spread is
    never negative, so when those rows alone reach `limit` times the pixel count the whole cannot be below it, and
    the other rows are never read (a colour photo's are not)."""
    if pixels.ndim == 2 or pixels.shape[2] < 3:
        return 0.0 if limit > 0 else None
    total = limit * pixels.shape[0] * pixels.shape[1]
    if rows > 1 and pixels.shape[0] >= rows and _spread_sum(pixels[::rows]) >= total:
        return None
    colour = colourfulness(pixels)
    return colour if colour < limit else None


def _spread_sum(pixels: np.ndarray) -> int:
    """The sum over the pixels of their largest less their smallest of R, G and B. The bands are copied apart
    first: numpy compares contiguous rows about twice as fast as every third byte."""
    red, green, blue = pixels[:, :, :3].reshape(-1, 3).T.copy()
    spread = np.maximum(red, green)
    np.maximum(spread, blue, out=spread)
    low = np.minimum(red, green)
    np.minimum(low, blue, out=low)
    spread -= low  # never below 0: the largest less the smallest
    return int(spread.sum(dtype=np.int64))


def size_flags(height: int, width: int, t: Thresholds = THRESHOLDS) -> list[Flag]:
    """`small` and `aspect`, from the source's dimensions alone (no pixels needed)."""
    out: list[Flag] = []
    short, long = min(height, width), max(height, width)
    if short < t.min_side:
        out.append((findings.SMALL, float(short), float(t.min_side)))
    if short and long / short > t.max_aspect:
        out.append((findings.ASPECT, round(long / short, 3), t.max_aspect))
    return out


def pixel_flags(grey: np.ndarray, colour: float | None, t: Thresholds = THRESHOLDS) -> list[Flag]:
    """`blur`, `overexposed`, `underexposed` and `grayscale`, from the view's grey levels (float32) and its colour
    spread (colourfulness; None: known to be at least t.max_colour)."""
    out: list[Flag] = []
    sharp = sharpness(grey)
    if sharp < t.min_sharpness:
        out.append((findings.BLUR, round(sharp, 3), t.min_sharpness))
    bright = int(np.count_nonzero(grey >= t.bright)) / grey.size
    dark = int(np.count_nonzero(grey <= t.dark)) / grey.size
    if bright > t.clipped_share:
        out.append((findings.OVEREXPOSED, round(bright, 3), t.clipped_share))
    if dark > t.clipped_share:
        out.append((findings.UNDEREXPOSED, round(dark, 3), t.clipped_share))
    if colour is not None and colour < t.max_colour:
        out.append((findings.GRAYSCALE, round(colour, 3), t.max_colour))
    return out


@dataclass(frozen=True)
class Inspection:
    """What the quality checks learn of one decoded image: its signature (None when no pixels were decoded) and
    its flags."""

    signature: int | None
    flags: tuple[Flag, ...]


def inspect(view: Image.Image | np.ndarray | None, height: int, width: int,
            t: Thresholds = THRESHOLDS) -> Inspection:
    """The signature and every flag of an image: `view` from view_of, or its uint8 pixels (None: no pixels, only
    the size flags), `height` and `width` the source's."""
    if view is None:
        return Inspection(None, tuple(size_flags(height, width, t)))
    luma = view.convert("L") if isinstance(view, Image.Image) else grey(view)
    pixels = pixels_of(view) if isinstance(view, Image.Image) else view
    flags = pixel_flags(pixels_of(luma).astype(np.float32), colour_below(pixels, t.max_colour), t)
    return Inspection(signature_of_grey(luma), tuple(size_flags(height, width, t) + flags))


def flag_findings(inspection: Inspection, source: str, split: str) -> list[dict]:
    """An image's flags as findings for quality.jsonl."""
    return [findings.finding(kind, [source], [split], value=value, threshold=threshold)
            for kind, value, threshold in inspection.flags]
