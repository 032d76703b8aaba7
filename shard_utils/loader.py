"""The TPU-ready loader: a tf.data pipeline built from a dataset's manifest.

`make_dataset` turns a manifest (path or object) and a split into batches with fully
static shapes: images float32 (or bfloat16) `[B, H, W, 3]` scaled to [0, 1], labels
int32 `[B]`. Training mode shards files per input pipeline, reads in parallel without
order guarantees, shuffles serialized records, repeats and drops the last partial
batch. Evaluation mode reads every record of the split exactly once across all
pipelines and pads each pipeline to exactly `eval_steps` steps, with a weight of 1
for real examples and 0 for padding, so TPU evaluation neither hangs nor miscounts.

Only TensorFlow is needed (plus numpy and the manifest/schema modules); `gs://` paths
are read through TensorFlow's own filesystem.
"""
from __future__ import annotations

import math
import os
import posixpath
import warnings
from collections.abc import Sequence
from typing import Any, Union

import tensorflow as tf

from . import schema
from .manifest import Manifest, ManifestError
from .manifest import load as _load_manifest

AUTOTUNE = tf.data.AUTOTUNE
ManifestLike = Union[str, "os.PathLike[str]", Manifest]

_TF_DTYPES = {"string": tf.string, "int64": tf.int64, "float32": tf.float32}
_IMAGE_DTYPES = {"float32": tf.float32, "bfloat16": tf.bfloat16}
# Serialized records held by the training shuffle buffer, as a memory budget (bytes) and bounds (records).
_SHUFFLE_BUDGET_BYTES = 256 * 2**20
_SHUFFLE_MIN, _SHUFFLE_MAX = 1024, 16384
_MAX_CYCLE_LENGTH = 16
# Inception-style random crop (tensorflow/tpu ResNet preprocessing defaults).
_CROP_AREA = (0.08, 1.0)
_CROP_ASPECT = (3 / 4, 4 / 3)


# ----------------------------------------------------------------------------- manifest access


def _gfile_read(path: str) -> bytes:
    """Read a whole file through TensorFlow's filesystem (local paths and gs://)."""
    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read()


def load_manifest(manifest: ManifestLike) -> Manifest:
    """A validated Manifest from a dataset folder, a manifest.json path (local or gs://), or a Manifest."""
    if isinstance(manifest, Manifest):
        return manifest
    if isinstance(manifest, (str, os.PathLike)):
        return _load_manifest(os.fspath(manifest), reader=_gfile_read)
    raise TypeError(f"manifest must be a path or a Manifest, got {type(manifest).__name__}")


def parse_spec(manifest: ManifestLike) -> dict[str, tf.io.FixedLenFeature]:
    """The tf.io parse spec of every feature the manifest declares (nothing is hand-written)."""
    m = load_manifest(manifest)
    image = m.features.get(schema.IMAGE_ENCODED)
    if not image or image.get("dtype") != "string":
        raise ManifestError(f"the schema has no image feature: {schema.IMAGE_ENCODED!r} of dtype string is required")
    if schema.LABEL not in m.features:
        raise ManifestError(f"the schema has no label feature {schema.LABEL!r}")
    spec = {}
    for key, feature in m.features.items():
        if feature.get("dtype") not in _TF_DTYPES:
            raise ManifestError(f"feature {key!r} has dtype {feature.get('dtype')!r}; "
                                f"the loader reads {', '.join(_TF_DTYPES)}")
        spec[key] = tf.io.FixedLenFeature(list(feature.get("shape", [])), _TF_DTYPES[feature["dtype"]])
    return spec


def steps_per_epoch(manifest: ManifestLike, split: str, global_batch_size: int) -> int:
    """Training steps in one pass over `split`: num_records // global_batch_size (partial batch dropped)."""
    m = load_manifest(manifest)
    _check_batch(global_batch_size, "global_batch_size")
    steps = m.num_records(split) // global_batch_size
    if steps == 0:
        raise ValueError(f"split {split!r} has {m.num_records(split)} records, fewer than one global batch of "
                         f"{global_batch_size}; use a smaller batch size")
    return steps


def eval_steps(manifest: ManifestLike, split: str, global_batch_size: int, num_input_pipelines: int = 1) -> int:
    """Evaluation batches every input pipeline yields so the whole split is seen exactly once.

    The maximum over pipelines of ceil(records / per-pipeline batch), from the manifest's
    per-shard counts; pipelines holding fewer records pad more. `num_input_pipelines` is the
    number of hosts feeding the accelerators (1 on a single TPU VM such as Kaggle's or Colab's).
    """
    m = load_manifest(manifest)
    batch = _per_pipeline_batch(global_batch_size, num_input_pipelines)
    counts = _eval_counts(m, split, num_input_pipelines)
    return max(math.ceil(c / batch) for c in counts) or 1


# ----------------------------------------------------------------------------- the dataset


def make_dataset(
    manifest: ManifestLike,
    split: str,
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
    check_files: bool = True,
) -> tf.data.Dataset:
    """Batches of one split for this input pipeline, with fully static shapes.

    `batch_size` is the size of every batch this dataset yields. Inside
    `strategy.distribute_datasets_from_function` that is the per-replica batch,
    `input_context.get_per_replica_batch_size(global_batch_size)`, as TensorFlow requires: the
    pipeline feeds its `num_replicas_in_sync / num_input_pipelines` local replicas consecutive
    batches, so one step takes batch_size x local replicas records from it. Without a strategy
    (plain Keras, JAX/NumPy per host) it is the batch of this host. Elements are
    `(image, label)` when training, `(image, label, weight)` when evaluating, or dicts with
    `image`, `label`, `source_id`, `weight` when `as_dict=True`. Images are scaled to [0, 1],
    then normalized by `mean`/`std` (per channel, in [0, 1] units) if given. `random_crop`
    and `random_flip` apply only when training.
    """
    m = load_manifest(manifest)
    _check_batch(batch_size, "batch_size")
    size = _target_size(m, image_size)
    image_dtype = _image_dtype(dtype)
    n, index, local_replicas = _pipelines(input_context)
    paths = m.shard_paths(split)
    if check_files:
        _check_shards_exist(paths)
    keys = [schema.IMAGE_ENCODED, schema.LABEL] + ([schema.SOURCE_ID] if as_dict else [])
    full_spec = parse_spec(m)
    spec = {k: full_spec[k] for k in keys if k in full_spec}
    norm = _normalizer(mean, std)
    if training:
        ds = _training_records(m, split, paths, n, index, seed, batch_size, shuffle_buffer_size)
        decode = _decoder(spec, size, image_dtype, norm, as_dict, training=True,
                          random_crop=random_crop, random_flip=random_flip)
        if random_crop or random_flip:
            # Per-record seeds for the stateless random ops keep the map function pure.
            ds = tf.data.Dataset.zip((ds, tf.data.Dataset.random(seed=seed).batch(2)))
            ds = ds.map(decode, num_parallel_calls=AUTOTUNE, deterministic=False)
        else:
            ds = ds.map(lambda record: decode(record, None), num_parallel_calls=AUTOTUNE, deterministic=False)
        ds = ds.batch(batch_size, drop_remainder=True)
    else:
        ds = _eval_records(m, split, paths, n, index, batch_size, local_replicas, spec, size, image_dtype, norm,
                           as_dict)
    ds = ds.prefetch(AUTOTUNE)
    return ds.with_options(_options(training, sharded=input_context is not None))


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


def _target_size(m: Manifest, image_size: int | Sequence[int] | None) -> tuple[int, int]:
    """(height, width) of the output: as asked, else the manifest's fixed size, else a clear error."""
    if image_size is None:
        if m.image_size is None:
            raise ValueError("this dataset's images vary in size (its manifest records no image_size), and TPUs need "
                             "static shapes: pass image_size=(height, width), e.g. image_size=224")
        return int(m.image_size[0]), int(m.image_size[1])
    hw = [image_size, image_size] if isinstance(image_size, int) else list(image_size)
    if len(hw) != 2 or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in hw):
        raise ValueError(f"image_size must be a positive int or (height, width), got {image_size!r}")
    return hw[0], hw[1]


def _image_dtype(dtype: Any) -> tf.DType:
    """float32 or bfloat16, given as a tf.DType or its name."""
    name = getattr(dtype, "name", dtype)
    if name not in _IMAGE_DTYPES:
        raise ValueError(f"dtype must be float32 or bfloat16, got {dtype!r}")
    return _IMAGE_DTYPES[name]


def _check_shards_exist(paths: list[str]) -> None:
    """One listing per folder: a ManifestError naming missing shards before any step runs."""
    missing = []
    by_dir: dict[str, list[str]] = {}
    for p in paths:
        by_dir.setdefault(posixpath.dirname(p) if "://" in p else os.path.dirname(p), []).append(p)
    for folder, files in by_dir.items():
        try:
            present = set(tf.io.gfile.listdir(folder or "."))
        except tf.errors.OpError:
            present = set()
        missing += [f for f in files if posixpath.basename(f) not in {x.rstrip("/") for x in present}]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ManifestError(f"{len(missing)} shard file(s) listed in the manifest are missing: {shown}. "
                            "Was the dataset copied completely? `tpu-shards verify` checks every shard.")


# ----------------------------------------------------------------------------- reading records


def _read(files: tf.data.Dataset, num_files: int, deterministic: bool) -> tf.data.Dataset:
    """Serialized records from a dataset of file names, read in parallel (interleaved one record at a time)."""
    cycle = max(1, min(num_files, _MAX_CYCLE_LENGTH))
    return files.interleave(tf.data.TFRecordDataset, cycle_length=cycle, block_length=1,
                            num_parallel_calls=AUTOTUNE, deterministic=deterministic)


def _training_records(m: Manifest, split: str, paths: list[str], n: int, index: int, seed: int | None,
                      batch_size: int, buffer: int | None) -> tf.data.Dataset:
    """Shuffled, repeated serialized records of this pipeline's shards (record-level sharding if too few)."""
    shards = m.split(split).shards
    if len(paths) >= n:
        mine = list(range(index, len(paths), n))
        files = tf.data.Dataset.from_tensor_slices([paths[i] for i in mine])
        # The set of files is fixed by (index, n); only their order changes, every epoch.
        files = files.shuffle(len(mine), seed=seed, reshuffle_each_iteration=True)
        records = _read(files, len(mine), deterministic=False)
        count = sum(shards[i].num_records for i in mine)
    else:
        _warn_record_sharding(split, len(paths), n)
        # Same order in every pipeline, so the record-level shards are disjoint.
        records = _read(tf.data.Dataset.from_tensor_slices(paths), len(paths), deterministic=True).shard(n, index)
        count = math.ceil(m.num_records(split) / n)
    avg_bytes = max(1, m.split(split).num_bytes // max(1, m.num_records(split)))
    if buffer is None:
        buffer = min(count, max(_SHUFFLE_MIN, min(_SHUFFLE_MAX, _SHUFFLE_BUDGET_BYTES // avg_bytes)))
    buffer = max(buffer, 1)
    if count < batch_size:
        raise ValueError(f"input pipeline {index} of {n} holds {count} records of split {split!r}, fewer than one "
                         f"batch of {batch_size}; use a smaller batch size")
    return records.repeat().shuffle(buffer, seed=seed, reshuffle_each_iteration=True)


def _warn_record_sharding(split: str, num_shards: int, n: int) -> None:
    """Say why every pipeline reads every shard (as TF Model Garden's InputReader falls back)."""
    warnings.warn(f"split {split!r} has {num_shards} shards for {n} input pipelines: every pipeline reads every "
                  f"shard and keeps 1/{n} of the records (record-level sharding, {n}x the reads). Rebuild with "
                  "--num-hosts set to your host count for file-level sharding.", stacklevel=4)


def _eval_counts(m: Manifest, split: str, n: int) -> list[int]:
    """Records each of n pipelines holds in evaluation: whole shards i -> i % n, else records by index."""
    shards = m.split(split).shards
    if len(shards) >= n:
        return [sum(s.num_records for s in shards[i::n]) for i in range(n)]
    total = m.num_records(split)
    return [len(range(i, total, n)) for i in range(n)]


def _eval_records(m: Manifest, split: str, paths: list[str], n: int, index: int, batch_size: int,
                  local_replicas: int, spec: dict, size: tuple[int, int], image_dtype: tf.DType, norm,
                  as_dict: bool) -> tf.data.Dataset:
    """eval_steps x local_replicas batches: this pipeline's records in a fixed order, then weight-0 padding."""
    counts = _eval_counts(m, split, n)
    per_step = batch_size * local_replicas
    steps = max(math.ceil(c / per_step) for c in counts) or 1
    if len(paths) >= n:
        mine = paths[index::n]
        records = _read(tf.data.Dataset.from_tensor_slices(mine), len(mine), deterministic=True)
    else:
        _warn_record_sharding(split, len(paths), n)
        records = _read(tf.data.Dataset.from_tensor_slices(paths), len(paths), deterministic=True).shard(n, index)
    # A shard whose record count differs from the manifest fails loudly instead of skewing the step count.
    records = records.apply(tf.data.experimental.assert_cardinality(counts[index]))
    decode = _decoder(spec, size, image_dtype, norm, as_dict=True, training=False)
    ds = records.map(lambda r: decode(r, None), num_parallel_calls=AUTOTUNE, deterministic=True)
    pad = steps * per_step - counts[index]
    if pad:
        ds = ds.concatenate(tf.data.Dataset.from_tensors(_padding_element(ds.element_spec)).repeat(pad))
    ds = ds.batch(batch_size, drop_remainder=True)
    if not as_dict:
        ds = ds.map(lambda d: (d["image"], d["label"], d["weight"]), num_parallel_calls=AUTOTUNE)
    return ds


def _padding_element(element_spec: dict[str, tf.TensorSpec]) -> dict[str, tf.Tensor]:
    """A zero element shaped like a real one, with weight 0 (label 0, empty source_id)."""
    return {k: tf.zeros(s.shape, s.dtype) for k, s in element_spec.items()}


def _options(training: bool, sharded: bool) -> tf.data.Options:
    """Autotuned parallelism; order not guaranteed when training; no auto-sharding when we sharded ourselves."""
    options = tf.data.Options()
    options.deterministic = not training
    options.autotune.enabled = True
    if sharded:
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return options


# ----------------------------------------------------------------------------- decoding


def _normalizer(mean: float | Sequence[float] | None, std: float | Sequence[float] | None):
    """(mean, std) as 3 per-channel floats (or None when neither is given), validated."""
    if mean is None and std is None:
        return None
    mean = [0.0] if mean is None else [mean] if isinstance(mean, (int, float)) else list(mean)
    std = [1.0] if std is None else [std] if isinstance(std, (int, float)) else list(std)
    if len(mean) not in (1, 3) or len(std) not in (1, 3) or any(s <= 0 for s in std):
        raise ValueError(f"mean and std must have 1 or 3 values, std > 0; got mean={mean}, std={std}")
    return (mean * 3 if len(mean) == 1 else mean), (std * 3 if len(std) == 1 else std)


def _decoder(spec: dict, size: tuple[int, int], image_dtype: tf.DType, norm, as_dict: bool, training: bool,
             random_crop: bool = False, random_flip: bool = False):
    """The per-record map function: parse only the used features, decode, crop/flip, resize, scale."""
    height, width = size
    crop = training and random_crop
    flip = training and random_flip

    def decode(serialized: tf.Tensor, seeds: tf.Tensor | None):
        features = tf.io.parse_single_example(serialized, spec)
        encoded = features[schema.IMAGE_ENCODED]
        if crop:
            image = _decode_random_crop(encoded, seeds)
        else:
            image = tf.io.decode_jpeg(encoded, channels=3)
        image = _resize(image, height, width)
        if flip:
            image = tf.image.stateless_random_flip_left_right(image, seed=tf.stack([seeds[1], seeds[0]]))
        image = image / 255.0
        if norm is not None:
            image = (image - tf.constant(norm[0], tf.float32)) / tf.constant(norm[1], tf.float32)
        image = tf.cast(image, image_dtype)
        label = tf.cast(features[schema.LABEL], tf.int32)
        if not as_dict:
            return image, label
        source = features.get(schema.SOURCE_ID, tf.constant(b""))
        return {"image": image, "label": label, "source_id": source, "weight": tf.constant(1.0, tf.float32)}

    return decode


def _resize(image: tf.Tensor, height: int, width: int) -> tf.Tensor:
    """float32 [height, width, 3] in [0, 255]; images already that size skip the resize."""
    shape = tf.shape(image)
    same = tf.logical_and(tf.equal(shape[0], height), tf.equal(shape[1], width))
    image = tf.cond(same, lambda: tf.cast(image, tf.float32),
                    lambda: tf.image.resize(image, [height, width], method="bilinear"))
    return tf.ensure_shape(image, [height, width, 3])


def _decode_random_crop(encoded: tf.Tensor, seeds: tf.Tensor) -> tf.Tensor:
    """Decode only an Inception-style random crop (area 8-100 %, aspect 3/4-4/3) of a JPEG."""
    shape = tf.io.extract_jpeg_shape(encoded)
    begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape, bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, [1, 1, 4]), seed=seeds,
        min_object_covered=0.1, aspect_ratio_range=_CROP_ASPECT, area_range=_CROP_AREA, max_attempts=10,
        use_image_if_no_bounding_boxes=True)
    window = tf.stack([begin[0], begin[1], crop_size[0], crop_size[1]])
    return tf.io.decode_and_crop_jpeg(encoded, window, channels=3)
