"""A 64-bit perceptual signature (a DCT hash, as pHash) of decoded pixels, and the Hamming distance between two.

Two pictures whose signatures differ in at most NEAR_DISTANCE bits are near-duplicates: the same picture
resized, re-compressed, slightly cropped or with its colours shifted a little.
"""
from __future__ import annotations

import functools

import numpy as np
from PIL import Image

__all__ = [
    "SIDE", "BITS_SIDE", "NEAR_DISTANCE", "HEX_DIGITS", "pixels_of", "grey", "signature_of_grey", "signature",
    "hamming", "to_hex", "from_hex"
]

SIDE = 32  # the grey thumbnail the DCT is taken of
BITS_SIDE = 8  # the lowest 8x8 frequencies make the 64 bits
NEAR_DISTANCE = 10  # at most this many differing bits: a near-duplicate (docs/quality.md measures it)
HEX_DIGITS = 16


@functools.cache
def _low_dct() -> np.ndarray:
    """The lowest BITS_SIDE rows of the orthonormal SIDE-point DCT-II matrix: `m @ x` is the low end of the DCT
    of the column `x`."""
    k, i = np.mgrid[0:BITS_SIDE, 0:SIDE].astype(np.float64)
    m = np.cos(np.pi * (2 * i + 1) * k / (2 * SIDE)) * np.sqrt(2 / SIDE)
    m[0] /= np.sqrt(2)
    return m.astype(np.float32)


def pixels_of(image: Image.Image) -> np.ndarray:
    """np.asarray(image), read-only; an "L" or "RGB" picture's bytes made an array directly, which on pictures of a
    few thousand pixels costs two thirds of numpy's way through Pillow's array interface."""
    if image.mode not in ("L", "RGB"):
        return np.asarray(image)
    width, height = image.size
    shape = (height, width) if image.mode == "L" else (height, width, 3)
    return np.frombuffer(image.tobytes(), np.uint8).reshape(shape)


def grey(pixels: np.ndarray) -> Image.Image:
    """The luma (Pillow's "L": ITU-R 601-2) of uint8 pixels: HxW grey, HxWx3 RGB or HxWx4 RGBA (alpha ignored)."""
    if pixels.dtype != np.uint8:
        raise ValueError(f"pixels must be uint8, not {pixels.dtype}")
    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[:, :, 0]
    if pixels.ndim == 2:
        return Image.fromarray(pixels, "L")
    if pixels.ndim != 3 or pixels.shape[2] not in (3, 4):
        raise ValueError(f"pixels must be HxW or HxWx1/3/4, not {pixels.shape}")
    return Image.fromarray(np.ascontiguousarray(pixels[:, :, :3]), "RGB").convert("L")


def signature_of_grey(image: Image.Image) -> int:
    """The signature of a grey ("L") picture: averaged down to 32x32, bit set where one of the 8x8 lowest
    frequencies of its DCT is above their median (pHash's bits). Only those 8 rows and columns are computed."""
    m = _low_dct()
    thumb = pixels_of(image.resize((SIDE, SIDE), Image.Resampling.BOX)).astype(np.float32)
    low = (m @ thumb @ m.T).ravel()
    middle = np.sort(low)[31:33].sum() / 2  # the median of the 64 (np.median is slow on so few)
    return int.from_bytes(np.packbits(low > middle).tobytes(), "big")


def signature(pixels: np.ndarray) -> int:
    """The 64-bit DCT signature of decoded uint8 pixels (grey, RGB or RGBA)."""
    return signature_of_grey(grey(pixels))


def hamming(a: int, b: int) -> int:
    """How many of the 64 bits differ."""
    return (a ^ b).bit_count()


def to_hex(value: int) -> str:
    """The signature as the index stores it: 16 lower-case hex digits."""
    return f"{value:0{HEX_DIGITS}x}"


def from_hex(text: str) -> int:
    """The signature of a 16-hex-digit string (ValueError otherwise)."""
    if len(text) != HEX_DIGITS:
        raise ValueError(f"a signature is {HEX_DIGITS} hex digits, not {text!r}")
    return int(text, 16)
