"""What the job is compared with, run over the same files with 1..N processes (files split evenly).

- `pillow_reencode`: the plain Pillow loop, decode + JPEG encode, nothing else (the re-encode path's floor).
- `passthrough_floor`: per JPEG, what a pass-through record cannot avoid: read, validate by decoding at
  1/8 scale (Pillow draft), sha256, build and frame the Example with the job's own code, write.
- `balanced_floor`: the floor plus what exact balance cannot avoid in any design that learns which files are
  usable only by reading them: a second pass once the counts are known (each process writes its records as
  one sorted run; then, in parallel, every shard is merged from the runs in key order, hashed (CRC32C and
  SHA-256 for the manifest) and written durably). No Beam, no index, no manifest: the floor of a two-pass build.
- `job_encode`: the job's own per-image step (encode_item) alone, to split the job's time between that
  step and everything around it (Beam, the pool's pipes, writing runs or fragments, shards).
"""
from __future__ import annotations

import hashlib
import io
import multiprocessing
import os
import resource
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from PIL import Image

from shard_utils import storage
from shard_utils.format import schema
from shard_utils.format.order import sort_key
from shard_utils.format.tfrecord import frame
from shard_utils.sharding import plan


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


def floor_records(paths: list[str], root: str, decode: bool = True) -> Iterator[tuple[str, bytes]]:
    """(source id, framed Example) per file: read, (validate by a 1/8-scale decode), hash, encode, frame."""
    labels = {name: i for i, name in enumerate(sorted(os.listdir(root)))}
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        image = Image.open(io.BytesIO(data))
        width, height = image.size
        if decode:
            image.draft(image.mode, (max(1, width // 8), max(1, height // 8)))
            image.load()
        label_name, source_id = os.path.basename(os.path.dirname(path)), os.path.relpath(path, root)
        record = schema.ImageRecord(
            encoded=data, height=height, width=width, channels=3, label=labels[label_name], label_text=label_name,
            source_id=source_id, sha256=hashlib.sha256(data).hexdigest())
        yield source_id, frame(schema.encode_example(record))


def passthrough_floor(paths: list[str], root: str, out_path: str, decode: bool = True) -> int:
    """The floor's records written in arrival order; returns the number done."""
    with open(out_path, "wb") as out:
        for _, framed in floor_records(paths, root, decode):
            out.write(framed)
    return len(paths)


def sorted_run(paths: list[str], root: str, out_path: str, decode: bool = True) -> list[tuple[int, int, int]]:
    """Pass 1 of the balanced floor: the floor's records written as one run sorted by their shuffle key;
    returns (key, offset, length) of each record in the run."""
    records = sorted(((sort_key(0, source_id), framed) for source_id, framed in floor_records(paths, root, decode)),
                     key=lambda r: r[0])
    places, offset = [], 0
    with open(out_path, "wb") as out:
        for key, framed in records:
            out.write(framed)
            places.append((key, offset, len(framed)))
            offset += len(framed)
    return places


def write_balanced_shard(args: tuple) -> int:
    """Pass 2 of the balanced floor: one shard's records, read from the runs in key order, hashed, written
    durably; returns the number of records."""
    pieces, out_path = args  # pieces: (key, run path, offset, length) in key order
    digest = storage.Digest()
    handles: dict[str, object] = {}
    with open(out_path, "wb") as out:
        for _, run, offset, length in pieces:
            f = handles.get(run) or handles.setdefault(run, open(run, "rb"))
            f.seek(offset)
            data = f.read(length)
            out.write(data)
            digest.update(data)
        out.flush()
        os.fsync(out.fileno())
    for f in handles.values():
        f.close()
    return len(pieces)


def _run_part(args: tuple) -> list[tuple[int, int, int]]:
    return sorted_run(*args)


def _forked(processes: int):
    return multiprocessing.get_context("fork").Pool(processes)


def time_balanced_floor(root: Path, processes: int, out_dir: Path, decode: bool = True,
                        num_shards: int = 8) -> tuple[float, float]:
    """(wall, CPU) seconds of the two-pass balanced floor over the files under root with `processes` processes:
    pass 1 (sorted runs), then `num_shards` equal shards merged from the runs, written in parallel."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = files_in(root)
    runs = [str(out_dir / f"run-{k}.records") for k in range(processes)]
    jobs = [(paths[k::processes], str(root), runs[k], decode) for k in range(processes)]
    start, cpu = time.perf_counter(), cpu_seconds()
    pool = _forked(processes) if processes > 1 else None
    try:
        placed = pool.map(_run_part, jobs, chunksize=1) if pool else [_run_part(jobs[0])]
        merged = sorted((key, runs[k], offset, length) for k, places in enumerate(placed)
                        for key, offset, length in places)
        starts = plan.shard_starts(len(merged), num_shards) + [len(merged)]
        shards = [(merged[starts[i]:starts[i + 1]], str(out_dir / f"shard-{i}.records")) for i in range(num_shards)]
        done = sum(pool.map(write_balanced_shard, shards, chunksize=1) if pool else map(write_balanced_shard, shards))
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    seconds = time.perf_counter() - start
    if done != len(paths):
        raise RuntimeError(f"balanced floor wrote {done} of {len(paths)} records")
    timing = seconds, cpu_seconds() - cpu
    _empty(out_dir)
    return timing


def job_items(root: Path) -> list:
    """The job's MediaItems for the files under root (label folders), as its listing step makes them."""
    from shard_utils.inputs import listings

    out = []
    for path in files_in(root):
        item = listings.item_from_walk(os.path.relpath(path, root), os.path.getsize(path), str(root), False,
                                       listings.ListingOptions())
        if not hasattr(item, "uri"):
            raise RuntimeError(f"{path}: not a media item: {item}")
        out.append(item)
    return out


def job_encode(items: list, root: str, quality: int, validate: str) -> int:
    """The job's own encode step (shard_utils.media.encode.encode_item) over the items, results dropped: the
    per-image work without Beam, the pool's pipes, runs, fragments or shards."""
    from shard_utils.media.encode import EncodeSettings, encode_item
    from shard_utils.media.images import ImageOptions

    labels = sorted(os.listdir(root))
    settings = EncodeSettings(image=ImageOptions(quality=quality, validate=validate),
                              label_ids={name: i for i, name in enumerate(labels)})
    done = 0
    for start in range(0, len(items), 16):
        outcomes = [encode_item(item, settings) for item in items[start:start + 16]]
        bad = [o for o in outcomes if isinstance(o, dict)]
        if bad:
            raise RuntimeError(f"the job's encoder rejected a benchmark image: {bad[0]}")
        done += len(outcomes)
    return done


def _encode_part(args: tuple) -> int:
    return job_encode(*args)


def _pillow_part(args: tuple) -> int:
    paths, quality = args
    return pillow_reencode(paths, quality)


def _floor_part(args: tuple) -> int:
    return passthrough_floor(*args)


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and of its children that have exited."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def timed_split(part: Callable[[tuple], int], paths: list, processes: int,
                args_of: Callable[[int, list], tuple]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) to run `part` over `paths` split evenly across `processes` forked
    processes (inline for 1). The pool's workers are reaped before the CPU time is read."""
    chunks = [paths[k::processes] for k in range(processes)]
    jobs = [args_of(k, chunk) for k, chunk in enumerate(chunks)]
    start, cpu = time.perf_counter(), cpu_seconds()
    if processes == 1:
        done = part(jobs[0])
    else:
        pool = _forked(processes)
        try:
            done = sum(pool.map(part, jobs, chunksize=1))
        finally:
            pool.close()
            pool.join()
    seconds = time.perf_counter() - start
    if done != len(paths):
        raise RuntimeError(f"baseline handled {done} of {len(paths)} files")
    return seconds, cpu_seconds() - cpu


def time_pillow(root: Path, processes: int, quality: int) -> tuple[float, float]:
    return timed_split(_pillow_part, files_in(root), processes, lambda k, chunk: (chunk, quality))


def time_job_encode(root: Path, processes: int, quality: int = 95, validate: str = "decode") -> tuple[float, float]:
    items = job_items(root)
    return timed_split(_encode_part, items, processes, lambda k, chunk: (chunk, str(root), quality, validate))


def time_floor(root: Path, processes: int, out_dir: Path, decode: bool = True) -> tuple[float, float]:
    out_dir.mkdir(parents=True, exist_ok=True)
    timing = timed_split(_floor_part, files_in(root), processes,
                          lambda k, chunk: (chunk, str(root), str(out_dir / f"floor-{k}.records"), decode))
    _empty(out_dir)
    return timing


def _empty(folder: Path) -> None:
    """Remove what a floor wrote (the next measurement starts from an empty folder)."""
    for name in os.listdir(folder):
        os.remove(folder / name)
