"""Image preparation: decode, orient, convert to 8-bit RGB, resize, encode as JPEG.

`prepare_image` is the one entry point. It raises `Rejected` with a reason category
for anything that is not a usable image, so the pipeline can account for it.
"""
from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, UnidentifiedImageError

# Formats we accept, by what Pillow detects in the bytes (not the file name).
FORMATS = {"JPEG", "MPO", "PNG", "GIF", "WEBP", "BMP", "DIB", "TIFF"}
RESIZE_MODES = ("fit", "fill", "stretch")
VALIDATE_MODES = ("decode", "structure")
DEFAULT_MAX_PIXELS = 100_000_000
DEFAULT_BACKGROUND = (255, 255, 255)
_ORIENT = {
    2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_ALPHA_MODES = {"RGBA", "LA", "PA", "RGBa", "La"}


class Rejected(Exception):
    """An input that cannot become a record; `reason` is a short category for the manifest."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class ImageOptions:
    """How images are turned into JPEG bytes."""

    size: tuple[int, int] | None = None  # (height, width)
    resize: str = "fill"
    quality: int = 95
    max_pixels: int = DEFAULT_MAX_PIXELS
    background: tuple[int, int, int] = DEFAULT_BACKGROUND
    validate: str = "decode"  # how pass-through JPEGs are checked: full decode, or header + end marker


@dataclass(frozen=True)
class PreparedImage:
    """JPEG bytes and their geometry; `passed_through` when the source bytes were kept as they were."""

    encoded: bytes
    height: int
    width: int
    channels: int
    passed_through: bool


def prepare_image(data: bytes, options: ImageOptions) -> PreparedImage:
    """Turn source bytes into a JPEG record image, keeping the original bytes when nothing would change."""
    if not data:
        raise Rejected("empty", "file is empty (0 bytes)")
    image = _open(data, options.max_pixels)
    width, height = image.size
    orientation = _orientation(image)
    if image.format == "JPEG" and image.mode in ("RGB", "L") and orientation is None and options.size is None:
        _check_jpeg_end(data)
        if options.validate == "decode":  # at 1/8 scale: all the entropy-coded data is still read
            _load(image, draft=(max(1, width // 8), max(1, height // 8)))
        return PreparedImage(data, height, width, 1 if image.mode == "L" else 3, True)
    draft = None
    if options.size is not None and image.format in ("JPEG", "MPO"):
        draft = _draft_size(image.size, options.size, options.resize, orientation)
    _load(image, draft=draft)
    if orientation is not None:
        image = image.transpose(_ORIENT[orientation])
    image = to_rgb(image, options.background)
    if options.size is not None:
        image = resize(image, options.size, options.resize)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=options.quality)
    return PreparedImage(out.getvalue(), image.height, image.width, 3, False)


def _open(data: bytes, max_pixels: int) -> Image.Image:
    """Identify the image from its header only; refuse unknown formats and oversized images before decoding."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:
        raise Rejected("too_large", f"image is too large to decode safely: {exc}") from None
    except UnidentifiedImageError:
        raise Rejected("not_image", "not a recognised image (JPEG, PNG, GIF, WebP, BMP or TIFF)") from None
    except Exception as exc:  # Pillow raises many types for bad headers
        raise Rejected("corrupt", f"unreadable image header: {exc}") from None
    if image.format not in FORMATS:
        raise Rejected("unsupported_format", f"image format {image.format} is not supported")
    width, height = image.size
    if width < 1 or height < 1:
        raise Rejected("corrupt", f"image has no pixels ({width}x{height})")
    if width * height > max_pixels:
        raise Rejected("too_large", f"{width}x{height} = {width * height} pixels exceeds --max-pixels {max_pixels}")
    return image


def _load(image: Image.Image, draft: tuple[int, int] | None) -> None:
    """Decode the pixels (first frame), turning any decoder failure into a rejection."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if draft is not None:
                image.draft(image.mode, draft)
            image.load()
    except Image.DecompressionBombError as exc:
        raise Rejected("too_large", f"image is too large to decode safely: {exc}") from None
    except MemoryError:
        raise Rejected("too_large", "not enough memory to decode this image") from None
    except Exception as exc:
        raise Rejected("corrupt", f"cannot decode {image.format} data: {exc}") from None


def _check_jpeg_end(data: bytes) -> None:
    """The fast pass-through check: Pillow has parsed the header; the scan must end with an EOI marker."""
    end = data.rstrip(b"\x00")
    if not end.endswith(b"\xff\xd9"):
        raise Rejected("corrupt", "JPEG is truncated: no end-of-image marker after the scan data")


def _orientation(image: Image.Image) -> int | None:
    """The EXIF orientation that changes pixels (2-8), or None; unreadable or absurd EXIF counts as none."""
    try:
        value = image.getexif().get(0x0112)
    except Exception:
        return None
    return value if isinstance(value, int) and value in _ORIENT else None


def _draft_size(size: tuple[int, int], target: tuple[int, int], mode: str, orientation: int | None) -> tuple[int, int]:
    """The smallest source size (in stored orientation) that still resizes to the target without upsampling."""
    width, height = size
    target_h, target_w = target
    if orientation in (5, 6, 7, 8):
        target_h, target_w = target_w, target_h
    if mode == "stretch":
        return max(1, target_w), max(1, target_h)
    pick = max if mode == "fill" else min
    scale = pick(target_w / width, target_h / height)
    return max(1, int(width * scale)), max(1, int(height * scale))


def to_rgb(image: Image.Image, background: tuple[int, int, int] = DEFAULT_BACKGROUND) -> Image.Image:
    """8-bit RGB from any mode: 16/32-bit scaled (not clipped), palette and alpha composited on `background`."""
    if image.mode.startswith("I;16") or image.mode == "I":
        values = np.asarray(image).astype(np.float64)
        image = Image.fromarray(np.clip(np.rint(values / 257.0), 0, 255).astype(np.uint8), "L")
    elif image.mode == "F":
        values = np.asarray(image)
        image = Image.fromarray(np.clip(np.rint(values), 0, 255).astype(np.uint8), "L")
    elif image.mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    elif image.mode == "1":
        image = image.convert("L")
    if image.mode in _ALPHA_MODES:
        rgba = image.convert("RGBA")
        base = Image.new("RGBA", rgba.size, (*background, 255))
        image = Image.alpha_composite(base, rgba)
    return image if image.mode == "RGB" else image.convert("RGB")


def resize(image: Image.Image, size: tuple[int, int], mode: str) -> Image.Image:
    """Resize to (height, width): `stretch` exactly, `fill` cover then centre-crop, `fit` inside keeping aspect."""
    target_h, target_w = size
    width, height = image.size
    resample = Image.Resampling.BICUBIC
    if mode == "stretch":
        return image.resize((target_w, target_h), resample, reducing_gap=3.0)
    if mode == "fit":
        scale = min(target_w / width, target_h / height)
        new = (max(1, round(width * scale)), max(1, round(height * scale)))
        return image.resize(new, resample, reducing_gap=3.0)
    if mode != "fill":
        raise ValueError(f"unknown resize mode {mode!r}; expected one of {', '.join(RESIZE_MODES)}")
    scale = max(target_w / width, target_h / height)
    crop_w, crop_h = target_w / scale, target_h / scale
    left, top = (width - crop_w) / 2, (height - crop_h) / 2
    return image.resize((target_w, target_h), resample, box=(left, top, left + crop_w, top + crop_h), reducing_gap=3.0)
