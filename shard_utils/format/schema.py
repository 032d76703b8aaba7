"""The record schema: tf.train.Example feature keys, encoding, and the parse spec.

The keys follow the tensorflow/tpu and TF Model Garden image pipelines, so their
readers work on our shards unchanged. Encoding uses the protobuf runtime with the
Example message declared in a private descriptor pool: workers that only write
records never import TensorFlow, and the bytes are the same as TF's own
`tf.train.Example(...).SerializeToString(deterministic=True)`.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from shard_utils.format import example_bytes
from shard_utils.format.example_bytes import BYTES, FLOAT, INT64

__all__ = [
    "IMAGE_ENCODED", "IMAGE_FORMAT", "IMAGE_HEIGHT", "IMAGE_WIDTH", "IMAGE_CHANNELS", "LABEL", "LABEL_TEXT",
    "SOURCE_ID", "SHA256", "VIDEO_ENCODED", "VIDEO_NUM_FRAMES", "VIDEO_FRAME_RATE", "EMBEDDING", "EXTRA_PREFIX",
    "VARIABLE", "MAX_FEATURE_VALUES", "NO_LABEL", "FEATURES", "DTYPES", "Example", "ExtraValue", "ExtraSpec",
    "ImageRecord", "label_ids_of", "encode_example", "example_parts", "record_features", "decode_example",
    "decode_lists", "decode_fields", "feature_table", "media_key", "check_features"
]

IMAGE_ENCODED = "image/encoded"
IMAGE_FORMAT = "image/format"
IMAGE_HEIGHT = "image/height"
IMAGE_WIDTH = "image/width"
IMAGE_CHANNELS = "image/channels"
LABEL = "image/class/label"
LABEL_TEXT = "image/class/text"
SOURCE_ID = "image/source_id"
SHA256 = "image/key/sha256"
VIDEO_ENCODED = "video/encoded"  # the clip's sampled frames, each a JPEG
VIDEO_NUM_FRAMES = "video/num_frames"
VIDEO_FRAME_RATE = "video/frame_rate"
EMBEDDING = "image/embedding"  # default key of a model's output per image (video: per frame, flattened)
EXTRA_PREFIX = "extra/"  # listing columns carried into records: extra/<name>
VARIABLE = -1  # a list feature's shape [-1]: variable length, with "max_length" in the manifest
MAX_FEATURE_VALUES = 1 << 24  # values of one feature in one record, as a manifest may declare them
# The label id of a record without a label (an unlabeled build, e.g. a Kaggle test folder). It is stored, plus the
# manifest's label_offset, in image/class/label (with an empty image/class/text), so every reader's fixed
# int64 parse spec still parses the record; readers that know it give such records no label.
NO_LABEL = -1

# key -> (manifest dtype, shape) of a single-label image dataset: what every build wrote before
# multi-label, extras, video and embeddings. `feature_table` gives the table of any dataset.
FEATURES: dict[str, dict[str, Any]] = {
    IMAGE_ENCODED: {"dtype": "string", "shape": []},
    IMAGE_FORMAT: {"dtype": "string", "shape": []},
    IMAGE_HEIGHT: {"dtype": "int64", "shape": []},
    IMAGE_WIDTH: {"dtype": "int64", "shape": []},
    IMAGE_CHANNELS: {"dtype": "int64", "shape": []},
    LABEL: {"dtype": "int64", "shape": []},
    LABEL_TEXT: {"dtype": "string", "shape": []},
    SOURCE_ID: {"dtype": "string", "shape": []},
    SHA256: {"dtype": "string", "shape": []},
}
DTYPES = ("string", "int64", "float32")


def _example_classes():
    """Declare tensorflow/core/example/{feature,example}.proto in a private pool."""
    fdp = descriptor_pb2.FileDescriptorProto(name="tpu_shards_example.proto", package="tensorflow", syntax="proto3")
    label_rep = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
    label_opt = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    t = descriptor_pb2.FieldDescriptorProto

    def message(name, fields, packed=False):
        msg = fdp.message_type.add(name=name)
        for number, (fname, ftype, label, type_name) in enumerate(fields, start=1):
            field = msg.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                field.type_name = type_name
            if packed:
                field.options.packed = True
        return msg

    message("BytesList", [("value", t.TYPE_BYTES, label_rep, None)])
    message("FloatList", [("value", t.TYPE_FLOAT, label_rep, None)], packed=True)
    message("Int64List", [("value", t.TYPE_INT64, label_rep, None)], packed=True)
    feature = message("Feature", [])
    for number, (fname, tname) in enumerate(
        [("bytes_list", "BytesList"), ("float_list", "FloatList"), ("int64_list", "Int64List")], start=1
    ):
        feature.field.add(name=fname, number=number, type=t.TYPE_MESSAGE, label=label_opt,
                          type_name=".tensorflow." + tname, oneof_index=0)
    feature.oneof_decl.add(name="kind")
    features = message("Features", [("feature", t.TYPE_MESSAGE, label_rep, ".tensorflow.Features.FeatureEntry")])
    entry = features.nested_type.add(name="FeatureEntry")
    entry.field.add(name="key", number=1, type=t.TYPE_STRING, label=label_opt)
    entry.field.add(name="value", number=2, type=t.TYPE_MESSAGE, label=label_opt, type_name=".tensorflow.Feature")
    entry.options.map_entry = True
    message("Example", [("features", t.TYPE_MESSAGE, label_opt, ".tensorflow.Features")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


Example = _example_classes()


ExtraValue = int | float | str


@dataclass(frozen=True)
class ExtraSpec:
    """A listing column carried into each record as `extra/<name>`: its dtype and whether it holds a list."""

    name: str
    dtype: str  # "int64", "float32" or "string"
    is_list: bool = False

    @property
    def key(self) -> str:
        return EXTRA_PREFIX + self.name


@dataclass(frozen=True)
class ImageRecord:
    """One image or video clip as it is stored: encoded bytes plus the fields the schema carries.

    Single-label images use `label`/`label_text`; multi-label records give every label in `labels`/`label_texts`
    (then `label`/`label_text` are ignored). Video records give `frames` (JPEGs) instead of `encoded`.
    """

    encoded: bytes
    height: int
    width: int
    channels: int
    label: int
    label_text: str
    source_id: str
    sha256: str
    image_format: str = "jpeg"
    labels: tuple[int, ...] | None = None
    label_texts: tuple[str, ...] | None = None
    frames: tuple[bytes, ...] | None = None
    frame_rate: float | None = None
    extras: tuple[tuple[ExtraSpec, tuple[ExtraValue, ...]], ...] = ()
    embedding: tuple[float, ...] | None = None
    embedding_key: str = EMBEDDING

    @property
    def label_ids(self) -> tuple[int, ...]:
        return self.labels if self.labels is not None else (self.label,)

    @property
    def label_names(self) -> tuple[str, ...]:
        return self.label_texts if self.label_texts is not None else (self.label_text,)


def label_ids_of(stored: Sequence[int], label_offset: int = 0) -> tuple[int, ...]:
    """A record's 0-based label ids from its stored image/class/label values: () for a record without a label."""
    ids = tuple(int(v) - label_offset for v in stored)
    return () if ids == (NO_LABEL,) else ids


def encode_example(record: ImageRecord) -> bytes:
    """Serialize a record as a tf.train.Example, deterministically (map keys sorted).

    A single-label image gives exactly the bytes every earlier version wrote.
    """
    return b"".join(example_parts(record))


def example_parts(record: ImageRecord) -> list[bytes]:
    """encode_example's bytes in pieces to join or frame: the image's JPEG is the record's own object, not a copy
    (example_bytes); what that module leaves to the protobuf runtime comes as one piece."""
    if _IMAGE_FEATURES is not None and record.frames is None and not record.extras and record.embedding is None:
        ids, names = record.label_ids, record.label_names
        if len(ids) == 1 and len(names) == 1:  # an image's nine features of one value each, as record_features
            pieces = example_bytes.single_value_pieces(_IMAGE_FEATURES, (
                record.encoded, record.image_format.encode(), record.height, record.width, record.channels, ids[0],
                names[0].encode("utf-8"), record.source_id.encode("utf-8"), record.sha256.encode()))
            if pieces is not None:
                return pieces
    features = record_features(record)
    pieces = example_bytes.example_pieces(features)
    if pieces is not None:
        return pieces
    example = Example()
    feature = example.features.feature
    for key, kind, values in features:
        getattr(feature[key], f"{kind}_list").value.extend(values)
    return [example.SerializeToString(deterministic=True)]


_IMAGE_FEATURES = example_bytes.single_values(  # an image record of one label: record_features' keys, in its order
    [(IMAGE_ENCODED, BYTES), (IMAGE_FORMAT, BYTES), (IMAGE_HEIGHT, INT64), (IMAGE_WIDTH, INT64),
     (IMAGE_CHANNELS, INT64), (LABEL, INT64), (LABEL_TEXT, BYTES), (SOURCE_ID, BYTES), (SHA256, BYTES)])


def record_features(record: ImageRecord) -> list[example_bytes.Feature]:
    """The record's features (key, kind, values), in the order a message is built from them."""
    out: list[example_bytes.Feature] = []
    if record.frames is None:
        out.append((IMAGE_ENCODED, BYTES, (record.encoded,)))
    else:
        out += [(VIDEO_ENCODED, BYTES, record.frames), (VIDEO_NUM_FRAMES, INT64, (len(record.frames),)),
                (VIDEO_FRAME_RATE, FLOAT, (float(record.frame_rate or 0.0),))]
    out += [(IMAGE_FORMAT, BYTES, (record.image_format.encode(),)), (IMAGE_HEIGHT, INT64, (record.height,)),
            (IMAGE_WIDTH, INT64, (record.width,)), (IMAGE_CHANNELS, INT64, (record.channels,)),
            (LABEL, INT64, record.label_ids), (LABEL_TEXT, BYTES, tuple(t.encode("utf-8") for t in record.label_names)),
            (SOURCE_ID, BYTES, (record.source_id.encode("utf-8"),)), (SHA256, BYTES, (record.sha256.encode(),))]
    for spec, values in record.extras:
        if spec.dtype == "int64":
            out.append((spec.key, INT64, tuple(int(v) for v in values)))
        elif spec.dtype == "float32":
            out.append((spec.key, FLOAT, tuple(float(v) for v in values)))
        else:
            out.append((spec.key, BYTES, tuple(str(v).encode("utf-8") for v in values)))
    if record.embedding is not None:
        out.append((record.embedding_key, FLOAT, record.embedding))
    return out


def decode_example(data: bytes) -> dict[str, Any]:
    """Parse serialized Example bytes into {key: scalar} (bytes, int or float; a list when not exactly one value).

    Raises ValueError if malformed.
    """
    example = Example()
    try:
        example.ParseFromString(data)
    except Exception as exc:  # protobuf raises DecodeError; keep the reason, drop the type
        raise ValueError(f"not a tf.train.Example: {exc}") from None
    out: dict[str, Any] = {}
    for key, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        values = list(getattr(feature, kind).value) if kind else []
        out[key] = values[0] if len(values) == 1 else values
    return out


def decode_lists(data: bytes) -> dict[str, list]:
    """Parse serialized Example bytes into {key: list of values}, whatever their count."""
    return {key: _values(feature) for key, feature in _features(data).items()}


def decode_fields(data: bytes, keys: Iterable[str]) -> dict[str, list]:
    """decode_lists' entries for `keys` only (those the record holds): the whole record is parsed and checked as
    there, but only these features become Python lists, a fraction of the cost for a reader that needs two."""
    features = _features(data)
    return {key: _values(features[key]) for key in keys if key in features}


def _features(data: bytes):
    """The parsed Example's feature map; ValueError if the bytes are not an Example."""
    example = Example()
    try:
        example.ParseFromString(data)
    except Exception as exc:
        raise ValueError(f"not a tf.train.Example: {exc}") from None
    return example.features.feature


def _values(feature) -> list:
    kind = feature.WhichOneof("kind")
    return list(getattr(feature, kind).value) if kind else []


def feature_table(*, media: str = "image", multi_label: bool = False, num_frames: int | None = None,
                  extras: Sequence[ExtraSpec] = (), embedding_key: str | None = None,
                  embedding_shape: Sequence[int] | None = None,
                  max_lengths: Mapping[str, int] | None = None) -> dict[str, dict[str, Any]]:
    """The manifest's feature table for a dataset of this shape; the loader derives its parse spec from it.

    List features of variable length have shape [-1] and a "max_length" (the longest list written, from
    `max_lengths`), so a loader can pad them to a static shape.
    """
    max_lengths = max_lengths or {}
    table = {k: dict(v) for k, v in FEATURES.items()}
    if media == "video":
        del table[IMAGE_ENCODED]
        if not num_frames or num_frames < 1:
            raise ValueError("a video dataset needs its number of frames per clip")
        table[VIDEO_ENCODED] = {"dtype": "string", "shape": [num_frames]}
        table[VIDEO_NUM_FRAMES] = {"dtype": "int64", "shape": []}
        table[VIDEO_FRAME_RATE] = {"dtype": "float32", "shape": []}
    elif media != "image":
        raise ValueError(f"media must be 'image' or 'video', got {media!r}")
    if multi_label:
        for key in (LABEL, LABEL_TEXT):
            table[key] = {**table[key], "shape": [VARIABLE], "max_length": int(max_lengths.get(key, 0))}
    for spec in extras:
        if spec.dtype not in DTYPES:
            raise ValueError(f"extra column {spec.name!r} has dtype {spec.dtype!r}; "
                             f"expected one of {', '.join(DTYPES)}")
        entry: dict[str, Any] = {"dtype": spec.dtype, "shape": []}
        if spec.is_list:
            entry = {"dtype": spec.dtype, "shape": [VARIABLE], "max_length": int(max_lengths.get(spec.key, 0))}
        table[spec.key] = entry
    if embedding_key:
        if not embedding_shape or not all(isinstance(d, int) and d > 0 for d in embedding_shape):
            raise ValueError(f"embedding shape must be positive integers, got {embedding_shape!r}")
        table[embedding_key] = {"dtype": "float32", "shape": list(embedding_shape)}
    return dict(sorted(table.items()))


def media_key(features: Mapping[str, Any]) -> str:
    """The feature holding the encoded media: image/encoded, or video/encoded for a video dataset."""
    return VIDEO_ENCODED if VIDEO_ENCODED in features and IMAGE_ENCODED not in features else IMAGE_ENCODED


def _max_length(key: str, spec: Mapping[str, Any]) -> int:
    """A variable-length feature's declared 'max_length'; ValueError unless it is a non-negative integer."""
    max_length = spec.get("max_length")
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 0:
        raise ValueError(f"feature {key!r} is a variable-length list and needs a non-negative 'max_length'")
    return max_length


def check_features(features: Mapping[str, Any]) -> None:
    """Validate a manifest's feature table; raises ValueError naming the bad entry."""
    if not isinstance(features, Mapping) or not features:
        raise ValueError("'features' must be a non-empty object")
    for key, spec in features.items():
        if not isinstance(key, str) or not isinstance(spec, Mapping):
            raise ValueError(f"feature {key!r} must map to an object with 'dtype' and 'shape'")
        if spec.get("dtype") not in DTYPES:
            raise ValueError(f"feature {key!r} has dtype {spec.get('dtype')!r}; expected one of {', '.join(DTYPES)}")
        shape = spec.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
            raise ValueError(f"feature {key!r} has shape {shape!r}; expected a list of integers")
        variable = shape == [VARIABLE]
        if not variable and not all(d >= 0 for d in shape):
            raise ValueError(f"feature {key!r} has shape {shape!r}; dimensions must be >= 0, or the shape exactly "
                             f"[{VARIABLE}] for a list of variable length")
        values = _max_length(key, spec) if variable else math.prod(shape)
        if values > MAX_FEATURE_VALUES:
            raise ValueError(f"feature {key!r} holds up to {values} values per record, more than {MAX_FEATURE_VALUES}; "
                             "refused (a reader allocates that much per record)")
    key = media_key(features)
    if key not in features or features[key].get("dtype") != "string":
        raise ValueError(f"the schema has no image feature: {IMAGE_ENCODED!r} (or {VIDEO_ENCODED!r}) of dtype "
                         "string is required")
