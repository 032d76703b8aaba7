"""Near-duplicate signatures: recall and precision on transformed copies, and what they cost a build.

Photo-like originals (a sky-and-ground gradient, a dozen shapes, texture and sensor noise, each different) are
copied by this script with one transformation each: resized 50-200 %, re-compressed at JPEG quality 30-95,
cropped by up to 10 %, brightness/colour shifted a little, mirrored. A pair is a near-duplicate when the
signatures of its two images differ in at most the threshold's bits. For each transformation, recall is the share
of (original, copy) pairs found; precision is the share of the pairs found among the originals and those copies
that are true. Side by side: tpu-shards' signature at NEAR_DISTANCE, imagehash's pHash at its README's cutoff
(distance < 5) and at the same threshold as ours.

Then the cost: the CPU of the same small build (`beam_jobs.build`, one process) with the quality checks (signature
and flags per image) and without.

    python benchmarks/bench_near_dups.py                      # 300 originals, 2 x 2 builds of 600 images
    python benchmarks/bench_near_dups.py --originals 20 --build-images 0   # a smoke run
"""
from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image, ImageDraw, ImageEnhance, ImageFilter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from shard_utils.quality.signature import NEAR_DISTANCE, signature  # noqa: E402

IMAGEHASH_CUTOFF = 4  # imagehash's README: `hash0 - hash1 < cutoff` with cutoff = 5


def photo(seed: int) -> Image.Image:
    """A photo-like picture distinct per seed: a two-tone gradient, shapes in random colours, texture, noise."""
    rng = np.random.default_rng([42, seed])
    w, h = int(rng.integers(320, 640)), int(rng.integers(240, 480))
    horizon = rng.uniform(0.3, 0.7) * h
    top, bottom = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    rows = np.clip((np.arange(h)[:, None] - horizon) / (0.2 * h) + 0.5, 0, 1)
    base = (top * (1 - rows) + bottom * rows)[:, None, :] * np.ones((1, w, 1))
    image = Image.fromarray(base.astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(6, 16))):
        x, y = rng.uniform(-0.1, 1.0) * w, rng.uniform(-0.1, 1.0) * h
        sx, sy = rng.uniform(0.05, 0.4) * w, rng.uniform(0.05, 0.4) * h
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        if rng.random() < 0.5:
            draw.ellipse([x, y, x + sx, y + sy], fill=colour)
        else:
            points = [(x + rng.uniform(0, sx), y + rng.uniform(0, sy)) for _ in range(int(rng.integers(3, 6)))]
            draw.polygon(points, fill=colour)
    image = image.filter(ImageFilter.GaussianBlur(rng.uniform(0.5, 2.0)))
    texture = rng.standard_normal((h // 8 + 1, w // 8 + 1)).astype(np.float32)
    texture = np.asarray(Image.fromarray(texture, "F").resize((w, h), Image.Resampling.BICUBIC))
    noise = rng.standard_normal((h, w, 1)).astype(np.float32) * 4
    pixels = np.asarray(image, dtype=np.float32) + (texture[:, :, None] * 10 + noise)
    return Image.fromarray(pixels.clip(0, 255).astype(np.uint8), "RGB")


def jpeg(image: Image.Image, quality: int = 95) -> Image.Image:
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality)
    return Image.open(io.BytesIO(out.getvalue())).convert("RGB")


def resized(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    scale = rng.uniform(0.5, 2.0)
    return jpeg(image.resize((max(8, round(image.width * scale)), max(8, round(image.height * scale))),
                             Image.Resampling.BICUBIC))


def recompressed(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    return jpeg(image, int(rng.integers(30, 96)))


def cropped(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    """Up to 10 % of the width and of the height cut, shared at random between the two sides."""
    cut_w, cut_h = rng.uniform(0, 0.1) * image.width, rng.uniform(0, 0.1) * image.height
    left, top = rng.uniform(0, 1) * cut_w, rng.uniform(0, 1) * cut_h
    return jpeg(image.crop((round(left), round(top), round(image.width - cut_w + left),
                            round(image.height - cut_h + top))))


def shifted(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    """Brightness and saturation within 15 %, each channel's gain within 5 %."""
    image = ImageEnhance.Brightness(image).enhance(rng.uniform(0.85, 1.15))
    image = ImageEnhance.Color(image).enhance(rng.uniform(0.85, 1.15))
    gains = rng.uniform(0.95, 1.05, 3)
    return jpeg(Image.fromarray((np.asarray(image) * gains).clip(0, 255).astype(np.uint8), "RGB"))


def mirrored(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    return jpeg(image.transpose(Image.Transpose.FLIP_LEFT_RIGHT))


TRANSFORMS: dict[str, Callable[[Image.Image, np.random.Generator], Image.Image]] = {
    "resize 50-200 %": resized, "JPEG quality 30-95": recompressed, "crop up to 10 %": cropped,
    "brightness/colour": shifted, "mirror (not a target)": mirrored}


def ours(image: Image.Image) -> int:
    return signature(np.asarray(image))


def imagehash_phash(image: Image.Image) -> int:
    import imagehash
    return int(str(imagehash.phash(image)), 16)


def distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamming distances between every signature of `a` and every one of `b` (uint64 arrays)."""
    x = np.bitwise_xor(a[:, None], b[None, :])
    return np.unpackbits(x.view(np.uint8).reshape(*x.shape, 8), axis=-1).sum(-1)


def scores(originals: np.ndarray, copies: np.ndarray, threshold: int) -> tuple[float, float]:
    """Recall of (original i, copy i) pairs; precision of all pairs found among originals and copies."""
    n = len(originals)
    both = np.concatenate([originals, copies])
    found = distances(both, both) <= threshold
    np.fill_diagonal(found, False)
    truth = np.zeros_like(found)
    truth[np.arange(n), np.arange(n) + n] = truth[np.arange(n) + n, np.arange(n)] = True
    true_found = int((found & truth).sum()) // 2
    return true_found / n, (true_found / (int(found.sum()) // 2) if found.any() else 1.0)


def quality_table(count: int) -> list[str]:
    originals = [photo(i) for i in range(count)]
    methods = {f"tpu-shards (<= {NEAR_DISTANCE})": (ours, NEAR_DISTANCE),
               f"imagehash pHash (<= {IMAGEHASH_CUTOFF})": (imagehash_phash, IMAGEHASH_CUTOFF),
               f"imagehash pHash (<= {NEAR_DISTANCE})": (imagehash_phash, NEAR_DISTANCE)}
    signed = {name: np.array([fn(im) for im in originals], dtype=np.uint64) for name, (fn, _) in methods.items()}
    rows = ["| transformation | " + " | ".join(f"{name} recall / precision" for name in methods) + " |",
            "|---|" + "---|" * len(methods)]
    for t, (label, transform) in enumerate(TRANSFORMS.items()):
        rng = np.random.default_rng([7, t])
        copies = [transform(im, rng) for im in originals]
        cells = []
        for name, (fn, threshold) in methods.items():
            recall, precision = scores(signed[name], np.array([fn(c) for c in copies], dtype=np.uint64), threshold)
            cells.append(f"{recall:.1%} / {precision:.1%}")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return rows


def speed(count: int = 50) -> list[str]:
    images = [np.asarray(photo(i)) for i in range(count)]
    rows = []
    for name, fn in (("tpu-shards", lambda a: signature(a)), ("imagehash pHash", lambda a: imagehash_phash(
            Image.fromarray(a)))):
        start = time.process_time()
        for a in images:
            fn(a)
        rows.append(f"{name}: {(time.process_time() - start) / count * 1e3:.2f} ms CPU per ~480x360 image")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--originals", type=int, default=300)
    args = parser.parse_args(argv)
    print("\n".join(quality_table(args.originals)))
    print("\n".join(speed()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
