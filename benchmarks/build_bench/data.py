"""Photo-like test images, generated in a process pool and cached under the work folder between runs.

Image i of a kind is always the same bytes (its pixels come from a generator seeded by i), so one
cache serves every size: an input of N images is a folder of hard links to the cache's first N.
"""
from __future__ import annotations

import functools
import multiprocessing
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

GENERATOR_VERSION = 1  # bump when the pixels change: the cache folder's name carries it
LABELS = 10


@dataclass(frozen=True)
class Kind:
    """One kind of test image: Pillow format, file extension, side in pixels, save options; `rows` cuts the
    picture to that height (a landscape photo)."""

    name: str
    fmt: str
    ext: str
    side: int
    save: tuple[tuple[str, int], ...]
    rows: int | None = None


KINDS = {
    "png": Kind("png", "PNG", "png", 400, (("compress_level", 6),)),  # re-encode path
    "jpg": Kind("jpg", "JPEG", "jpg", 400, (("quality", 90),)),  # pass-through path
    "small": Kind("small", "JPEG", "jpg", 64, (("quality", 90),)),  # many records, little pixel work
    "phone": Kind("phone", "JPEG", "jpg", 1600, (("quality", 90),), rows=1200),  # phone-size: 1200 x 1312-1600
}


@functools.cache
def _grid(side: int) -> tuple[np.ndarray, np.ndarray]:
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float32)
    return yy, xx


def photo_pixels(i: int, side: int) -> np.ndarray:
    """Smooth gradients plus sensor-like noise: compresses like a photo. Sizes vary a little (~side x side)."""
    rng = np.random.default_rng([GENERATOR_VERSION, i])
    h, w = side - (i % 5) * side // 25, side - (i % 7) * side * 3 // 100
    yy, xx = _grid(side)
    fx, fy = rng.uniform(0.005, 0.05, 2) * (400 / side)
    phase = rng.uniform(0, 6.3)
    base = np.stack([np.sin(xx * fx + phase), np.cos(yy * fy - phase), np.sin((xx + yy) * (fx * fy * 20))], -1)
    noise = rng.standard_normal((h, w, 3), dtype=np.float32) * 6
    return (base[:h, :w] * 90 + 128 + noise).clip(0, 255).astype(np.uint8)


def image_path(root: Path, kind: Kind, i: int) -> Path:
    return root / f"class{i % LABELS}" / f"{i:06d}.{kind.ext}"


def _write(job: tuple[str, str, list[int]]) -> int:
    kind_name, root, indices = job
    kind = KINDS[kind_name]
    for i in indices:
        path = image_path(Path(root), kind, i)
        temp = path.with_name(path.name + ".part")
        pixels = photo_pixels(i, kind.side)[:kind.rows]  # photo_pixels is at least 0.84 side high
        Image.fromarray(pixels).save(temp, kind.fmt, **dict(kind.save))
        os.replace(temp, path)  # a killed run never leaves a half-written image in the cache
    return len(indices)


def cache_dir(work: Path, kind: Kind) -> Path:
    return work / "cache" / f"{kind.name}-v{GENERATOR_VERSION}"


def ensure_cached(work: Path, kind: Kind, count: int, processes: int) -> Path:
    """The cache folder holding images 0..count-1 of `kind`; missing ones are written by `processes` processes."""
    root = cache_dir(work, kind)
    for label in range(min(LABELS, count)):
        (root / f"class{label}").mkdir(parents=True, exist_ok=True)
    missing = [i for i in range(count) if not image_path(root, kind, i).exists()]
    if missing:
        step = 64 if kind.side < 200 else 8
        jobs = [(kind.name, str(root), missing[k:k + step]) for k in range(0, len(missing), step)]
        if processes <= 1:
            for job in jobs:
                _write(job)
        else:
            with multiprocessing.get_context("fork").Pool(processes) as pool:
                for _ in pool.imap_unordered(_write, jobs):
                    pass
    return root


def input_folder(work: Path, kind_name: str, count: int, processes: int) -> Path:
    """A folder of exactly `count` images of the kind (class<k>/ subfolders), made of hard links to the cache."""
    kind = KINDS[kind_name]
    folder = work / "inputs" / f"{kind.name}-{count}"
    done = folder.with_name(folder.name + ".done")
    if done.exists():
        return folder
    root = ensure_cached(work, kind, count, processes)
    shutil.rmtree(folder, ignore_errors=True)
    for label in range(min(LABELS, count)):
        (folder / f"class{label}").mkdir(parents=True)
    for i in range(count):
        source, target = image_path(root, kind, i), image_path(folder, kind, i)
        try:
            os.link(source, target)
        except OSError:  # a file system without hard links
            shutil.copyfile(source, target)
    done.touch()
    return folder


def source_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
