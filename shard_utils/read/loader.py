"""The TPU-ready loader: a tf.data pipeline built from a dataset's manifest.

`make_dataset` turns a manifest (path or object) and a split into batches with fully
static shapes: images float32 (or bfloat16) `[B, H, W, 3]` scaled to [0, 1] (video clips
`[B, N, H, W, 3]`, or precomputed embeddings), labels int32 `[B]` (multi-label: multi-hot
float32 `[B, num_classes]`). Training mode shards files per input pipeline, reads in
parallel without order guarantees, shuffles serialized records, repeats and drops the last
partial batch. Evaluation mode reads every record of the split exactly once per pass across
all pipelines and pads each pipeline to exactly `eval_steps` steps, with a weight of 1 for
real examples and 0 for padding, so TPU evaluation neither hangs nor miscounts; the pass
repeats identically, so Keras can evaluate after every epoch.

Every shard is read by its own TFRecordDataset and checked against the manifest's record
count, so a damaged shard fails with an error that names it. Local shards are checked before
TensorFlow opens them (regular files, every record header inside the file: TensorFlow's reader
allocates whatever length a header gives).

TensorFlow and google-crc32c are needed (fastavro too for resumable input, which reads the index); `gs://` paths
are read through TensorFlow's own filesystem.
"""
from __future__ import annotations

import math
import os
import posixpath
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Union

try:
    import tensorflow as tf
except ImportError as _failed:  # one line: not installed, or installed but missing a package (named), with pip's fix
    from shard_utils.extras import MissingExtra, import_problem

    raise MissingExtra(import_problem(_failed, "tensorflow", "the loader (shard_utils.loader)", "tf")) from None

from shard_utils import storage
from shard_utils.format import schema, topology
from shard_utils.format.manifest import MAX_MANIFEST_BYTES, Manifest, ManifestError, Shard, read_manifest_bytes
from shard_utils.format.manifest import load as _load_manifest
from shard_utils.format.splits import Selection
from shard_utils.format.tfrecord import FramingError, count_from_headers
from shard_utils.read import epochs, loader_resume, resume
from shard_utils.read.decode import FEATURE_MODES, LENGTH_SUFFIX, RecordDecoder, feature_spec
from shard_utils.read.stated import stored_problems

__all__ = ["AUTOTUNE", "FEATURE_MODES", "LENGTH_SUFFIX", "eval_steps", "load_manifest", "make_dataset",
           "parse_spec", "steps_per_epoch"]

AUTOTUNE = tf.data.AUTOTUNE
ManifestLike = Union[str, "os.PathLike[str]", Manifest]
SplitLike = str | Sequence[str]  # a split name, an expression ("train[:80%]+validation") or a list of them

# Serialized records held by the training shuffle buffer, as a memory budget (bytes) and bounds (records).
_SHUFFLE_BUDGET_BYTES = 256 * 2**20
_SHUFFLE_MIN, _SHUFFLE_MAX = 1024, 16384
_MAX_CYCLE_LENGTH = 16
CHECK_THREADS = 8  # shards whose framing is checked at once (on gs:, each a stream of ranged reads)


# ----------------------------------------------------------------------------- manifest access


def _gfile_read(path: str) -> bytes:
    """A manifest's bytes: through TensorFlow's filesystem on gs:// (no more than a manifest may hold, and one
    byte), through the storage layer locally (which refuses a named pipe or a device)."""
    if "://" not in path:
        return read_manifest_bytes(path)
    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read(MAX_MANIFEST_BYTES + 1)


def load_manifest(manifest: ManifestLike) -> Manifest:
    """A validated Manifest from a dataset folder, a manifest.json path (local or gs://), or a Manifest."""
    if isinstance(manifest, Manifest):
        return manifest
    if isinstance(manifest, (str, os.PathLike)):
        return _load_manifest(os.fspath(manifest), reader=_gfile_read)
    raise TypeError(f"manifest must be a path or a Manifest, got {type(manifest).__name__}")


def parse_spec(manifest: ManifestLike) -> dict[str, tf.io.FixedLenFeature | tf.io.VarLenFeature]:
    """The tf.io parse spec of every feature the manifest declares (nothing is hand-written).

    Fixed shapes give a FixedLenFeature; variable-length lists (shape [-1]) a VarLenFeature.
    """
    m = load_manifest(manifest)
    media = m.features.get(schema.media_key(m.features))
    if not media or media.get("dtype") != "string":
        raise ManifestError(f"the schema has no image feature: {schema.IMAGE_ENCODED!r} (or "
                            f"{schema.VIDEO_ENCODED!r}) of dtype string is required")
    if schema.LABEL not in m.features:
        raise ManifestError(f"the schema has no label feature {schema.LABEL!r}")
    return {key: feature_spec(key, feature) for key, feature in m.features.items()}


def steps_per_epoch(manifest: ManifestLike, split: SplitLike, global_batch_size: int) -> int:
    """Training steps in one pass over `split` (a name or an expression): records // global_batch_size (partial
    batch dropped)."""
    m = load_manifest(manifest)
    records = m.num_records(split)
    _check_batch(global_batch_size, "global_batch_size")
    steps = records // global_batch_size
    if steps == 0:
        raise ValueError(f"split {split!r} has {records} records, fewer than one global batch of "
                         f"{global_batch_size}; use a smaller batch size")
    return steps


def eval_steps(manifest: ManifestLike, split: SplitLike, global_batch_size: int, num_input_pipelines: int = 1,
               steps_per_execution: int = 1) -> int:
    """Evaluation steps in one pass, in which every input pipeline sees its records exactly once.

    The maximum over pipelines of ceil(records / per-pipeline batch), from the manifest's
    per-shard counts; pipelines holding fewer records pad more. `num_input_pipelines` is the
    number of hosts feeding the accelerators (1 on a single TPU VM such as Kaggle's or Colab's).
    The count is rounded up to a multiple of `steps_per_execution`: Keras runs evaluation in whole
    executions of that many steps, so a pass must be a multiple of it (the extra steps are padding).
    """
    m = load_manifest(manifest)
    selection = m.select(split)
    batch = _per_pipeline_batch(global_batch_size, num_input_pipelines)
    _check_batch(steps_per_execution, "steps_per_execution")
    return _pass_steps(_eval_counts(selection, num_input_pipelines), batch, steps_per_execution)


def _pass_steps(counts: list[int], per_step: int, steps_per_execution: int) -> int:
    """Steps of one evaluation pass: enough for the fullest pipeline, a multiple of steps_per_execution."""
    steps = max(math.ceil(c / per_step) for c in counts) or 1
    return math.ceil(steps / steps_per_execution) * steps_per_execution


# ----------------------------------------------------------------------------- the dataset


def make_dataset(
    manifest: ManifestLike,
    split: SplitLike,
    batch_size: int,
    *,
    training: bool = True,
    image_size: int | Sequence[int] | None = None,
    input_context: tf.distribute.InputContext | None = None,
    seed: int | None = None,
    as_dict: bool = False,
    dtype: Any = tf.float32,
    mean: float | Sequence[float] | None = None,
    std: float | Sequence[float] | None = None,
    random_crop: bool = False,
    random_flip: bool = False,
    shuffle_buffer_size: int | None = None,
    check_files: bool | str = True,
    features: str = "media",
    repeat: bool = True,
    steps_per_execution: int = 1,
    start_step: int | None = None,
    start_example: int | None = None,
) -> tf.data.Dataset:
    """Batches of a split (or a split expression) for this input pipeline, with fully static shapes.

    `split` is a split name, an expression in TFDS's grammar (`"train+validation"`, `"train[:80%]"`,
    `"fold0+fold1"`, `"train[:4shard]"`) or a list of them (their union); see `shard_utils.format.splits`.

    `batch_size` is the size of every batch this dataset yields. Inside
    `strategy.distribute_datasets_from_function` that is the per-replica batch,
    `input_context.get_per_replica_batch_size(global_batch_size)`, as TensorFlow requires: the
    pipeline feeds its `num_replicas_in_sync / num_input_pipelines` local replicas consecutive
    batches, so one step takes batch_size x local replicas records from it. Without a strategy
    (plain Keras, JAX/NumPy per host) it is the batch of this host. Elements are
    `(input, label)` when training, `(input, label, weight)` when evaluating, or dicts when
    `as_dict=True`; a split without labels (an unlabeled build) gives `(input, source_id)` with
    `training=False` (padding: source_id b"", weight 0), every record once per pass; the input is the image
    (`[H, W, 3]`), the video clip (`[N, H, W, 3]`) or, with `features="embedding"`, the precomputed embedding (no media
    decoded). Labels are indices into `manifest.labels` (multi-label: multi-hot float32 vectors). Images are scaled to
    [0, 1], then normalized by `mean`/`std` (per channel, in [0, 1] units) if given. `random_crop` and `random_flip`
    apply only when training, identically to every frame of a clip. Training repeats forever; evaluation repeats its
    exact pass of `eval_steps(...)` batches unless `repeat=False`. Pass Keras' `steps_per_execution` here and to
    `eval_steps` alike.

    `start_step` (0 for a new run) makes training resumable: with a `seed`, global step k holds exactly the
    records `shard_utils.epochs` assigns it, on any number of pipelines, and the dataset starts at step
    `start_step` without reading what came before. After a change of global batch, give `start_example`
    (the examples consumed) instead. See docs/resume.md.

    `check_files` (True) checks this pipeline's shards before any step: local ones record by record, `gs://`
    ones by their stored size and CRC32C; `"framing"` walks the record headers of `gs://` shards too (their
    bytes downloaded once more: for a dataset you do not trust); False checks nothing.
    """
    m = load_manifest(manifest)
    selection = m.select(split)  # an unknown split is said first, before any other argument is judged
    if check_files not in (True, False, "framing"):
        raise ValueError(f"check_files={check_files!r}: give True, False or 'framing'")
    _check_batch(batch_size, "batch_size")
    _check_batch(steps_per_execution, "steps_per_execution")
    if training and not repeat:
        raise ValueError("repeat=False is for evaluation; training data repeats forever (give Keras "
                         "steps_per_epoch(manifest, split, global_batch_size))")
    labeled = _labeled(m, selection, training)
    decoder = RecordDecoder(m, features=features, as_dict=as_dict, training=training, image_size=image_size,
                            dtype=dtype, mean=mean, std=std, random_crop=random_crop, random_flip=random_flip,
                            labeled=labeled)
    n, index, local_replicas = _pipelines(input_context)
    files = _files(m, selection)
    if check_files:
        _check_shards_exist([f[0] for f in files])
    resumable = start_step is not None or start_example is not None
    if check_files and not resumable:  # the resumable input reads records itself, each framing checked
        _check_framing(m, selection, _own_shards(len(files), n, index), remote_headers=check_files == "framing")
    if resumable:
        ds = _resumable_records(m, selection, n, index, seed, batch_size * local_replicas, training,
                                shuffle_buffer_size, start_step, start_example)
        # In order (deterministic map): batch boundaries fall exactly between global steps.
        ds = ds.map(decoder.with_seeds, num_parallel_calls=AUTOTUNE, deterministic=True)
        ds = ds.batch(batch_size, drop_remainder=True)
    elif training:
        ds = _training_records(m, selection, files, n, index, seed, batch_size, shuffle_buffer_size)
        if decoder.needs_seeds:
            # Per-record seeds for the stateless random ops keep the map function pure.
            ds = tf.data.Dataset.zip((ds, tf.data.Dataset.random(seed=seed).batch(2)))
        ds = ds.map(decoder, num_parallel_calls=AUTOTUNE, deterministic=False)
        ds = ds.batch(batch_size, drop_remainder=True)
    else:
        ds = _eval_pass(m, selection, files, n, index, batch_size, local_replicas * steps_per_execution, decoder)
        if repeat:
            ds = ds.repeat()  # the same batches every pass: Keras may keep one iterator across epochs
    if not as_dict:
        ds = ds.map(decoder.to_tuple(with_weight=not training), num_parallel_calls=AUTOTUNE)
    ds = ds.prefetch(AUTOTUNE)
    return ds.with_options(_options(deterministic=resumable or not training, sharded=input_context is not None))


def _labeled(m: Manifest, selection: Selection, training: bool) -> bool:
    """Whether the selected splits have labels; a ValueError when they mix splits with and without labels, or
    when training on splits without (an unlabeled build is read to predict: (image, source_id), each once)."""
    labeled = {m.split(name).labeled for name in selection.splits}
    if len(labeled) > 1:
        raise ValueError(f"{selection.expression!r} mixes splits with labels and without; read them apart")
    if training and labeled == {False}:
        raise ValueError(f"split {selection.expression!r} has no labels (an unlabeled build, e.g. a test set): read "
                         "it with training=False, which gives (image, source_id) batches, each record once")
    return labeled != {False}


def _check_batch(value: int, name: str) -> None:
    """Batch sizes must be positive ints (TPU shapes are static)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _per_pipeline_batch(global_batch_size: int, num_input_pipelines: int) -> int:
    """The global batch divided evenly among input pipelines."""
    _check_batch(global_batch_size, "global_batch_size")
    _check_batch(num_input_pipelines, "num_input_pipelines")
    if global_batch_size % num_input_pipelines:
        raise ValueError(f"global_batch_size {global_batch_size} is not divisible by the "
                         f"{num_input_pipelines} input pipelines")
    return global_batch_size // num_input_pipelines


def _pipelines(input_context: tf.distribute.InputContext | None) -> tuple[int, int, int]:
    """(input pipelines, this pipeline's index, replicas it feeds) from an InputContext, or (1, 0, 1)."""
    if input_context is None:
        return 1, 0, 1
    n, index = int(input_context.num_input_pipelines), int(input_context.input_pipeline_id)
    replicas = int(input_context.num_replicas_in_sync)
    if n < 1 or not 0 <= index < n:
        raise ValueError(f"input_context has input_pipeline_id {index} of {n} pipelines")
    if replicas > n and replicas % n:
        raise ValueError(f"input_context has {replicas} replicas, not divisible by its {n} input pipelines")
    return n, index, max(1, replicas // n)


def _check_shards_exist(paths: list[str]) -> None:
    """One listing per folder (through the storage layer, as the framing check reads): a ManifestError naming
    missing shards before any step runs."""
    missing = []
    by_dir: dict[str, list[str]] = {}
    for p in dict.fromkeys(paths):  # a shard cut by two terms of an expression is listed once
        by_dir.setdefault(posixpath.dirname(p) if "://" in p else os.path.dirname(p), []).append(p)
    for folder, files in by_dir.items():
        try:
            present = set(storage.list_names(folder or "."))
        except storage.StorageError:
            present = set()
        missing += [f for f in files if posixpath.basename(f) not in {x.rstrip("/") for x in present}]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ManifestError(f"{len(missing)} shard file(s) listed in the manifest are missing: {shown}. "
                            "Was the dataset copied completely? `tpu-shards verify` checks every shard.")


def _own_shards(num_shards: int, n: int, index: int) -> list[int]:
    """The shards pipeline `index` of n reads: every n-th from its own, or all when there are fewer than n."""
    return list(range(index, num_shards, n)) if num_shards >= n else list(range(num_shards))


# What one shard read takes: (path, records it yields, first record within the shard, records to take: -1 all).
_File = tuple[str, int, int, int]


def _files(m: Manifest, selection: Selection) -> list[_File]:
    """The reads of a selection, one per piece: whole shards read to their end (a shard holding more records than
    the manifest says then fails), a shard cut by a slice from its first selected record for as many records."""
    if not m.first_format.indexed:  # TFRecordDataset reads TFRecord shards only
        m.shard_paths(selection.splits[0])  # raises: how to read a dataset of ArrayRecord shards only
    out = []
    for piece, whole in zip(selection.pieces, selection.whole, strict=True):
        path = storage.join(m.location, m.splits[piece.split].shards[piece.shard].path)
        out.append((path, piece.num_records, piece.start, -1 if whole else piece.num_records))
    return out


def _shards(m: Manifest, selection: Selection) -> list[Shard]:
    """The shard of each piece of a selection."""
    return [m.splits[p.split].shards[p.shard] for p in selection.pieces]


def _check_framing(m: Manifest, selection: Selection, which: Sequence[int], remote_headers: bool = False) -> None:
    """The shards at positions `which` must be regular files of the manifest's size whose record headers count
    the manifest's records, each inside the file; a ManifestError naming the first that is not. TensorFlow
    would wait forever on a named pipe and allocate (and crash on) whatever length a header gives.

    Local shards: 12 bytes read per record. gs:// shards: their stored size and CRC32C must be the manifest's
    (one metadata request each), so a shard changed since the build is refused without downloading it; with
    `remote_headers` their headers are walked too, through ranged reads of 8 MiB (each shard's bytes once).
    CHECK_THREADS shards at a time."""
    shards, paths = _shards(m, selection), [f[0] for f in _files(m, selection)]

    def check(i: int) -> str | None:
        if "://" in paths[i] and not remote_headers:
            return "; ".join(f"shard {problem}" for problem in stored_problems(paths[i], shards[i])) or None
        return _framing_problem(paths[i], shards[i])

    with ThreadPoolExecutor(max_workers=CHECK_THREADS) as pool:
        found = list(pool.map(check, which))
    for problem in found:
        if problem is not None:
            raise ManifestError(f"{problem}. Run `tpu-shards verify {m.location or '.'}`, then recopy or rebuild the "
                                "dataset")


def _framing_problem(path: str, shard: Shard) -> str | None:
    """Why a shard's size or record headers are not what the manifest says, or None."""
    try:
        with storage.open_read(path) as f:
            size = f.seek(0, os.SEEK_END)
            count = count_from_headers(f, size) if size == shard.num_bytes else None
    except (storage.StorageError, FramingError) as exc:
        return f"shard {path} cannot be read safely: {storage.problem(exc)}"
    if count is None:
        return f"shard {path} holds {size} bytes, the manifest says {shard.num_bytes} bytes"
    if count != shard.num_records:
        return f"shard {path} holds {count} records, the manifest says {shard.num_records} records"
    return None


# ----------------------------------------------------------------------------- reading records


def _read(files: Sequence[_File], dataset: str, deterministic: bool, shuffle_seed: int | None = None,
          shuffle: bool = False) -> tf.data.Dataset:
    """Serialized records of the given shard reads, in parallel (interleaved one record at a time).

    Each shard has its own TFRecordDataset checked against the manifest's record count, so a damaged
    shard raises an error naming it. `shuffle` reorders the shards every epoch.
    """
    paths, counts, starts, takes = zip(*files, strict=True)
    table = tf.data.Dataset.from_tensor_slices((list(paths), *(tf.constant(v, tf.int64) for v in (counts, starts,
                                                                                                   takes))))
    if shuffle:
        table = table.shuffle(len(files), seed=shuffle_seed, reshuffle_each_iteration=True)
    cycle = max(1, min(len(files), _MAX_CYCLE_LENGTH))
    return table.interleave(lambda path, expected, start, take: _checked_shard(path, expected, dataset, start, take),
                            cycle_length=cycle, block_length=1, num_parallel_calls=AUTOTUNE,
                            deterministic=deterministic)


def _checked_shard(path: tf.Tensor, expected: tf.Tensor, dataset: str, start: tf.Tensor | int = 0,
                   take: tf.Tensor | int = -1) -> tf.data.Dataset:
    """A shard's records (`take` of them from record `start`; -1: to its end); at their end, an error naming the
    shard unless exactly `expected` records were read.

    tf.data cannot catch a read error to add the file name, so the shard is read up to its first
    framing (CRC) or read error, and a count short of the manifest's (or beyond it) fails right there.
    """
    records = tf.data.TFRecordDataset(path).ignore_errors(log_warning=False).skip(start).take(take)
    end = tf.data.Dataset.from_tensors((tf.constant(b""), tf.constant(False)))
    marked = records.map(lambda r: (r, tf.constant(True))).concatenate(end)

    def keep(i: tf.Tensor, item: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
        real = item[1]
        check = tf.debugging.Assert(tf.logical_or(real, tf.equal(i, expected)), [
            "shard", path, "is damaged or unreadable: read", i, "of the", expected,
            "records the manifest lists, then hit a corrupted or truncated record or a read error. Run "
            f"`tpu-shards verify {dataset or '.'}` to check every shard, then recopy or rebuild the dataset"])
        with tf.control_dependencies([check]):
            return tf.identity(real)

    return marked.enumerate().filter(keep).map(lambda i, item: item[0])


def _training_records(m: Manifest, selection: Selection, files: list[_File], n: int, index: int,
                      seed: int | None, batch_size: int, buffer: int | None) -> tf.data.Dataset:
    """Shuffled, repeated serialized records of this pipeline's shards (record-level sharding if too few)."""
    name = selection.expression
    if len(files) >= n:
        _warn_uneven_shards(m, selection, n)
        mine = files[index::n]
        # The set of files is fixed by (index, n); only their order changes, every epoch.
        records = _read(mine, m.location, deterministic=False, shuffle_seed=seed, shuffle=True)
        count = sum(f[1] for f in mine)
    else:
        _warn_record_sharding(name, len(files), n)
        # Same order in every pipeline, so the record-level shards are disjoint.
        records = _read(files, m.location, deterministic=True).shard(n, index)
        count = math.ceil(selection.num_records / n)
    if buffer is None:
        avg_bytes = max(1, _selected_bytes(m, selection) // max(1, selection.num_records))
        buffer = min(count, max(_SHUFFLE_MIN, min(_SHUFFLE_MAX, _SHUFFLE_BUDGET_BYTES // avg_bytes)))
    buffer = max(buffer, 1)
    if count < batch_size:
        raise ValueError(f"input pipeline {index} of {n} holds {count} records of split {name!r}, fewer than one "
                         f"batch of {batch_size}; use a smaller batch size")
    return records.repeat().shuffle(buffer, seed=seed, reshuffle_each_iteration=True)


def _selected_bytes(m: Manifest, selection: Selection) -> int:
    """About how many bytes a selection's records hold (a cut shard counted pro rata)."""
    return sum(s.num_bytes * p.num_records // max(1, s.num_records) for p, s in zip(selection.pieces,
                                                                                   _shards(m, selection), strict=True))


def _resumable_records(m: Manifest, selection: Selection, n: int, index: int, seed: int | None, per_step: int,
                       training: bool, buffer: int | None, start_step: int | None,
                       start_example: int | None) -> tf.data.Dataset:
    """(record, seeds) of this pipeline's share (per_step records) of every global step from the start on."""
    if not training:
        raise ValueError("start_step and start_example are for training; an evaluation pass is exact and "
                         "starts over whole, so it needs no position")
    if seed is None:
        raise ValueError("a resumable run needs seed=: the order of every epoch is a function of it (give the "
                         "same seed when resuming)")
    if buffer is not None:
        raise ValueError("shuffle_buffer_size has no effect on a resumable run: every epoch is a full seeded "
                         "permutation; drop it")
    origin, first_step = resume.stream_origin(start_step, start_example)
    share = epochs.share(per_step * n, n, index)
    return loader_resume.training_records(m, selection.expression, seed=seed, share=share, origin=origin,
                                          first_step=first_step)


def _warn_uneven_shards(m: Manifest, selection: Selection, n: int) -> None:
    """Say, in one line, that n pipelines do not divide the shards (or the records of shards cut by a slice)
    evenly and what shuffled training does then."""
    shards = len(selection.pieces)
    division = topology.shard_division(shards, n)
    counts = _eval_counts(selection, n)
    if division is None and max(counts) - min(counts) <= math.ceil(shards / n):  # within ±1 record per shard
        return
    if division is None:
        division = f"they hold {min(counts)} to {max(counts)} records (the expression cuts shards)"
    built = m.tpu or topology.cores_x_hosts(m.num_cores, m.num_hosts)
    warnings.warn(f"split {selection.expression!r} has {shards} shards (built for {built}) for {n} input "
                  f"pipelines: {division}, and each repeats its own, so the records of the pipelines with fewer "
                  "shards are seen more often per pass. For exact epochs on any host count pass seed= and "
                  "start_step= (docs/resume.md), or rebuild with --tpu for this slice", stacklevel=4)


def _warn_record_sharding(split: str, num_shards: int, n: int) -> None:
    """Say why every pipeline reads every shard (as TF Model Garden's InputReader falls back)."""
    warnings.warn(f"split {split!r} has {num_shards} shards for {n} input pipelines: every pipeline reads every "
                  f"shard and keeps 1/{n} of the records (record-level sharding, {n}x the reads). Rebuild with "
                  "--num-hosts set to your host count for file-level sharding.", stacklevel=4)


def _eval_counts(selection: Selection, n: int) -> list[int]:
    """Records each of n pipelines holds in evaluation: whole pieces i -> i % n, else records by index."""
    pieces = selection.pieces
    if len(pieces) >= n:
        return [sum(p.num_records for p in pieces[i::n]) for i in range(n)]
    return [len(range(i, selection.num_records, n)) for i in range(n)]


def _eval_pass(m: Manifest, selection: Selection, files: list[_File], n: int, index: int, batch_size: int,
               batches_per_step: int, decoder: RecordDecoder) -> tf.data.Dataset:
    """One evaluation pass as dict batches: this pipeline's records in a fixed order, then weight-0 padding.

    batches_per_step is local replicas x steps per execution, so the pass is eval_steps(...,
    steps_per_execution) x local replicas batches, the same on every pipeline.
    """
    counts = _eval_counts(selection, n)
    per_step = batch_size * batches_per_step
    steps = _pass_steps(counts, per_step, 1)  # in whole executions
    if len(files) >= n:
        records = _read(files[index::n], m.location, deterministic=True)
    else:
        _warn_record_sharding(selection.expression, len(files), n)
        records = _read(files, m.location, deterministic=True).shard(n, index)
    ds = records.map(decoder, num_parallel_calls=AUTOTUNE, deterministic=True)
    pad = steps * per_step - counts[index]
    if pad:
        ds = ds.concatenate(tf.data.Dataset.from_tensors(_padding_element(ds.element_spec)).repeat(pad))
    # The per-shard checks guarantee the count; this declares it (len(), Keras progress bars).
    batches = steps * batches_per_step
    return ds.batch(batch_size, drop_remainder=True).apply(tf.data.experimental.assert_cardinality(batches))


def _padding_element(element_spec: dict[str, tf.TensorSpec]) -> dict[str, tf.Tensor]:
    """A zero element shaped like a real one: weight 0, zero pixels and label (multi-hot: no class), "" strings."""
    return {k: tf.zeros(s.shape, s.dtype) for k, s in element_spec.items()}


def _options(deterministic: bool, sharded: bool) -> tf.data.Options:
    """Autotuned parallelism; order not guaranteed when training unless resumable; no auto-sharding when we
    sharded ourselves."""
    options = tf.data.Options()
    options.deterministic = deterministic
    options.autotune.enabled = True
    if sharded:
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return options
