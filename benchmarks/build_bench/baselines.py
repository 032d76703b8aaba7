"""What the job is compared with, run over the same files with 1..N processes (files split evenly).

- `pillow_reencode`: the plain Pillow loop, decode + JPEG encode, nothing else (the re-encode path's floor).
- `passthrough_floor`: per JPEG, what a pass-through record cannot avoid: read, validate by decoding at
  1/8 scale (Pillow draft), sha256, build and frame the Example with the job's own code, write.
"""
from __future__ import annotations

import hashlib
import io
import multiprocessing
import os
import time
from pathlib import Path
from typing import Callable

from PIL import Image

from shard_utils import schema
from shard_utils.tfrecord import frame


def files_in(root: Path) -> list[str]:
    """Every file under root, sorted (what the job lists)."""
    return sorted(os.path.join(d, f) for d, _, names in os.walk(root) for f in names)


def pillow_reencode(paths: list[str], quality: int) -> int:
    """Decode each image with Pillow and encode it as JPEG in memory; returns the number done."""
    for path in paths:
        with Image.open(path) as image:
            out = io.BytesIO()
            image.convert("RGB").save(out, "JPEG", quality=quality)
    return len(paths)


def passthrough_floor(paths: list[str], root: str, out_path: str, decode: bool = True) -> int:
    """Read, (validate by a 1/8-scale decode), hash, encode and frame the Example, write; returns the number done."""
    labels = {name: i for i, name in enumerate(sorted(os.listdir(root)))}
    with open(out_path, "wb") as out:
        for path in paths:
            with open(path, "rb") as f:
                data = f.read()
            image = Image.open(io.BytesIO(data))
            width, height = image.size
            if decode:
                image.draft(image.mode, (max(1, width // 8), max(1, height // 8)))
                image.load()
            label_name = os.path.basename(os.path.dirname(path))
            record = schema.ImageRecord(
                encoded=data, height=height, width=width, channels=3, label=labels[label_name],
                label_text=label_name, source_id=os.path.relpath(path, root), sha256=hashlib.sha256(data).hexdigest())
            out.write(frame(schema.encode_example(record)))
    return len(paths)


def _pillow_part(args: tuple) -> int:
    paths, quality = args
    return pillow_reencode(paths, quality)


def _floor_part(args: tuple) -> int:
    return passthrough_floor(*args)


def timed_split(part: Callable[[tuple], int], paths: list[str], processes: int,
                args_of: Callable[[int, list[str]], tuple]) -> float:
    """Seconds to run `part` over `paths` split evenly across `processes` forked processes (inline for 1)."""
    chunks = [paths[k::processes] for k in range(processes)]
    jobs = [args_of(k, chunk) for k, chunk in enumerate(chunks)]
    start = time.perf_counter()
    if processes == 1:
        done = part(jobs[0])
    else:
        with multiprocessing.get_context("fork").Pool(processes) as pool:
            done = sum(pool.map(part, jobs, chunksize=1))
    seconds = time.perf_counter() - start
    if done != len(paths):
        raise RuntimeError(f"baseline handled {done} of {len(paths)} files")
    return seconds


def time_pillow(root: Path, processes: int, quality: int) -> float:
    return timed_split(_pillow_part, files_in(root), processes, lambda k, chunk: (chunk, quality))


def time_floor(root: Path, processes: int, out_dir: Path, decode: bool = True) -> float:
    out_dir.mkdir(parents=True, exist_ok=True)
    seconds = timed_split(_floor_part, files_in(root), processes,
                          lambda k, chunk: (chunk, str(root), str(out_dir / f"floor-{k}.records"), decode))
    for name in os.listdir(out_dir):
        os.remove(out_dir / name)
    return seconds
