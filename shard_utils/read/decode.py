"""Per-record decoding for the loader: one serialized tf.train.Example -> a dict of statically shaped tensors.

Everything is derived from the manifest's feature table: images or video frames (decoded, optionally
cropped and flipped, resized, scaled), labels (0-based: the manifest's `label_offset` is subtracted;
multi-label datasets give a multi-hot vector), extra listing columns (lists padded to `max_length`)
and precomputed embeddings. Only TensorFlow is needed.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from shard_utils.format import schema
from shard_utils.format.manifest import Manifest, ManifestError
from shard_utils.read.shapes import target_size

__all__ = ["FEATURE_MODES", "LENGTH_SUFFIX", "feature_spec", "image_dtype", "normalizer", "RecordDecoder"]

FEATURE_MODES = ("media", "embedding")  # what `features=` selects as the model input
LENGTH_SUFFIX = "/length"  # an extra list's length: extra/<name>/length
_TF_DTYPES = {"string": tf.string, "int64": tf.int64, "float32": tf.float32}
_IMAGE_DTYPES = {"float32": tf.float32, "bfloat16": tf.bfloat16}
_PAD = {"string": b"", "int64": 0, "float32": 0.0}  # padding of extra lists (their length tensor says where)
# Inception-style random crop (tensorflow/tpu ResNet preprocessing defaults).
_CROP_AREA = (0.08, 1.0)
_CROP_ASPECT = (3 / 4, 4 / 3)


def feature_spec(key: str, entry: dict[str, Any]) -> tf.io.FixedLenFeature | tf.io.VarLenFeature:
    """The tf.io parse spec of one manifest feature: fixed shape, or a variable-length list (shape [-1])."""
    if entry.get("dtype") not in _TF_DTYPES:
        raise ManifestError(f"feature {key!r} has dtype {entry.get('dtype')!r}; "
                            f"the loader reads {', '.join(_TF_DTYPES)}")
    shape = list(entry.get("shape", []))
    if shape == [schema.VARIABLE]:
        return tf.io.VarLenFeature(_TF_DTYPES[entry["dtype"]])
    return tf.io.FixedLenFeature(shape, _TF_DTYPES[entry["dtype"]])


def image_dtype(dtype: Any) -> tf.DType:
    """float32 or bfloat16, given as a tf.DType or its name."""
    name = getattr(dtype, "name", dtype)
    if name not in _IMAGE_DTYPES:
        raise ValueError(f"dtype must be float32 or bfloat16, got {dtype!r}")
    return _IMAGE_DTYPES[name]


def normalizer(mean: float | Sequence[float] | None, std: float | Sequence[float] | None):
    """(mean, std) as 3 per-channel floats (or None when neither is given), validated."""
    if mean is None and std is None:
        return None
    mean = [0.0] if mean is None else [mean] if isinstance(mean, (int, float)) else list(mean)
    std = [1.0] if std is None else [std] if isinstance(std, (int, float)) else list(std)
    if len(mean) not in (1, 3) or len(std) not in (1, 3) or any(s <= 0 for s in std):
        raise ValueError(f"mean and std must have 1 or 3 values, std > 0; got mean={mean}, std={std}")
    return (mean * 3 if len(mean) == 1 else mean), (std * 3 if len(std) == 1 else std)


class RecordDecoder:
    """The loader's map function for one dataset and one set of make_dataset options.

    Calling it on a serialized record (and, for augmentation, a pair of int64 seeds) returns a dict with
    the model input under `input_key` ("image", "video" or "embedding"), "label" and "weight" (1.0), plus
    "source_id", extras and the embedding when `as_dict`. Only the features used are parsed. A split without
    labels (`labeled=False`) gives "source_id" in place of "label".
    """

    def __init__(self, m: Manifest, *, features: str = "media", as_dict: bool = False, training: bool = True,
                 image_size: int | Sequence[int] | None = None, dtype: Any = tf.float32,
                 mean: float | Sequence[float] | None = None, std: float | Sequence[float] | None = None,
                 random_crop: bool = False, random_flip: bool = False, labeled: bool = True) -> None:
        if features not in FEATURE_MODES:
            raise ValueError(f"features must be one of {', '.join(map(repr, FEATURE_MODES))}, got {features!r}")
        self.media_key = schema.media_key(m.features)
        if m.features.get(self.media_key, {}).get("dtype") != "string":
            raise ManifestError(f"the schema has no image feature: {schema.IMAGE_ENCODED!r} (or "
                                f"{schema.VIDEO_ENCODED!r}) of dtype string is required")
        if schema.LABEL not in m.features:
            raise ManifestError(f"the schema has no label feature {schema.LABEL!r}")
        self.video = self.media_key == schema.VIDEO_ENCODED
        self.media_name = "video" if self.video else "image"
        self.embedding_key = _embedding_key(m)
        self.use_media = features == "media"
        if not self.use_media and self.embedding_key is None:
            raise ValueError("features='embedding' needs a dataset built with embeddings; this manifest has none")
        if not self.use_media and (random_crop or random_flip):
            raise ValueError("random_crop and random_flip apply to images; features='embedding' decodes none")
        self.input_key = self.media_name if self.use_media else "embedding"
        self.as_dict = as_dict
        self.labeled = labeled
        self.crop, self.flip = training and random_crop, training and random_flip
        self.size = target_size(m, image_size) if self.use_media else None
        self.dtype = image_dtype(dtype)
        self.norm = normalizer(mean, std)
        self.num_classes = m.num_classes
        self.multi_label = m.features[schema.LABEL].get("shape") == [schema.VARIABLE]
        self.label_offset = int(m.label_offset)
        extras = {k: dict(v) for k, v in m.features.items() if k.startswith(schema.EXTRA_PREFIX)}
        self.extras = extras if as_dict else {}
        _check_extra_names(self.extras)
        keys = [schema.LABEL] if labeled else []
        keys += [self.media_key] if self.use_media else []
        keys += [self.embedding_key] if self.embedding_key and (as_dict or not self.use_media) else []
        keys += [schema.SOURCE_ID] if (as_dict or not labeled) and schema.SOURCE_ID in m.features else []
        keys += list(self.extras)
        self.spec = {k: feature_spec(k, m.features[k]) for k in keys}

    @property
    def needs_seeds(self) -> bool:
        """Whether the map function takes per-record seeds (random crop or flip)."""
        return self.crop or self.flip

    def __call__(self, serialized: tf.Tensor, seeds: tf.Tensor | None = None) -> dict[str, tf.Tensor]:
        parsed = tf.io.parse_single_example(serialized, self.spec)
        out = {"label": self._label(parsed[schema.LABEL])} if self.labeled else {}
        if self.use_media:
            encoded = parsed[self.media_key]
            out[self.input_key] = self._video(encoded, seeds) if self.video else self._image(encoded, seeds)
        if self.embedding_key in parsed:
            out["embedding"] = parsed[self.embedding_key]
        if self.as_dict or not self.labeled:
            out["source_id"] = parsed.get(schema.SOURCE_ID, tf.constant(b""))
            for key, entry in self.extras.items():
                out.update(_extra(key, entry, parsed[key]))
        out["weight"] = tf.constant(1.0, tf.float32)
        return out

    def with_seeds(self, serialized: tf.Tensor, seeds: tf.Tensor) -> dict[str, tf.Tensor]:
        """The map function for (record, seeds) pairs: seeds are used only when augmenting."""
        return self(serialized, seeds if self.needs_seeds else None)

    def to_tuple(self, with_weight: bool):
        """Map function from batched dicts to (input, label) or (input, label, weight); (input, source_id) for a
        split without labels (padding has source_id b"")."""
        key = self.input_key

        def select(d: dict[str, tf.Tensor]) -> tuple:
            if not self.labeled:
                return d[key], d["source_id"]
            return (d[key], d["label"], d["weight"]) if with_weight else (d[key], d["label"])

        return select

    # ------------------------------------------------------------------------- labels

    def _label(self, value: tf.Tensor | tf.SparseTensor) -> tf.Tensor:
        """int32 index into manifest.labels, or (multi-label) a float32 multi-hot vector of num_classes."""
        ids = value.values if self.multi_label else value
        ids = ids - self.label_offset
        valid = tf.reduce_all(tf.logical_and(ids >= 0, ids < self.num_classes))
        # Assert formats its data only when it fails, so valid records pay for the comparison alone.
        check = tf.debugging.Assert(valid, [
            "a record's label id(s)", ids, f"fall outside 0..{self.num_classes - 1} after subtracting label_offset "
            f"{self.label_offset}: the manifest's labels or label_offset do not match the shards"])
        with tf.control_dependencies([check]):
            ids = tf.identity(ids)
        if not self.multi_label:
            return tf.cast(ids, tf.int32)
        return tf.minimum(tf.reduce_sum(tf.one_hot(ids, self.num_classes, dtype=tf.float32), axis=0), 1.0)

    # ------------------------------------------------------------------------- media

    def _image(self, encoded: tf.Tensor, seeds: tf.Tensor | None) -> tf.Tensor:
        """[H, W, 3] in the output dtype: decoded (or crop-decoded), resized, flipped, scaled, normalized."""
        image = _decode_crop(encoded, _crop_window(encoded, seeds)) if self.crop else tf.io.decode_jpeg(encoded, 3)
        image = _resize(image, *self.size)
        if self.flip:
            image = tf.image.stateless_random_flip_left_right(image, seed=_flip_seed(seeds))
        return self._scale(image)

    def _video(self, frames: tf.Tensor, seeds: tf.Tensor | None) -> tf.Tensor:
        """[N, H, W, 3]: every frame of a clip gets the same crop window and the same flip."""
        height, width = self.size
        window = _crop_window(frames[0], seeds) if self.crop else None

        def frame(encoded: tf.Tensor) -> tf.Tensor:
            image = _decode_crop(encoded, window) if window is not None else tf.io.decode_jpeg(encoded, 3)
            return _resize(image, height, width)

        video = tf.map_fn(frame, frames, fn_output_signature=tf.TensorSpec([height, width, 3], tf.float32))
        if self.flip:
            flip = tf.random.stateless_uniform([], seed=_flip_seed(seeds)) < 0.5
            video = tf.cond(flip, lambda: tf.reverse(video, axis=[2]), lambda: video)
        return self._scale(video)

    def _scale(self, pixels: tf.Tensor) -> tf.Tensor:
        """[0, 255] float32 -> [0, 1], then (x - mean) / std if given, in the output dtype."""
        pixels = pixels / 255.0
        if self.norm is not None:
            pixels = (pixels - tf.constant(self.norm[0], tf.float32)) / tf.constant(self.norm[1], tf.float32)
        return tf.cast(pixels, self.dtype)


def _embedding_key(m: Manifest) -> str | None:
    """The embedding feature's key, checked to be float32 of a fixed shape, or None."""
    if not m.embedding:
        return None
    key = m.embedding.get("key")
    entry = m.features.get(key, {})
    if entry.get("dtype") != "float32" or schema.VARIABLE in entry.get("shape", [schema.VARIABLE]):
        raise ManifestError(f"embedding feature {key!r} must be float32 with a fixed shape, got {entry!r}")
    return key


def _check_extra_names(extras: dict[str, dict[str, Any]]) -> None:
    """An extra list's length key must not be another column's name."""
    for key, entry in extras.items():
        if entry.get("shape") == [schema.VARIABLE] and key + LENGTH_SUFFIX in extras:
            raise ManifestError(f"extra columns {key!r} and {key + LENGTH_SUFFIX!r} collide: the loader returns the "
                                f"length of list {key!r} as {key + LENGTH_SUFFIX!r}; rename the column")


def _extra(key: str, entry: dict[str, Any], value: tf.Tensor | tf.SparseTensor) -> dict[str, tf.Tensor]:
    """A scalar extra as is; a list padded to its max_length, plus its length under key + '/length'."""
    if not isinstance(value, tf.SparseTensor):
        return {key: value}
    max_length = int(entry["max_length"])
    length = tf.size(value.values, out_type=tf.int32)
    check = tf.debugging.Assert(length <= max_length, [
        "a record has", length, f"values in {key}, more than the manifest's max_length {max_length}: the manifest "
        "does not match the shards"])
    with tf.control_dependencies([check]):
        sized = tf.SparseTensor(value.indices, value.values, [max_length])
        dense = tf.sparse.to_dense(sized, default_value=_PAD[entry["dtype"]])
    return {key: tf.reshape(dense, [max_length]), key + LENGTH_SUFFIX: length}


def _flip_seed(seeds: tf.Tensor) -> tf.Tensor:
    """The flip's stateless seed, distinct from the crop's."""
    return tf.stack([seeds[1], seeds[0]])


def _resize(image: tf.Tensor, height: int, width: int) -> tf.Tensor:
    """float32 [height, width, 3] in [0, 255]; images already that size skip the resize."""
    shape = tf.shape(image)
    same = tf.logical_and(tf.equal(shape[0], height), tf.equal(shape[1], width))
    image = tf.cond(same, lambda: tf.cast(image, tf.float32),
                    lambda: tf.image.resize(image, [height, width], method="bilinear"))
    return tf.ensure_shape(image, [height, width, 3])


def _crop_window(encoded: tf.Tensor, seeds: tf.Tensor) -> tf.Tensor:
    """An Inception-style random crop window (area 8-100 %, aspect 3/4-4/3) of a JPEG, from its header."""
    shape = tf.io.extract_jpeg_shape(encoded)
    begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape, bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, [1, 1, 4]), seed=seeds,
        min_object_covered=0.1, aspect_ratio_range=_CROP_ASPECT, area_range=_CROP_AREA, max_attempts=10,
        use_image_if_no_bounding_boxes=True)
    return tf.stack([begin[0], begin[1], crop_size[0], crop_size[1]])


def _decode_crop(encoded: tf.Tensor, window: tf.Tensor) -> tf.Tensor:
    """Decode only the crop window of a JPEG."""
    return tf.io.decode_and_crop_jpeg(encoded, window, channels=3)
