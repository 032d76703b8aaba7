"""Global `jax.Array` batches for JAX training on a mesh, from a dataset's manifest (JAX, Grain; TensorFlow only
for `decoder="tensorflow"`).

    it = make_iterator("gs://bucket/ds", "train", 1024, seed=0, start_step=step)   # step: restored with the model
    for batch in it:                        # {"image": f32[1024, H, W, 3], "label": i32[1024]}, global arrays
        state = train_step(state, batch["image"], batch["label"])

Every batch is a dict of global arrays sharded along the mesh's `data` axis (`jax.make_array_from_process_local_data`):
each process reads, decodes and holds only the rows its own devices hold. Images are float32 in [0, 1],
`[B, H, W, 3]` (resized to `image_size`, bilinear); labels int32 `[B]` (multi-label: multi-hot float32
`[B, num_classes]`). Shapes are static: training never yields a partial batch, evaluation pads its last one.

Training reads `shard_utils.epochs`' endless stream: global step k holds the same records on any number of
processes, so the input's whole state is the step (`get_state()`, saved with Orbax beside the model; restore with
`set_state` or `start_step=`), and every epoch is read exactly once. Evaluation (`training=False`) is one pass in
index order: every record once over all processes, and a `mask` (1.0 real, 0.0 padding) where the last batch pads.

By default records are read and decoded (Pillow) in a pool of this process's threads, a few batches ahead, not in
tf.data: no TensorFlow beside JAX (importing jax and grain costs a process 1.3 s of CPU and 200 MB, with tensorflow
4.4 s and 736 MB), and ArrayRecord read natively through Grain's `ArrayRecordDataSource` (local or gs://) when the
dataset has ArrayRecord shards, else TFRecord shards through their index. tf.data still decodes and resizes for about
half the host CPU (docs/performance.md, "The JAX iterator", has the figures): `decoder="tensorflow"` decodes there.
"""
from __future__ import annotations

import functools
import math
import os
import threading
from collections import deque
from collections.abc import Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from shard_utils.extras import require
from shard_utils.format import schema
from shard_utils.format.manifest import Manifest, load
from shard_utils.format.shard_formats import ARRAY_RECORD
from shard_utils.format.splits import Selection
from shard_utils.read import epochs
from shard_utils.read.array_record_source import array_record_source
from shard_utils.read.random_access import Decoder, RandomAccessSource
from shard_utils.read.shapes import target_size

__all__ = ["DATA_AXIS", "DECODERS", "THREADS", "GlobalBatches", "make_iterator"]

DATA_AXIS = "data"  # the mesh axis batches are sharded along
DECODERS = ("pillow", "tensorflow")  # what decodes and resizes the images: make_iterator's `decoder=`
ManifestLike = Union[str, "os.PathLike[str]", Manifest]
_ENDLESS_STEPS = 2**40  # training steps of the endless stream (records: steps x rows, well inside int64)
THREADS = 8  # records read and decoded at once by default: make_iterator's `threads=`
_DEPTH = 3  # batches whose records are in flight
_EXTRA = "jax"


def _jax():
    return require("jax", _EXTRA, "shard_utils.jax_loader")


def make_iterator(manifest: ManifestLike, split: str | Sequence[str], global_batch_size: int, *, mesh: Any = None,
                  training: bool = True, seed: int | None = None, start_step: int = 0,
                  image_size: int | Sequence[int] | None = None, decoder: str = "pillow",
                  threads: int = THREADS) -> GlobalBatches:
    """An iterator of global batches of `split` (a name or an expression, as the loader takes it), `global_batch_size`
    records each, sharded along `mesh`'s `"data"` axis (default: a 1-D mesh over `jax.devices()`; other axes of a
    user mesh hold replicas).

    `manifest` is a dataset folder, its manifest.json (local or gs://) or a Manifest. Training repeats forever in
    the seeded order of `shard_utils.epochs` (`seed` None is 0: the same order every run), from global step
    `start_step`; evaluation yields one pass, `ceil(records / global_batch_size)` batches, with a `mask`.
    `image_size` (an int or (height, width)) is needed when the dataset's images vary in size.
    `decoder="tensorflow"` decodes and resizes in tf.data's native threads (the tf.data loader's pixels: bilinear
    without antialiasing) for about half the host CPU per image, at the price of importing TensorFlow (4.4 s of CPU,
    736 MB); the default, "pillow", needs no TensorFlow. `threads`: Pillow's records read and decoded at once.
    """
    jax = _jax()
    m = manifest if isinstance(manifest, Manifest) else _load(manifest)
    selection = m.select(split)
    _positive(global_batch_size, "global_batch_size")
    if isinstance(start_step, bool) or not isinstance(start_step, (int, np.integer)) or start_step < 0:
        raise ValueError(f"start_step must be an int >= 0, got {start_step!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
        raise ValueError(f"seed must be an int or None, got {seed!r}")
    _positive(threads, "threads")
    if decoder not in DECODERS:
        raise ValueError(f"decoder must be one of {', '.join(map(repr, DECODERS))}, got {decoder!r}")
    if m.media_key != schema.IMAGE_ENCODED:
        raise ValueError("make_iterator reads image datasets; read video clips with shard_utils.loader")
    labeled = {m.split(name).labeled for name in selection.splits}
    if training and False in labeled:
        raise ValueError(f"split {selection.expression!r} has records without labels: read it with training=False")
    if decoder == "tensorflow" and False in labeled:
        raise ValueError(f"split {selection.expression!r} has records without labels: read it with decoder='pillow'")
    if training and selection.num_records < global_batch_size:
        raise ValueError(f"split {selection.expression!r} has {selection.num_records} records, fewer than one global "
                         f"batch of {global_batch_size}; use a smaller batch size")
    sharding = _sharding(jax, mesh, global_batch_size)
    size = target_size(m, image_size)
    plan = _Plan(seed=int(seed or 0), num_records=selection.num_records, global_batch_size=global_batch_size,
                 rows=_process_rows(sharding, global_batch_size), training=training)
    decode = Decoder.for_manifest(m, size) if decoder == "pillow" else _TFDecoder(m, size)
    return GlobalBatches(_source(m, selection), plan, decode, sharding, int(start_step), selection.expression,
                         int(threads))


def _load(manifest: Any) -> Manifest:
    if isinstance(manifest, (str, os.PathLike)):
        return load(os.fspath(manifest))
    raise TypeError(f"manifest must be a path or a Manifest, got {type(manifest).__name__}")


def _positive(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


# ----------------------------------------------------------------------------- mesh and rows


def _sharding(jax, mesh: Any, global_batch_size: int):
    """NamedSharding of a batch's first axis over the mesh's data axis; ValueError if the batch does not split."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    if mesh is None:
        mesh = Mesh(np.array(jax.devices()), (DATA_AXIS,))
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    if DATA_AXIS not in mesh.axis_names:
        raise ValueError(f"the mesh has axes {tuple(mesh.axis_names)}; batches are sharded along an axis named "
                         f"{DATA_AXIS!r}: name your batch axis so")
    ways = mesh.shape[DATA_AXIS]
    if global_batch_size % ways:
        raise ValueError(f"global_batch_size {global_batch_size} does not split evenly over the mesh's {ways} "
                         f"{DATA_AXIS!r} shards; use a multiple of {ways}")
    return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def _process_rows(sharding, global_batch_size: int) -> tuple[int, ...]:
    """The rows of every global batch this process's devices hold, ascending (as make_array_from_process_local_data
    lays out local data)."""
    rows: set[int] = set()
    for index in sharding.addressable_devices_indices_map((global_batch_size,)).values():
        rows.update(range(global_batch_size)[index[0]])
    return tuple(sorted(rows))


@dataclass(frozen=True)
class _Plan:
    """Which record each of this process's elements is: element i is local row i % L of global step i // L."""

    seed: int
    num_records: int
    global_batch_size: int
    rows: tuple[int, ...]
    training: bool

    def steps(self) -> int:
        """Global steps of the whole input: endless when training, one pass when evaluating."""
        return _ENDLESS_STEPS if self.training else math.ceil(self.num_records / self.global_batch_size)

    def record(self, element: int) -> int | None:
        """The selection's row read as this element, None for evaluation padding."""
        step, j = divmod(int(element), len(self.rows))
        position = step * self.global_batch_size + self.rows[j]
        if not self.training:
            return position if position < self.num_records else None
        return int(_step_rows(self.seed, self.num_records, self.global_batch_size, self.rows, step)[j])

    def records(self, step: int) -> list[int | None]:
        """record() of each of this process's elements of global step `step`, in order, all at once."""
        if not self.training:
            first = step * self.global_batch_size
            return [first + r if first + r < self.num_records else None for r in self.rows]
        return _step_rows(self.seed, self.num_records, self.global_batch_size, self.rows, step).tolist()


@functools.lru_cache(maxsize=256)
def _step_rows(seed: int, num_records: int, global_batch_size: int, rows: tuple[int, ...], step: int) -> np.ndarray:
    """The selection's rows this process reads at a training step, all at once (each element asks for one)."""
    found, _ = epochs.stream_rows(seed, num_records, step * global_batch_size + np.asarray(rows, dtype=np.int64))
    return found


# ----------------------------------------------------------------------------- records


def _source(m: Manifest, selection: Selection):
    """Random access to the selection's records: ArrayRecord shards when the dataset has them, else TFRecord ones
    through their index (the same records in the same order)."""
    if ARRAY_RECORD.name not in m.formats:
        return RandomAccessSource(m, selection.expression)
    return array_record_source(m, selection.expression)


class _Batch:
    """One batch of this process's elements as numpy arrays the decode threads fill in place, a row each: "image"
    uint8 [rows, H, W, 4] (RGB, then a byte the devices drop: Pillow's own pixel layout, so that a picture is
    pasted in without the GIL and without repacking), "label" int32 [rows] (multi-label: float32 [rows, classes])
    and, evaluating, "mask" float32 [rows]. Padding rows are all zeros. A new batch each time: the devices may
    keep the host's buffers. Threads take its rows in turn (`take`): a batch is a few tasks, not one a row."""

    def __init__(self, records: list[int | None], decode: Decoder, training: bool):
        from PIL import Image

        h, w = decode.image_size or (0, 0)
        rows = len(records)
        self.arrays = {"image": np.empty((rows, h, w, 4), np.uint8),  # each row pasted whole, or zeroed (padding)
                       "label": (np.zeros((rows, decode.num_classes), np.float32) if decode.multi_label else
                                 np.zeros(rows, np.int32))}
        if not training:
            self.arrays["mask"] = np.zeros(rows, np.float32)
        # Pillow's view of every row's pixels, one picture under the other (it shares their memory)
        self.pixels = Image.frombuffer("RGBX", (w, h * rows), self.arrays["image"], "raw", "RGBX", 0, 1)
        self._rows = enumerate(records)
        self._lock = threading.Lock()
        self.dropped = False  # set when the stream closes: rows not yet taken are left

    def take(self) -> tuple[int, int | None] | None:
        """The next (row, selection row or None for padding) to fill; None when all are taken or the batch dropped."""
        with self._lock:
            return None if self.dropped else next(self._rows, None)


class _Element:
    """Reads and decodes records of this process into their rows of a _Batch (nothing for evaluation padding)."""

    def __init__(self, source, decode: Decoder):
        self.source, self.decode = source, decode

    def __call__(self, batch: _Batch) -> None:
        """Fill the batch's rows that no other thread has taken, until none is left."""
        images, labels, mask = batch.arrays["image"], batch.arrays["label"], batch.arrays.get("mask")
        while (taken := batch.take()) is not None:
            i, row = taken
            if row is None:
                images[i] = 0
                continue
            picture, labels[i] = self.decode.picture(self.source[row])
            w, h = picture.size
            batch.pixels.im.paste(picture.im, (0, i * h, w, (i + 1) * h))  # the core's: Image.paste copies a view
            if mask is not None:
                mask[i] = 1.0


class _TFDecoder:
    """Records read here in order, decoded, resized and batched in tf.data's threads (the loader's RecordDecoder):
    float32 images in [0, 1], padding all zeros with label 0, as the Pillow path gives them."""

    def __init__(self, m: Manifest, size: tuple[int, int]):
        require("tensorflow", "tf", "make_iterator(decoder='tensorflow')")
        from shard_utils.read.decode import RecordDecoder

        self.size = size
        self.record_decoder = RecordDecoder(m, training=False, image_size=size)

    def batches(self, source, plan: _Plan, first: int, end: int, per: int) -> Iterator[dict[str, np.ndarray]]:
        """This process's batches of elements first..end, in order."""
        import tensorflow as tf

        pad = source[0]  # decoded in a padding element's place, then zeroed by its mask

        def records():
            for element in range(first, end):
                row = plan.record(element)
                yield (pad, np.float32(0)) if row is None else (source[row], np.float32(1))

        def decode(serialized, real):
            out = self.record_decoder(serialized)
            image, label = out["image"] * real, out["label"]
            label = label * tf.cast(real, label.dtype)
            return ({"image": image, "label": label} if plan.training else
                    {"image": image, "label": label, "mask": real})

        spec = (tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.float32))
        ds = (tf.data.Dataset.from_generator(records, output_signature=spec)
              .map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
              .batch(per, drop_remainder=True).prefetch(_DEPTH))
        return ds.as_numpy_iterator()


# ----------------------------------------------------------------------------- the iterator


@functools.cache
def _unit_scale():
    """uint8 RGB-and-a-byte pixels -> float32 RGB in [0, 1], on the devices that hold them (jitted once; the
    sharding is kept)."""
    jax = _jax()
    return jax.jit(lambda pixels: pixels[..., :3].astype("float32") * np.float32(1 / 255))


class GlobalBatches(Iterator[dict[str, Any]]):
    """Global batches from global step `step` on; `get_state()`/`set_state()` save and restore the position.

    The state is a small JSON dict (`ocp.args.JsonSave(it.get_state())` beside the model); it means the same
    global step on any number of processes, so a run saved on P processes resumes exactly on P'.
    `close()` (or leaving a `with` block) stops the decode threads reading ahead; dropping the iterator does too.
    """

    def __init__(self, source, plan: _Plan, decode: Decoder | _TFDecoder, sharding, step: int, split: str,
                 threads: int = THREADS):
        self._source, self._plan, self._decode, self._split = source, plan, decode, split
        self._threads = threads
        self.sharding = sharding
        self._step = step
        self._batches: Generator[dict[str, np.ndarray], None, None] | None = None
        self._pool: ThreadPoolExecutor | None = None  # the open stream's decode threads (the Pillow path's)
        self._closed = False

    @property
    def step(self) -> int:
        """The global step the next batch is."""
        return self._step

    def __len__(self) -> int:
        """Batches of one evaluation pass (training input is endless)."""
        if self._plan.training:
            raise TypeError("training input is endless; steps_per_epoch is records // global_batch_size")
        return self._plan.steps()

    def __iter__(self) -> GlobalBatches:
        return self

    def __enter__(self) -> GlobalBatches:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop reading ahead and wait for the decode threads to finish the record each is on (a few ms); idempotent.
        The state (`get_state()`) stays readable for a checkpoint; `next()` then raises ValueError."""
        self._closed = True
        self._close(wait=True)

    def __next__(self) -> dict[str, Any]:
        if self._closed:
            raise ValueError("the iterator is closed; make another (start_step= or set_state() resumes its step)")
        if self._step >= self._plan.steps():
            raise StopIteration
        if self._batches is None:
            self._batches = self._open(self._step)
        try:
            local = next(self._batches)
        except BaseException:  # the stream ended with its error: the next call opens another at this step
            self._close()
            raise
        jax = _jax()
        g = self._plan.global_batch_size
        shapes = {k: (g, *v.shape[1:]) for k, v in local.items()}
        batch = jax.make_array_from_process_local_data({k: self.sharding for k in local}, local, shapes)
        if local["image"].dtype == np.uint8:
            batch["image"] = _unit_scale()(batch["image"])
        self._step += 1
        return batch

    def _open(self, step: int) -> Generator[dict[str, np.ndarray], None, None]:
        """This process's batches from `step` on, in order (see `_stream`). The stream holds no reference to the
        iterator, so an iterator dropped unclosed is freed at once, and its stream closed with it."""
        per, end = len(self._plan.rows), self._plan.steps()
        if isinstance(self._decode, _TFDecoder):
            return _tf_stream(self._decode, self._source, self._plan, step * per, end * per, per)
        self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="jax_loader")
        return _stream(self._pool, _Element(self._source, self._decode), self._plan, step, self._threads)

    def _close(self, wait: bool = False) -> None:
        """Stop reading ahead (the pool's pending records are dropped); the next batch opens a new stream. With
        wait, the decode threads are joined once they finish the record each is on."""
        if self._batches is not None:
            self._batches.close()
        self._batches = None
        if self._pool is not None and wait:
            self._pool.shutdown(wait=True)
        self._pool = None

    def get_state(self) -> dict[str, Any]:
        """The input's position as JSON-able values: the next global step, and what it means a step of."""
        return {"step": self._step, "seed": self._plan.seed, "global_batch_size": self._plan.global_batch_size,
                "split": self._split, "training": self._plan.training}

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue at the step of a saved state; ValueError if it was saved for another input."""
        mine = self.get_state()
        other = {k: state.get(k) for k in mine if k != "step" and state.get(k) != mine[k]}
        if other:
            raise ValueError(f"the saved input state is for {other}, this iterator for "
                             f"{ {k: mine[k] for k in other} }: resume with the same split, seed and global batch "
                             "(after a change of global batch, start a new stream)")
        step = state.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"the saved input state's step must be an int >= 0, got {step!r}")
        self._close()
        self._step = step


def _stream(pool: ThreadPoolExecutor, element: _Element, plan: _Plan, step: int,
            threads: int) -> Generator[dict[str, np.ndarray], None, None]:
    """The Pillow path's batches from `step` on, in order: the records of the next `_DEPTH` batches read and decoded
    in the pool's threads (Pillow lets go of the GIL while it decodes and resizes), each into its batch's row.
    Closing it drops the rows not yet taken and shuts the pool down."""
    per, end = len(plan.rows), plan.steps()
    pending: deque[tuple[_Batch, list[Future]]] = deque()
    try:
        while True:
            while len(pending) < _DEPTH and step < end:
                batch = _Batch(plan.records(step), element.decode, plan.training)
                pending.append((batch, [pool.submit(element, batch) for _ in range(min(threads, per))]))
                step += 1
            if not pending:
                return
            batch, futures = pending[0]
            for future in futures:
                future.result()
            pending.popleft()  # kept until whole, so that a record's error drops the rest of its batch too
            yield batch.arrays
    finally:
        for batch, _ in pending:
            batch.dropped = True
        pool.shutdown(wait=False, cancel_futures=True)


def _tf_stream(decode: _TFDecoder, source, plan: _Plan, first: int, end: int,
               per: int) -> Generator[dict[str, np.ndarray], None, None]:
    """The tensorflow decoder's batches of elements first..end, as a generator that closes."""
    yield from decode.batches(source, plan, first, end, per)
