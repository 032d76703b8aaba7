"""Throughput of the build's embedding step (`shard_utils.media.embed.Embedder`) against `model.predict`.

    python benchmarks/bench_embed.py [--count 256] [--batch-size 32] [--model PATH] [--jpeg]

Both embed the same photo-like 224x224 images with the same model: by default a Keras EfficientNetB0
built here with random weights (no download; the speed does not depend on the weights), saved as
`.keras`. `model.predict` gets one stacked, preprocessed array (the fastest plain use), after a warm-up
call that traces it. Rounds alternate between the two (--rounds), so machine load hits both alike; the
median round is shown. The Embedder the build's workers use is timed end to end (loading and tracing
the model, resizing and preprocessing, inference) and without its load (the time inside its batches).
`--jpeg` feeds it JPEG bytes (decoded inside) instead of arrays.

`--job` also times the whole job (`tpu-shards build --embed-model`, all cores, in this process) on the
same images saved as JPEG files, at --count and at one batch; "steady" is the rate between the two,
which leaves out the fixed costs (starting the pipeline, loading and tracing the model on the worker).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def photos(count: int, size: int = 224) -> list[np.ndarray]:
    """Smooth, photo-like RGB images (waves plus noise), different per index."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    out = []
    for _ in range(count):
        fx, fy, phase = rng.uniform(0.01, 0.08, 2).tolist() + [rng.uniform(0, 6.3)]
        base = np.stack([np.sin(xx * fx + phase), np.cos(yy * fy - phase), np.sin((xx + yy) * fx * fy * 20)], -1)
        out.append((base * 90 + 128 + rng.normal(0, 6, base.shape)).clip(0, 255).astype(np.uint8))
    return out


def run_embedder(spec, images) -> tuple[float, float, float]:
    """(seconds end to end, seconds inside inference batches, seconds loading the model): a fresh Embedder,
    as a build's worker process loads it, over every image."""
    from shard_utils.media.embed import load_embedder

    start = time.perf_counter()
    embedder = load_embedder(spec)
    loaded = time.perf_counter()
    embedder.embed(images)
    done = time.perf_counter()
    return done - start, done - loaded, loaded - start


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--model", help="a .keras file or SavedModel folder (default: EfficientNetB0, random weights)")
    ap.add_argument("--preprocess", default="none", help="for --model; EfficientNetB0 takes 0..255")
    ap.add_argument("--jpeg", action="store_true", help="feed the Embedder JPEG bytes instead of arrays")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--job", action="store_true", help="also time the whole job at --count and at one batch")
    args = ap.parse_args(argv)

    import keras
    import tensorflow as tf

    from shard_utils.media.embed import EmbedSpec, load_embedder, preprocess

    work = Path(tempfile.mkdtemp(prefix="bench-embed-"))
    path = args.model
    if path is None:
        keras.utils.set_random_seed(0)
        model = keras.applications.EfficientNetB0(weights=None, include_top=False, pooling="avg",
                                                  input_shape=(224, 224, 3))
        path = str(work / "effnet_b0.keras")
        model.save(path)
    spec = EmbedSpec(path, args.preprocess, batch_size=args.batch_size)
    size = load_embedder(spec).info.input_size
    pixels = photos(args.count, size[0]) if size[0] == size[1] else None
    if pixels is None:
        raise SystemExit("this benchmark makes square images; use a model with a square input")

    if not path.endswith(".keras"):
        raise SystemExit("the model.predict baseline needs a .keras model")
    model = keras.saving.load_model(path, compile=False)
    batch = preprocess(np.stack(pixels), spec.preprocess)
    model.predict(batch, batch_size=args.batch_size, verbose=0)  # traces (every batch shape) off the clock

    def element(img):
        if not args.jpeg:
            return img
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, "JPEG", quality=90)
        return buf.getvalue()

    elements = [element(img) for img in pixels]
    rounds = {"predict": [], "total": [], "inside": [], "load": [], "job": [], "job_steady": []}
    folders = {n: write_jpegs(pixels[:n], work / f"jpegs-{n}") for n in (args.batch_size, args.count)} \
        if args.job else {}
    for _ in range(args.rounds):
        start = time.perf_counter()
        model.predict(batch, batch_size=args.batch_size, verbose=0)
        rounds["predict"].append(args.count / (time.perf_counter() - start))
        total, inside, load = run_embedder(spec, elements)
        rounds["total"].append(args.count / total)
        rounds["inside"].append(args.count / inside)
        rounds["load"].append(load)
        if args.job:
            tiny = run_job(folders[args.batch_size], work, path, args)
            full = run_job(folders[args.count], work, path, args)
            rounds["job"].append(args.count / full)
            rounds["job_steady"].append((args.count - args.batch_size) / (full - tiny))
    print(f"{args.count} images {size[0]}x{size[1]}, batch {args.batch_size}, model {Path(path).name}, "
          f"input {'JPEG bytes' if args.jpeg else 'uint8 arrays'}; TF {tf.__version__}, {os.cpu_count()} CPUs; "
          f"median of {args.rounds} alternating rounds")
    median = {k: float(np.median(v)) for k, v in rounds.items() if v}
    rows = [("model.predict", "predict", ""),
            ("Embedder, end to end", "total", f"incl. loading the model ({median['load']:.1f} s)"),
            ("Embedder, inside batches", "inside", "resize + preprocess + model")]
    if args.job:
        rows += [("job, end to end", "job", "tpu-shards build --embed-model, all cores, JPEG files in"),
                 ("job, steady", "job_steady", f"between {args.batch_size} and {args.count} images")]
    for name, key, note in rows:
        per_round = " ".join(f"{r:.1f}" for r in rounds[key])
        print(f"  {name:<30} {median[key]:7.1f} img/s  {median[key] / median['predict']:5.2f}x predict   "
              f"rounds: {per_round}  {note}")


def write_jpegs(pixels: list[np.ndarray], folder: Path) -> Path:
    """The images as JPEG files in one label folder (the job's input)."""
    (folder / "all").mkdir(parents=True, exist_ok=True)
    for i, img in enumerate(pixels):
        Image.fromarray(img).save(folder / "all" / f"{i:05d}.jpg", "JPEG", quality=90)
    return folder


def run_job(folder: Path, work: Path, model: str, args) -> float:
    """Seconds for a whole build with embeddings (Beam already imported by the first run)."""
    from beam_jobs.jobs.build import run

    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # the job's summary
        run(["--input", str(folder), "--output", str(work / "out"), "--overwrite",
             "--embed-model", model, "--embed-preprocess", args.preprocess,
             "--embed-batch-size", str(args.batch_size), "--no-progress"])
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
