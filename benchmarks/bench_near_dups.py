"""Near-duplicate signatures: recall and precision on transformed copies, and what they cost a build.

Photo-like originals (a sky-and-ground gradient, a dozen shapes, texture and sensor noise, each different) are
copied by this script with one transformation each: resized 50-200 %, re-compressed at JPEG quality 30-95,
cropped by up to 10 %, brightness/colour shifted a little, mirrored. A pair is a near-duplicate when the
signatures of its two images differ in at most the threshold's bits. For each transformation, recall is the share
of (original, copy) pairs found; precision is the share of the pairs found among the originals and those copies
that are true. Side by side: tpu-shards' signature at NEAR_DISTANCE (of the decoded picture, as a re-encoded
image's; and of the picture saved as a JPEG kept byte for byte, from the check's 1/8-scale decode), imagehash's
pHash at its README's cutoff (distance < 5) and at the same threshold as ours.

Then the cost, on the same photos saved as JPEG (kept byte for byte: the cheapest path, where the checks weigh most)
and as PNG (decoded and re-encoded): the CPU of the encode step per image (`encode_item`) and of whole builds
(`tpu-shards build` in a child process, one worker) with `--quality-checks on` and `off`, interleaved, best of
`--repeats`.

    python benchmarks/bench_near_dups.py --build-images 0                       # the recall/precision table
    python benchmarks/bench_near_dups.py --originals 0 --build-images 500 --repeats 2   # the cost
    python benchmarks/bench_near_dups.py --originals 4 --build-images 10 --repeats 1    # a smoke run
    python benchmarks/bench_near_dups.py --originals 0 --build-images 0 --cluster-records 2000  # clustering alone

The last one measures the clustering's own CPU per record (`ClusterSignatures` on FnApiRunner in this process,
on random signatures a tenth of them near copies): the CPU of `--cluster-records` records less that of a fifth of
them, so the graph's fixed cost is left out; and the bytes per record its band step shuffles, in Beam's coder.
"""
from __future__ import annotations

import argparse
import io
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageEnhance, ImageFilter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from shard_utils.inputs import MediaItem  # noqa: E402
from shard_utils.media.encode import EncodeSettings, encode_item  # noqa: E402
from shard_utils.media.images import ImageOptions, prepare_image  # noqa: E402
from shard_utils.quality.flags import inspect, view_of  # noqa: E402
from shard_utils.quality.signature import NEAR_DISTANCE, signature  # noqa: E402

IMAGEHASH_CUTOFF = 4  # imagehash's README: `hash0 - hash1 < cutoff` with cutoff = 5
RUN = 500  # records of a run, as the clustering takes them (one batch each)


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


def cropped(image: Image.Image, rng: np.random.Generator, low: float = 0.0, high: float = 0.1) -> Image.Image:
    """low..high of the width and of the height cut, shared at random between the two sides."""
    cut_w, cut_h = rng.uniform(low, high) * image.width, rng.uniform(low, high) * image.height
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
    "crop up to 5 %": lambda image, rng: cropped(image, rng, 0.0, 0.05),
    "crop 5-10 %": lambda image, rng: cropped(image, rng, 0.05, 0.1),
    "brightness/colour": shifted, "mirror (not a target)": mirrored}


def ours(image: Image.Image) -> int:
    """The signature as a build computes it: of the image's view."""
    return signature(np.asarray(view_of(image)))


def ours_kept(image: Image.Image) -> int:
    """The signature a build computes of the image saved as a JPEG (quality 95) and kept byte for byte: from
    the check's own decode, at 1/8 scale where that leaves 32 pixels on the shorter side."""
    out = io.BytesIO()
    image.save(out, "JPEG", quality=95)
    return prepare_image(out.getvalue(), ImageOptions()).inspection.signature


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
               f"tpu-shards, JPEG kept (<= {NEAR_DISTANCE})": (ours_kept, NEAR_DISTANCE),
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


def blur_table(count: int, radii: tuple[float, ...] = (0.0, 0.005, 0.01, 0.015, 0.02, 0.04)) -> list[str]:
    """Share of `count` photos flagged `blur` once blurred by a Gaussian of each radius (a share of the width):
    as re-encoded (the view of the full decode) and as JPEGs kept byte for byte (the check's 1/8-scale decode)."""
    rows = ["| Gaussian blur (share of width) | flagged, re-encoded | flagged, JPEG kept |", "|---|---|---|"]
    for radius in radii:
        flagged = {"re-encoded": 0, "kept": 0}
        for i in range(count):
            image = photo(i)
            image = image.filter(ImageFilter.GaussianBlur(radius * image.width)) if radius else image
            out = io.BytesIO()
            image.save(out, "JPEG", quality=95)
            seen = {"re-encoded": inspect(view_of(image), image.height, image.width),
                    "kept": prepare_image(out.getvalue(), ImageOptions()).inspection}
            for path, inspection in seen.items():
                flagged[path] += any(kind == "blur" for kind, _, _ in inspection.flags)
        rows.append(f"| {radius:.1%} | {flagged['re-encoded'] / count:.0%} | {flagged['kept'] / count:.0%} |")
    return rows


def speed(count: int = 50) -> list[str]:
    """CPU per decoded image of each signature alone (ours from the view, as a build computes it)."""
    images = [photo(i) for i in range(count)]
    rows = []
    for name, fn in (("tpu-shards signature (view + DCT)", ours), ("imagehash pHash", imagehash_phash)):
        start = time.process_time()
        for image in images:
            fn(image)
        rows.append(f"{name}: {(time.process_time() - start) / count * 1e3:.2f} ms CPU per ~480x360 image")
    return rows


def write_inputs(folder: Path, count: int, fmt: str) -> tuple[Path, Path]:
    """The first `count` photos in `fmt` (JPEG at quality 90, or PNG) in two label folders, and a folder of the
    first fifth of them (hard links)."""
    ext = "jpg" if fmt == "JPEG" else "png"
    root, fifth = folder / ext, folder / f"{ext}-fifth"
    for i in range(count):
        path = root / f"label{i % 2}" / f"{i:05d}.{ext}"
        path.parent.mkdir(parents=True, exist_ok=True)
        photo(i).save(path, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
        if i < count // 5:
            (fifth / path.parent.name).mkdir(parents=True, exist_ok=True)
            os.link(path, fifth / path.parent.name / path.name)
    return root, fifth


def encode_cpu(root: Path, inspect: bool) -> float:
    """CPU seconds of the encode step (read, decode/check, inspect, encode, frame) over every image of root."""
    settings = EncodeSettings(image=ImageOptions(inspect=inspect), label_ids={"label0": 0, "label1": 1})
    items = [MediaItem(str(p.relative_to(root)), str(p), p.stat().st_size, (p.parent.name,))
             for p in sorted(root.rglob("*.*"))]
    start = time.process_time()
    for item in items:
        encode_item(item, settings)
    return time.process_time() - start


def build_cpu(root: Path, out: Path, checks: str) -> float:
    """CPU seconds (user + system, the child and its own children) of one build of root."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "beam_jobs.cli", "build", "--input", str(root), "--output", str(out),
                    "--overwrite", "--workers", "1", "--num-cores", "1", "--quality-checks", checks],
                   check=True, capture_output=True, cwd=Path(__file__).resolve().parents[1],
                   env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def best_of(repeats: int, measure: Callable[[str], float]) -> dict[str, float]:
    """The least of `repeats` measurements with the checks off and on, interleaved (a slower moment of the
    machine hits both alike)."""
    best = {"off": float("inf"), "on": float("inf")}
    for _ in range(repeats):
        for checks in best:
            best[checks] = min(best[checks], measure(checks))
    return best


def cost_table(count: int, repeats: int) -> list[str]:
    """CPU with the checks off and on: the encode step over `count` images, whole builds of `count` images, and
    per image of a build (the CPU of `count` images less that of a fifth of them: Beam's start-up left out)."""
    rows = ["| input | measured | checks off | checks on | on / off |", "|---|---|---|---|---|"]
    for fmt in ("JPEG", "PNG"):
        with tempfile.TemporaryDirectory() as temp:
            root, fifth = write_inputs(Path(temp), count, fmt)
            out = Path(temp) / "out"
            rows.append(row(f"{count} {fmt}", "encode step (CPU s)",
                            best_of(repeats, lambda checks, root=root: encode_cpu(root, checks == "on"))))
            whole = best_of(repeats, lambda checks, root=root, out=out: build_cpu(root, out, checks))
            small = best_of(repeats, lambda checks, fifth=fifth, out=out: build_cpu(fifth, out, checks))
            rows.append(row(f"{count} {fmt}", "whole build (CPU s)", whole))
            per_image = {k: (whole[k] - small[k]) / (count - count // 5) * 1e3 for k in whole}
            rows.append(row(f"{count} {fmt}", "build, per image (CPU ms)", per_image))
    return rows


def cluster_records(count: int) -> list:
    """(packed signature, Member) of `count` records, random signatures a tenth of them near copies."""
    from beam_jobs.pipeline.near_dups import packed
    from shard_utils.quality.clusters import Member

    rng = np.random.default_rng(count)
    sigs = rng.integers(0, 2**64 - 1, count, dtype=np.uint64, endpoint=True).tolist()
    for i in range(0, count - 1, 10):  # a tenth are near copies of their neighbour
        sigs[i + 1] = sigs[i] ^ sum(1 << int(b) for b in rng.choice(64, int(rng.integers(1, 9)), replace=False))
    return [(packed(s), Member(f"label{i % 2}/{i:06d}.jpg", "train", (f"label{i % 2}",), (0, i), f"{i:064x}"))
            for i, s in enumerate(sigs)]


def shuffle_bytes(count: int) -> str:
    """The bytes per record the band step's GroupByKey takes in (its elements in Beam's coder, key and value), for
    `count` records in one bundle: what Dataflow's Shuffle would carry."""
    from apache_beam.coders import coders

    from shard_utils.quality import band_partitions as bp
    from shard_utils.quality.clusters import Banding

    coder = coders.FastPrimitivesCoder()
    buffer = bp.PartitionBuffer(Banding(NEAR_DISTANCE), limit=count + 1)
    buffer.extend(np.array([int.from_bytes(sig, "big") for sig, _ in cluster_records(count)], dtype=np.uint64))
    parts = buffer.flush()
    size = sum(len(coder.encode(pid)) + len(coder.encode(part)) for pid, part in parts)
    return f"band step: {size / count:.0f} bytes per record through GroupPartition ({len(parts)} elements)"


def cluster_cpu(count: int) -> float:
    """CPU seconds of the clustering graph (band partitions, verification, components, members joined) over
    `count` signed records, in this process on FnApiRunner."""
    import apache_beam as beam

    from beam_jobs.pipeline.near_dups import ClusterSignatures
    from shard_utils.quality.member_batches import batch_of

    records = cluster_records(count)
    batches = [batch_of(records[start:start + RUN]) for start in range(0, count, RUN)]
    start = time.process_time()
    with beam.Pipeline(runner="FnApiRunner") as p:
        _ = (p | beam.Create(range(len(batches)))  # Create would infer the type of every record of a batch
             | beam.Map(batches.__getitem__) | ClusterSignatures(NEAR_DISTANCE) | beam.combiners.Count.Globally())
    return time.process_time() - start


def cluster_cost(count: int, repeats: int) -> list[str]:
    """The clustering's CPU per record: `count` records less a fifth of them (the fixed cost left out)."""
    whole = min(cluster_cpu(count) for _ in range(repeats))
    small = min(cluster_cpu(count // 5) for _ in range(repeats))
    return [f"clustering: {whole:.2f} CPU s for {count} records, {small:.2f} for {count // 5}: "
            f"{(whole - small) / (count - count // 5) * 1e3:.3f} ms CPU per record"]


def row(what: str, measured: str, best: dict[str, float]) -> str:
    return f"| {what} | {measured} | {best['off']:.2f} | {best['on']:.2f} | {best['on'] / best['off']:.3f}x |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--originals", type=int, default=300, help="photos the copies are made of")
    parser.add_argument("--build-images", type=int, default=500, help="images per cost measurement (0: none)")
    parser.add_argument("--repeats", type=int, default=3, help="measurements of each, the best kept")
    parser.add_argument("--cluster-records", type=int, default=0, help="records of the clustering alone (0: none)")
    args = parser.parse_args(argv)
    if args.originals < 0 or args.originals == 1 or args.build_images < 0 \
            or args.repeats < 1 or 0 < args.cluster_records < 5:
        parser.error("--originals must be 0 (no recall table) or at least 2, --build-images at least 0, --repeats "
                     "at least 1, --cluster-records 0 or at least 5")
    if args.originals:
        print("\n".join(quality_table(args.originals)))
        print("\n".join(blur_table(min(args.originals, 40))))
        print("\n".join(speed()))
    if args.build_images:
        print("\n".join(cost_table(args.build_images, args.repeats)))
    if args.cluster_records:
        print("\n".join(cluster_cost(args.cluster_records, args.repeats)))
        print(shuffle_bytes(args.cluster_records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
