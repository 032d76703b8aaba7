"""The record schema: tf.train.Example feature keys, encoding, and the parse spec.

The keys follow the tensorflow/tpu and TF Model Garden image pipelines, so their
readers work on our shards unchanged. Encoding uses the protobuf runtime with the
Example message declared in a private descriptor pool: workers that only write
records never import TensorFlow, and the bytes are the same as TF's own
`tf.train.Example(...).SerializeToString(deterministic=True)`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

IMAGE_ENCODED = "image/encoded"
IMAGE_FORMAT = "image/format"
IMAGE_HEIGHT = "image/height"
IMAGE_WIDTH = "image/width"
IMAGE_CHANNELS = "image/channels"
LABEL = "image/class/label"
LABEL_TEXT = "image/class/text"
SOURCE_ID = "image/source_id"
SHA256 = "image/key/sha256"

# key -> (manifest dtype, shape). The manifest stores this; the loader derives its parse spec from it.
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


@dataclass(frozen=True)
class ImageRecord:
    """One image as it is stored: encoded bytes plus the fields the schema carries."""

    encoded: bytes
    height: int
    width: int
    channels: int
    label: int
    label_text: str
    source_id: str
    sha256: str
    image_format: str = "jpeg"


def encode_example(record: ImageRecord) -> bytes:
    """Serialize a record as a tf.train.Example, deterministically (map keys sorted)."""
    example = Example()
    feature = example.features.feature
    feature[IMAGE_ENCODED].bytes_list.value.append(record.encoded)
    feature[IMAGE_FORMAT].bytes_list.value.append(record.image_format.encode())
    feature[IMAGE_HEIGHT].int64_list.value.append(record.height)
    feature[IMAGE_WIDTH].int64_list.value.append(record.width)
    feature[IMAGE_CHANNELS].int64_list.value.append(record.channels)
    feature[LABEL].int64_list.value.append(record.label)
    feature[LABEL_TEXT].bytes_list.value.append(record.label_text.encode("utf-8"))
    feature[SOURCE_ID].bytes_list.value.append(record.source_id.encode("utf-8"))
    feature[SHA256].bytes_list.value.append(record.sha256.encode())
    return example.SerializeToString(deterministic=True)


def decode_example(data: bytes) -> dict[str, Any]:
    """Parse serialized Example bytes into {key: scalar} (bytes or int); raises ValueError if malformed."""
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
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise ValueError(f"feature {key!r} has shape {shape!r}; expected a list of non-negative integers")
    if IMAGE_ENCODED not in features or features[IMAGE_ENCODED].get("dtype") != "string":
        raise ValueError(f"the schema has no image feature: {IMAGE_ENCODED!r} of dtype string is required")
