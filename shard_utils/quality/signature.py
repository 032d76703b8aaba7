"""A 64-bit perceptual signature (a DCT hash, as pHash) of decoded pixels, and the Hamming distance between two.

Two pictures whose signatures differ in at most NEAR_DISTANCE bits are near-duplicates: the same picture
resized, re-compressed, slightly cropped or with its colours shifted a little.
"""
from __future__ import annotations

import functools

import numpy as np

SIDE = 32  # the grey thumbnail the DCT is taken of
BITS_SIDE = 8  # the lowest 8x8 frequencies make the 64 bits
NEAR_DISTANCE = 10  # at most this many differing bits: a near-duplicate (docs/quality.md measures it)
HEX_DIGITS = 16
LUMA = np.array([0.299, 0.587, 0.114], np.float32)  # ITU-R 601-2, as Pillow's "L"


@functools.cache
def _dct_matrix(n: int) -> np.ndarray:
    """The orthonormal DCT-II matrix: `m @ x` is the DCT of the column `x`."""
    k, i = np.mgrid[0:n, 0:n].astype(np.float64)
    m = np.cos(np.pi * (2 * i + 1) * k / (2 * n)) * np.sqrt(2 / n)
    m[0] /= np.sqrt(2)
    return m


def _box_matrix(n: int) -> np.ndarray:
    """The SIDE x n matrix that averages n samples down (or up) to SIDE, with the pixels Pillow's BOX filter
    weighs: those whose centre lies in each output pixel's span."""
    scale = n / SIDE
    support = 0.5 * max(scale, 1.0)
    weights = np.zeros((SIDE, n))
    for out in range(SIDE):
        centre = (out + 0.5) * scale
        first, last = max(int(centre - support + 0.5), 0), min(int(centre + support + 0.5), n)
        taps = (np.arange(first, last) - centre + 0.5) / max(scale, 1.0)
        weights[out, first:last] = (taps >= -0.5) & (taps < 0.5)
    return weights / weights.sum(axis=1, keepdims=True)


@functools.lru_cache(maxsize=1024)
def _low_dct(n: int) -> np.ndarray:
    """BITS_SIDE x n: the box average of n samples to SIDE, then the lowest BITS_SIDE frequencies of its DCT."""
    return (_dct_matrix(SIDE)[:BITS_SIDE] @ _box_matrix(n)).astype(np.float32)


def luma(pixels: np.ndarray) -> np.ndarray:
    """The grey levels (float32, unrounded ITU-R 601-2 luma) of uint8 pixels: HxW grey, HxWx1, HxWx3 RGB or
    HxWx4 RGBA (alpha ignored)."""
    if pixels.dtype != np.uint8:
        raise ValueError(f"pixels must be uint8, not {pixels.dtype}")
    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[:, :, 0]
    if pixels.ndim == 2:
        return pixels.astype(np.float32)
    if pixels.ndim != 3 or pixels.shape[2] not in (3, 4):
        raise ValueError(f"pixels must be HxW or HxWx1/3/4, not {pixels.shape}")
    return pixels[:, :, :3] @ LUMA


def signature_of_luma(grey: np.ndarray) -> int:
    """The signature of HxW grey levels: averaged down to 32x32, bit set where one of the 8x8 lowest frequencies
    of its DCT is above their median (pHash's bits). The average and the DCT are one product of two small
    matrices (cached per size), with no thumbnail made."""
    low = (_low_dct(grey.shape[0]) @ grey @ _low_dct(grey.shape[1]).T).ravel()
    middle = np.sort(low)[31:33].sum() / 2  # the median of the 64 (np.median is slow on so few)
    return int.from_bytes(np.packbits(low > middle).tobytes(), "big")


def signature(pixels: np.ndarray) -> int:
    """The 64-bit DCT signature of decoded uint8 pixels (grey, RGB or RGBA)."""
    return signature_of_luma(luma(pixels))


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
