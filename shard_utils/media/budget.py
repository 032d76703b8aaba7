"""The memory one worker may spend on one image, and what decoding and converting an image needs of it.

An image is judged from its header (mode and size) before its pixels are decoded: one that needs more than
the budget is rejected `too_large` with the figure, so a build's workers never ask the system for more than
`workers x budget` at once. The figures per pixel are the peaks measured for each mode (`docs/images.md`).
"""
from __future__ import annotations

from shard_utils.errors import TpuShardsError

__all__ = [
    "DEFAULT_WORKER_MEMORY", "OVERHEAD", "FULL_SIZE_OUT", "RESIZING", "TARGET_OUT", "CHEAPEST",
    "OutOfMemory", "decode_bytes", "largest_image", "mib"
]

DEFAULT_WORKER_MEMORY = 1 << 30  # bytes one worker may spend decoding, converting and encoding one image
OVERHEAD = 64 << 20  # the encoder's buffers and the record's framing around an image's pixels
# Bytes per pixel Pillow stores for a decoded image of each mode (the others take 4).
_STORED = {"1": 1, "L": 1, "P": 1, "I;16": 2, "I;16L": 2, "I;16B": 2, "I;16N": 2}
# Bytes per pixel of the copies made on the way to 8-bit RGB, at their peak (images.to_rgb).
_CONVERTED = {"RGB": 0, "1": 5, "L": 4, "I;16": 5, "I;16L": 5, "I;16B": 5, "I;16N": 5, "I": 5, "F": 5,
              "P": 12, "RGBA": 8, "LA": 12, "PA": 12, "RGBa": 12, "La": 12}
_OTHER_CONVERTED = 4  # CMYK, YCbCr, LAB, HSV: one RGB copy
FULL_SIZE_OUT = 5  # bytes per pixel when the picture keeps its size: an oriented copy, or the JPEG and its copies
RESIZING = 1  # bytes per source pixel of the reduced copies a resize makes
TARGET_OUT = 4 + FULL_SIZE_OUT  # bytes per pixel of a resized picture: the result, then as at full size
CHEAPEST = min(_STORED.get(m, 4) + c for m, c in _CONVERTED.items()) + RESIZING  # bytes per pixel, cheapest mode


class OutOfMemory(TpuShardsError):
    """The system refused memory that an image within the budget needed: a resource failure, never a rejection."""


def decode_bytes(mode: str, width: int, height: int, target_pixels: int | None) -> int:
    """The bytes a worker holds at its peak while decoding a width x height image of `mode`, converting it to
    8-bit RGB and encoding it, resized to `target_pixels` (None: at its own size)."""
    stored = _STORED.get(mode, 4) + _CONVERTED.get(mode, _OTHER_CONVERTED)
    if target_pixels is None:
        return width * height * (stored + FULL_SIZE_OUT) + OVERHEAD
    return width * height * (stored + RESIZING) + target_pixels * TARGET_OUT + OVERHEAD


def largest_image(budget: int) -> int:
    """The most pixels an image of the cheapest mode may have and still fit in `budget` bytes."""
    return max(0, (budget - OVERHEAD) // CHEAPEST)


def mib(n: int) -> str:
    """A byte count in MiB, rounded up: how the budget's messages give memory."""
    return f"{-(-n // (1 << 20))} MiB"
