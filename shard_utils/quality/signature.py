"""A 64-bit perceptual signature (a DCT hash, as pHash) of decoded pixels, and the Hamming distance between two.

Two pictures whose signatures differ in at most NEAR_DISTANCE bits are near-duplicates: the same picture
resized, re-compressed, slightly cropped or with its colours shifted a little.
"""
from __future__ import annotations

import functools

import numpy as np
from PIL import Image

SIDE = 32  # the grey thumbnail the DCT is taken of
BITS_SIDE = 8  # the lowest 8x8 frequencies make the 64 bits
NEAR_DISTANCE = 10  # at most this many differing bits: a near-duplicate (docs/quality.md measures it)
HEX_DIGITS = 16
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)  # ITU-R 601-2, as Pillow's "L"


@functools.cache
def _dct_matrix(n: int) -> np.ndarray:
    """The orthonormal DCT-II matrix: `m @ x` is the DCT of the column `x`."""
    k, i = np.mgrid[0:n, 0:n].astype(np.float64)
    m = np.cos(np.pi * (2 * i + 1) * k / (2 * n)) * np.sqrt(2 / n)
    m[0] /= np.sqrt(2)
    return m.astype(np.float32)


def grey(pixels: np.ndarray) -> np.ndarray:
    """Luma (float32, 0-255) of uint8 pixels: HxW grey, HxWx3 RGB or HxWx4 RGBA (alpha ignored)."""
    if pixels.ndim == 2:
        return pixels.astype(np.float32)
    if pixels.ndim != 3 or pixels.shape[2] not in (1, 3, 4):
        raise ValueError(f"pixels must be HxW or HxWx1/3/4, not {pixels.shape}")
    if pixels.shape[2] == 1:
        return pixels[:, :, 0].astype(np.float32)
    return pixels[:, :, :3].astype(np.float32) @ _LUMA


def thumbnail(pixels: np.ndarray, side: int = SIDE) -> np.ndarray:
    """The grey picture averaged down (or stretched up) to side x side, float32."""
    image = Image.fromarray(np.clip(grey(pixels), 0, 255).astype(np.uint8), "L")
    return np.asarray(image.resize((side, side), Image.Resampling.BOX), dtype=np.float32)


def signature(pixels: np.ndarray) -> int:
    """The 64-bit DCT signature: bit set where a low frequency (DC left out) is above their median."""
    m = _dct_matrix(SIDE)
    low = (m @ thumbnail(pixels) @ m.T)[:BITS_SIDE, :BITS_SIDE].ravel()
    ac = low[1:]
    bits = np.concatenate([[0.0], ac]) > np.median(ac)  # the DC bit is always 0: brightness is not structure
    return int.from_bytes(np.packbits(bits).tobytes(), "big")


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
