"""Generate a small labelled image folder to try the job on: <output>/<label>/<n>.<ext>.

Each label is a shape drawn over noise; formats and sizes vary the way real folders do.
"""
from __future__ import annotations

import argparse
import os
import random

from PIL import Image, ImageDraw

LABELS = ("circle", "square", "triangle")
FORMATS = (("jpg", "JPEG"), ("jpg", "JPEG"), ("png", "PNG"), ("webp", "WEBP"))


def draw(label: str, size: tuple[int, int], rng: random.Random) -> Image.Image:
    """A shape of the label's kind on a random background."""
    w, h = size
    image = Image.effect_noise((w, h), rng.uniform(20, 60)).convert("RGB")
    tint = Image.new("RGB", (w, h), tuple(rng.randrange(256) for _ in range(3)))
    image = Image.blend(image, tint, 0.6)
    pen = ImageDraw.Draw(image)
    color = tuple(rng.randrange(256) for _ in range(3))
    cx, cy, r = w // 2 + rng.randint(-w // 8, w // 8), h // 2 + rng.randint(-h // 8, h // 8), min(w, h) // 3
    if label == "circle":
        pen.ellipse((cx - r, cy - r, cx + r, cy + r), fill=color)
    elif label == "square":
        pen.rectangle((cx - r, cy - r, cx + r, cy + r), fill=color)
    else:
        pen.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=color)
    return image


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--output", required=True)
    ap.add_argument("--count", type=int, default=96, help="images in all (default 96)")
    ap.add_argument("--size", type=int, default=256, help="longest side in pixels (default 256)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    for i in range(args.count):
        label = LABELS[i % len(LABELS)]
        ext, fmt = FORMATS[i % len(FORMATS)]
        size = (args.size, rng.randint(args.size // 2, args.size))
        folder = os.path.join(args.output, label)
        os.makedirs(folder, exist_ok=True)
        draw(label, size, rng).save(os.path.join(folder, f"{i:05d}.{ext}"), fmt, quality=90)
    print(f"wrote {args.count} images in {len(LABELS)} label folders under {args.output}")


if __name__ == "__main__":
    main()
