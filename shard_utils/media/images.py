"""Image preparation: decode, orient, convert to 8-bit RGB, resize, encode as JPEG.

`prepare_image` is the one entry point. It raises `Rejected` with a reason category
for anything that is not a usable image, so the pipeline can account for it.
"""
from __future__ import annotations

import functools
import io
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from PIL import Image, UnidentifiedImageError

from shard_utils.errors import TpuShardsError
from shard_utils.format.image_size import ImageSize
from shard_utils.format.jpeg import (  # noqa: F401 - also named here
    MAX_SCANS,
    TooManyScans,
    jpeg_primary_end,
    plain_jpeg,
)
from shard_utils.format.jpeg_pixels import decoded_plain
from shard_utils.media.budget import DEFAULT_WORKER_MEMORY, OutOfMemory, decode_bytes, mib
from shard_utils.quality.flags import VIEW_SIDE, Inspection, inspect, view_of

__all__ = [
    "MAX_SCANS", "TooManyScans", "jpeg_primary_end", "FORMATS", "RESIZE_MODES", "VALIDATE_MODES", "DEFAULT_MAX_PIXELS",
    "DEFAULT_BACKGROUND", "HEIF_EXTRA_HINT", "Rejected", "ImageOptions", "PreparedImage", "prepare_image",
    "memory_needed", "memory_for", "to_rgb", "TILE_PIXELS", "fill_box", "fit_size", "REDUCING_GAP", "MAX_REDUCE",
    "resize"
]

# Formats we accept, by what Pillow detects in the bytes (not the file name). HEIF needs pillow-heif.
FORMATS = {"JPEG", "MPO", "PNG", "GIF", "WEBP", "BMP", "DIB", "TIFF", "HEIF", "AVIF"}
RESIZE_MODES = ("fit", "fill", "stretch")
VALIDATE_MODES = ("decode", "structure")
DEFAULT_MAX_PIXELS = 100_000_000
DEFAULT_BACKGROUND = (255, 255, 255)
# Written into rejected.jsonl, so the same wherever the build runs: both commands that work.
HEIF_EXTRA_HINT = ('HEIC/HEIF images need pillow-heif: pip install pillow-heif (in a tpu-shards checkout: '
                   'pip install -e ".[heif]")')
_ORIENT = {
    2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_SWAPS_SIDES = {5, 6, 7, 8}
# Where Image.getexif finds an orientation in a JPEG's or PNG's info: EXIF (a PNG's eXIf chunk), ImageMagick's raw
# profile text chunk, XMP (a PNG's iTXt keyword, and the key Pillow also files it under).
_ORIENTATION_KEYS = ("exif", "Raw profile type exif", "XML:com.adobe.xmp", "xmp")
_ALPHA_MODES = {"RGBA", "LA", "PA", "RGBa", "La"}
# ISO-BMFF brands of HEVC-coded HEIF (the ones pillow-heif opens); mif1/msf1 are generic image brands
# that AVIF files may carry too.
_HEVC_BRANDS = {b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"hevm", b"hevs"}
_GENERIC_HEIF_BRANDS = {b"mif1", b"msf1"}
_AVIF_BRANDS = {b"avif", b"avis"}


class Rejected(TpuShardsError):
    """An input that cannot become a record; `reason` is a short category for the manifest."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class ImageOptions:
    """How images are turned into JPEG bytes."""

    size: ImageSize | None = None  # checked when --image-size is parsed
    resize: str = "fill"
    quality: int = 95
    max_pixels: int = DEFAULT_MAX_PIXELS
    background: tuple[int, int, int] = DEFAULT_BACKGROUND
    validate: str = "decode"  # how pass-through JPEGs are checked: full decode, or marker structure only
    inspect: bool = True  # the quality checks: a signature and flags from the pixels decoded (shard_utils.quality)
    memory: int = DEFAULT_WORKER_MEMORY  # bytes a worker may spend on one image (shard_utils.media.budget)


@dataclass(frozen=True)
class PreparedImage:
    """JPEG bytes and their geometry; `passed_through` when the source bytes were kept as they were.

    `trailer_bytes` counts bytes after the JPEG's end-of-image marker (a motion photo's video, maker
    data) that a pass-through dropped; 0 for re-encoded images and JPEGs without a trailer.
    """

    encoded: bytes
    height: int
    width: int
    channels: int
    passed_through: bool
    trailer_bytes: int = 0
    inspection: Inspection | None = None  # with ImageOptions.inspect; its signature is None when nothing was decoded


def prepare_image(data: bytes, options: ImageOptions) -> PreparedImage:
    """Turn source bytes into a JPEG record image, keeping the original bytes when nothing would change."""
    if not data:
        raise Rejected("empty", "file is empty (0 bytes)")
    if options.size is None:
        plain = _plain_pass_through(data, options)
        if plain is not None:
            return plain
    with warnings.catch_warnings():  # a bad file is a rejection with its reason, never a warning on stderr
        warnings.simplefilter("ignore")
        image = _open(data, options.max_pixels)
        try:
            orientation = None if image.format == "PNG" else _orientation(image)  # a PNG's: once decoded
            if image.format == "JPEG" and image.mode in ("RGB", "L") and orientation is None and options.size is None:
                return _pass_through(data, image, options.validate, options.inspect)
            if image.format in ("JPEG", "MPO"):
                _refuse_scan_bomb(data)
            return _reencode(image, orientation, options)
        except MemoryError:
            need = mib(memory_needed(image, options.size))
            raise OutOfMemory(f"the system refused memory for a {image.width}x{image.height} {image.mode} image "
                              f"(it needs about {need})") from None


def memory_needed(image: Image.Image, size: tuple[int, int] | None) -> int:
    """The bytes decoding, converting and encoding an opened image needs at its peak (to `size`, if given)."""
    return decode_bytes(image.mode, image.width, image.height, size[0] * size[1] if size else None)


def memory_for(data: bytes, options: ImageOptions) -> int | None:
    """memory_needed for an image's bytes, from its header alone; None for bytes that are no usable image."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return memory_needed(_open(data, options.max_pixels), options.size)
    except Rejected:
        return None


def _within_budget(image: Image.Image, options: ImageOptions) -> None:
    """Refuse, before its pixels are decoded, an image that needs more memory than a worker may use."""
    need = memory_needed(image, options.size)
    if need > options.memory:
        raise Rejected("too_large", f"a {image.width}x{image.height} {image.mode} image needs about {mib(need)} "
                                    f"to decode and convert, more than the {mib(options.memory)} a worker may use "
                                    "(--worker-memory-mb)")


def _pass_through(data: bytes, image: Image.Image, validate: str, inspecting: bool) -> PreparedImage:
    """The source JPEG up to its end-of-image marker, checked; whatever follows the marker is dropped. The quality
    checks look at the pixels the check decoded; `structure` decodes none, and only the size flags are known."""
    try:
        end = jpeg_primary_end(data)
    except TooManyScans as exc:
        raise _too_complex(exc) from None
    except ValueError as exc:
        raise Rejected("corrupt", f"JPEG {exc}") from None
    encoded, (width, height) = data[:end], image.size
    view = None
    if validate == "decode":  # at 1/8 scale (or the quality view's): all the entropy-coded data is still read
        checked = image if end == len(data) else _open(encoded, max_pixels=width * height)
        _load(checked, draft=_check_draft(width, height, inspecting))
        view = view_of(checked) if inspecting else None
    inspection = inspect(view, height, width) if inspecting else None
    return PreparedImage(encoded, height, width, 1 if image.mode == "L" else 3, True, len(data) - end, inspection)


def _plain_pass_through(data: bytes, options: ImageOptions) -> PreparedImage | None:
    """What _pass_through makes of a JPEG with a plain header (shard_utils.format.jpeg.plain_jpeg), known from one
    walk of its markers without Pillow's parse of its header (about a third of a structural check); under `decode`
    its pixels come from Pillow's JPEG decoder called as Image.open's load would call it. None for any other
    bytes, and for pixels that decoder does not finish: those take the path every image takes, which words why."""
    found = plain_jpeg(data)
    if found is None or found.width * found.height > options.max_pixels:
        return None
    _allow_pixels(options.max_pixels)  # as _open does: a later Image.open of the record here sees the same limit
    view = None
    if options.validate == "decode":
        checked = decoded_plain(data[:found.end], found, _check_draft(found.width, found.height, options.inspect))
        if checked is None:
            return None
        view = view_of(checked) if options.inspect else None
    inspection = inspect(view, found.height, found.width) if options.inspect else None
    return PreparedImage(data[:found.end], found.height, found.width, found.components, True, len(data) - found.end,
                         inspection)


def _check_draft(width: int, height: int, inspecting: bool) -> tuple[int, int]:
    """The size a pass-through check decodes at least: 1/8 scale, or enough for the quality view (at least half
    VIEW_SIDE on the longer side, as the view of any larger picture is)."""
    scale = min(1.0, VIEW_SIDE / 2 / max(width, height)) if inspecting else 0.0
    return max(1, width // 8, math.ceil(width * scale)), max(1, height // 8, math.ceil(height * scale))


def _refuse_scan_bomb(data: bytes) -> None:
    """Reject, before any decoding, a JPEG with more scans than MAX_SCANS; other damage is the decoder's to judge
    (it may still read a truncated file)."""
    try:
        jpeg_primary_end(data)
    except TooManyScans as exc:
        raise _too_complex(exc) from None
    except ValueError:
        pass


def _too_complex(exc: TooManyScans) -> Rejected:
    return Rejected("too_complex", f"JPEG {exc}; decoding it would pass over the whole picture once per scan")


def _reencode(image: Image.Image, orientation: int | None, options: ImageOptions) -> PreparedImage:
    """Decode, convert to RGB, resize (in stored orientation, then orient the small result), encode."""
    draft = None
    if options.size is not None and image.format in ("JPEG", "MPO"):
        draft = _draft_size(image.size, _stored(options.size, orientation), options.resize)
    source_width, source_height = image.size  # the size flags are the source's, before any draft or resize
    content = _load(image, draft=draft, before=lambda drafted: _within_budget(drafted, options))
    if image.format == "PNG":  # Pillow finds an eXIf chunk after the pixels only by decoding them: read it now
        orientation = _orientation(image)
    image = to_rgb(image, options.background)
    if options.size is not None:
        image = resize(image, _stored(options.size, orientation), options.resize, box=content)
    if orientation is not None:
        image = image.transpose(_ORIENT[orientation])
    # the checks first, while the picture is still in the CPU's caches; the encoder reads it after them
    inspection = inspect(view_of(image), source_height, source_width) if options.inspect else None
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=options.quality)
    return PreparedImage(out.getvalue(), image.height, image.width, 3, False, inspection=inspection)


def _stored(size: tuple[int, int], orientation: int | None) -> tuple[int, int]:
    """A (height, width) as the picture is stored: the displayed height is the stored width where the
    orientation turns it a quarter."""
    return (size[1], size[0]) if orientation in _SWAPS_SIDES else size


def _open(data: bytes, max_pixels: int) -> Image.Image:
    """Identify the image from its header only; refuse unknown formats and oversized images before decoding."""
    brands = _isobmff_brands(data)
    if _is_heif(brands):
        _register_heif()
    _allow_pixels(max_pixels)
    try:
        image = Image.open(io.BytesIO(data))  # warnings are off (prepare_image): over --max-pixels is refused below
    except Image.DecompressionBombError as exc:
        raise Rejected("too_large", f"image is too large to decode safely: {exc}") from None
    except UnidentifiedImageError:
        raise _unidentified(brands) from None
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


def _allow_pixels(max_pixels: int) -> None:
    """Raise Pillow's own limit (it refuses over twice MAX_IMAGE_PIXELS) to `max_pixels`, which is checked here
    instead, so that --max-pixels holds above it; the memory budget bounds it (shard_utils.media.budget)."""
    if Image.MAX_IMAGE_PIXELS is not None and Image.MAX_IMAGE_PIXELS < max_pixels:
        Image.MAX_IMAGE_PIXELS = max_pixels


def _unidentified(brands: set[bytes]) -> Rejected:
    """Why Pillow could not identify the bytes: a HEIF without pillow-heif, a broken HEIF/AVIF, or no image."""
    heif = _is_heif(brands)
    if heif and not _register_heif():
        return Rejected("unsupported_format", HEIF_EXTRA_HINT)
    if heif or brands & _AVIF_BRANDS:
        return Rejected("corrupt", f"unreadable {'HEIF' if heif else 'AVIF'} image")
    return Rejected("not_image", "not a recognised image (JPEG, PNG, GIF, WebP, BMP, TIFF, HEIC or AVIF)")


def _isobmff_brands(data: bytes) -> set[bytes]:
    """The major and compatible brands of an ISO-BMFF file's leading `ftyp` box (HEIF, AVIF), else empty."""
    if data[4:8] != b"ftyp" or len(data) < 12:
        return set()
    box_end = min(int.from_bytes(data[:4], "big"), len(data), 4096)
    return {data[8:12]} | {data[i:i + 4] for i in range(16, box_end - 3, 4)}


def _is_heif(brands: set[bytes]) -> bool:
    """Whether ISO-BMFF brands announce an HEVC-coded HEIF (HEIC), which pillow-heif opens, not an AVIF."""
    return bool(brands & _HEVC_BRANDS) or (bool(brands & _GENERIC_HEIF_BRANDS) and not brands & _AVIF_BRANDS)


@functools.cache
def _register_heif() -> bool:
    """Register pillow-heif's HEIF opener with Pillow the first time a HEIF arrives; False when it is absent."""
    try:
        import pillow_heif
    except ImportError:
        return False
    pillow_heif.register_heif_opener()
    return True


def _load(image: Image.Image, draft: tuple[int, int] | None,
          before: Callable[[Image.Image], None] | None = None) -> tuple[float, float, float, float] | None:
    """Decode the pixels (first frame), turning any decoder failure into a rejection (warnings are off: see
    prepare_image); `before` sees the image once drafted, before its pixels are decoded.

    With `draft` (JPEG only) the decoder may scale down by 2, 4 or 8 to at least that size; the return
    value is then the box of the decoded image that holds the whole picture (its last pixels may be partial).
    """
    try:
        drafted = image.draft(image.mode, draft) if draft is not None else None
    except Exception as exc:
        raise Rejected("corrupt", f"cannot decode {image.format} data: {exc}") from None
    if before is not None:
        before(image)
    try:
        image.load()
    except Image.DecompressionBombError as exc:
        raise Rejected("too_large", f"image is too large to decode safely: {exc}") from None
    except MemoryError:
        raise
    except Exception as exc:
        raise Rejected("corrupt", f"cannot decode {image.format} data: {exc}") from None
    return drafted[1] if drafted else None


def _orientation(image: Image.Image) -> int | None:
    """The EXIF orientation that changes pixels (2-8), or None; unreadable or absurd EXIF counts as none.

    pillow-heif applies a HEIF's rotation while decoding and resets the EXIF tag to 1; Pillow's AVIF
    reader reports the container's rotation as the EXIF tag, so it is applied here, once. A JPEG or a decoded PNG
    with none of the segments or chunks where Pillow looks for it has none, known without building an empty Exif
    (~15 us, several times that with the caches as a decode leaves them).
    """
    if image.format in ("JPEG", "PNG") and not any(key in image.info for key in _ORIENTATION_KEYS):
        return None
    try:
        value = image.getexif().get(0x0112)
    except Exception:
        return None
    return value if isinstance(value, int) and value in _ORIENT else None


def _draft_size(size: tuple[int, int], target: tuple[int, int], mode: str) -> tuple[int, int]:
    """The (width, height) a JPEG draft must keep at least so that resizing `size` (stored orientation)
    to `target` (height, width) needs no upsampling: Pillow scales by 1/k only while k <= side // request."""
    width, height = size
    target_h, target_w = target
    if mode == "stretch":
        return target_w, target_h
    pick = max if mode == "fill" else min
    scale = pick(Fraction(target_w, width), Fraction(target_h, height))
    return math.ceil(width * scale), math.ceil(height * scale)


def to_rgb(image: Image.Image, background: tuple[int, int, int] = DEFAULT_BACKGROUND) -> Image.Image:
    """8-bit RGB from any mode: 16/32-bit scaled (not clipped), palette and alpha composited on `background`.

    Deep modes are scaled a band of rows at a time in integers, so no float copy of the picture is made."""
    if image.mode.startswith("I;16") or image.mode in ("I", "F"):
        image = _to_l(image)
    elif image.mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    elif image.mode == "1":
        image = image.convert("L")
    if image.mode in _ALPHA_MODES:
        image = _composited(image, background)
    return image if image.mode == "RGB" else image.convert("RGB")


TILE_PIXELS = 1 << 20  # pixels of a deep image scaled at once


def _to_l(image: Image.Image) -> Image.Image:
    """An 8-bit L image from a 16-bit, 32-bit integer or float one: integers v in 0..65535 become
    round(v / 257), floats round(v); both clipped to 0..255. Scaled in bands of rows (see to_rgb)."""
    width, height = image.size
    out = np.empty((height, width), np.uint8)
    rows = max(1, TILE_PIXELS // width)
    for top in range(0, height, rows):
        band = np.asarray(image.crop((0, top, width, min(height, top + rows))))
        if band.dtype.kind == "f":
            scaled = np.rint(np.clip(band, 0, 255))
        else:  # round(v / 257) == (v + 128) // 257 for integers: v / 257 is never halfway between two
            scaled = (np.clip(band, 0, 65535).astype(np.int32) + 128) // 257
        out[top:top + rows] = scaled
    return Image.fromarray(out, "L")


def _composited(image: Image.Image, background: tuple[int, int, int]) -> Image.Image:
    """An alpha image laid over an opaque background, as RGBA; each copy let go as soon as it is used."""
    rgba = image if image.mode == "RGBA" else image.convert("RGBA")
    base = Image.new("RGBA", rgba.size, (*background, 255))
    return Image.alpha_composite(base, rgba)


def fill_box(width: float, height: float, target: tuple[int, int]) -> tuple[float, float, float, float]:
    """The centred (left, top, right, bottom) region of a width x height picture with the aspect of
    `target` (height, width): what `fill` keeps. Exact arithmetic, so it never leaves the picture."""
    w, h = Fraction(width), Fraction(height)
    target_h, target_w = target
    if target_w * h >= target_h * w:  # the picture is taller than the target: keep its full width
        crop_w, crop_h = w, w * target_h / target_w
    else:
        crop_w, crop_h = h * target_w / target_h, h
    left, top = (w - crop_w) / 2, (h - crop_h) / 2
    # Correctly rounded conversions of values in [0, w] stay in [0, w]: w itself is exactly a float.
    return float(left), float(top), float(left + crop_w), float(top + crop_h)


def fit_size(width: float, height: float, target: tuple[int, int]) -> tuple[int, int]:
    """The (width, height) of a width x height picture scaled to fit inside `target` (height, width):
    one side equals the target's, the other is rounded to the nearest pixel (at least 1)."""
    w, h = Fraction(width), Fraction(height)
    target_h, target_w = target
    if target_w * h <= target_h * w:  # wider than the target: the width touches
        return target_w, max(1, round(h * target_w / w))
    return max(1, round(w * target_h / h)), target_h


REDUCING_GAP = 3.0  # Pillow reduces by whole factors first while the picture is over 3x the target
MAX_REDUCE = 64  # a larger single reduce() drifts a flat colour by a few levels: reduce in steps of at most this


def _reduce_in_steps(image: Image.Image, box: tuple[float, float, float, float], target_w: int,
                     target_h: int) -> tuple[Image.Image, tuple[float, float, float, float]]:
    """The image reduced, and the box moved with it, until what is left for resize() to reduce is at most
    MAX_REDUCE in each direction (Pillow's one-step reduce by factors in the thousands rounds off colour)."""
    left, top, right, bottom = box
    while True:
        fx = int((right - left) / target_w / REDUCING_GAP)
        fy = int((bottom - top) / target_h / REDUCING_GAP)
        if max(fx, fy) <= MAX_REDUCE:
            return image, (left, top, right, bottom)
        kx, ky = max(1, min(fx, MAX_REDUCE)), max(1, min(fy, MAX_REDUCE))
        image = image.reduce((kx, ky))
        left, top, right, bottom = left / kx, top / ky, right / kx, bottom / ky


def _resized(image: Image.Image, width: int, height: int, box: tuple[float, float, float, float]) -> Image.Image:
    image, box = _reduce_in_steps(image, box, width, height)
    return image.resize((width, height), Image.Resampling.BICUBIC, box=box, reducing_gap=REDUCING_GAP)


def resize(image: Image.Image, size: tuple[int, int], mode: str,
           box: tuple[float, float, float, float] | None = None) -> Image.Image:
    """Resize to (height, width): `stretch` exactly, `fill` cover then centre-crop, `fit` inside keeping aspect.

    `box` is the region of `image` that holds the picture (a JPEG draft's partial last pixels lie outside).
    """
    target_h, target_w = size
    left, top, right, bottom = box or (0, 0, *image.size)
    if mode == "stretch":
        return _resized(image, target_w, target_h, (left, top, right, bottom))
    if mode == "fit":
        return _resized(image, *fit_size(right - left, bottom - top, size), (left, top, right, bottom))
    if mode != "fill":
        raise ValueError(f"unknown resize mode {mode!r}; expected one of {', '.join(RESIZE_MODES)}")
    crop = fill_box(right - left, bottom - top, size)
    crop = (max(0.0, left + crop[0]), max(0.0, top + crop[1]),  # a no-op for boxes at (0, 0), as drafts are
            min(image.width, left + crop[2]), min(image.height, top + crop[3]))
    return _resized(image, target_w, target_h, crop)
