"""Example bytes written directly (shard_utils.format.example_bytes) are the protobuf runtime's, byte for byte, and
framing them in pieces gives the framing of the joined record."""
from __future__ import annotations

import io
import random
import struct

import pytest

from shard_utils.format import schema
from shard_utils.format.example_bytes import (
    BYTES,
    FLOAT,
    INT64,
    LARGE,
    SMALL,
    example_pieces,
    single_value_pieces,
    single_values,
)
from shard_utils.format.tfrecord import frame, frame_pieces, iter_records, masked_crc


def runtime_bytes(features) -> bytes:
    """The protobuf runtime's deterministic serialization of the same features."""
    example = schema.Example()
    for key, kind, values in features:
        getattr(example.features.feature[key], f"{kind}_list").value.extend(values)
    return example.SerializeToString(deterministic=True)


def random_features(rng: random.Random) -> list:
    keys = rng.sample(["image/encoded", "image/height", "extra/a", "extra/b/c", "x", "é/ü", "image/class/label",
                       "image/class/text", "video/encoded", "k" * 200], rng.randint(1, 8))
    out = []
    for key in keys:
        if rng.random() < 0.5:
            sizes = [rng.choice([0, 1, 127, 128, SMALL - 1, SMALL, 70_000]) for _ in range(rng.randint(0, 3))]
            out.append((key, BYTES, tuple(rng.randbytes(n) for n in sizes)))
        else:
            values = [rng.choice([0, 1, -1, 127, 128, 2**31, -(2**63), 2**63 - 1, rng.randint(-10**9, 10**9)])
                      for _ in range(rng.randint(0, 5))]
            out.append((key, INT64, tuple(values)))
    return out


def test_pieces_are_the_runtimes_bytes_for_random_features():
    rng = random.Random(7)
    for _ in range(300):
        features = random_features(rng)
        pieces = example_pieces(features, large=0)
        assert pieces is not None
        assert b"".join(pieces) == runtime_bytes(features)
        assert not any(len(a) < SMALL and len(b) < SMALL for a, b in zip(pieces, pieces[1:], strict=False))  # joined


def test_a_large_value_is_the_callers_own_object():
    image = bytes(range(256)) * 64
    pieces = example_pieces([("image/encoded", BYTES, (image,)), ("image/height", INT64, (5,))], large=len(image))
    assert any(p is image for p in pieces)
    assert example_pieces([("image/encoded", BYTES, (image,))], large=len(image) + 1) is None  # the runtime's


def test_single_values_are_the_runtimes_bytes():
    """Keys laid out once, then one value each: the runtime's bytes, a large value a piece of its own; a value that
    is no plain int in range or no bytes is left to example_pieces."""
    rng = random.Random(5)
    for _ in range(300):
        keys = [(key, kind) for key, kind, _ in random_features(rng)]
        layout = single_values(keys)
        assert layout is not None
        values = [rng.randbytes(rng.choice([0, 1, 127, 128, SMALL - 1, SMALL, 70_000])) if kind == BYTES else
                  rng.choice([0, 1, -1, 127, 128, 300, 2**31, -(2**63), 2**63 - 1]) for _, kind in keys]
        pieces = single_value_pieces(layout, values)
        assert b"".join(pieces) == runtime_bytes([(k, kind, (v,)) for (k, kind), v in zip(keys, values, strict=True)])
        assert all(any(p is v for p in pieces) for v in values if isinstance(v, bytes) and len(v) >= SMALL)
    layout = single_values([("a", INT64), ("b", BYTES)])
    for values in ([2**63, b""], [True, b""], [1, "text"], [1, bytearray(b"x")]):
        assert single_value_pieces(layout, values) is None
    assert single_values([("a", FLOAT)]) is None and single_values([("a", BYTES), ("ab", BYTES)]) is None


def test_image_records_of_one_label_are_the_runtimes_bytes():
    rng = random.Random(9)
    for _ in range(200):
        label = rng.choice([-1, 0, 3, 200, 2**40])
        image = rng.randbytes(rng.choice([0, 10, SMALL - 200, SMALL, 40_000]))
        record = schema.ImageRecord(image, rng.randint(1, 70_000), rng.randint(1, 300), rng.choice([1, 3]), label,
                                    rng.choice(["", "cat", "é/ü" * 50]),
                                    rng.choice(["a.jpg", "dir/ä b.jpeg", "x" * 300]), rng.randbytes(32).hex(),
                                    image_format=rng.choice(["jpeg", "png"]),
                                    labels=rng.choice([None, (label,)]), label_texts=rng.choice([None, ("t",)]))
        assert schema.encode_example(record) == runtime_bytes(schema.record_features(record))


@pytest.mark.parametrize("features", [
    [("a", INT64, (1,)), ("a", INT64, (2,))],  # a key repeated: the runtime merges the lists
    [("extra/a", BYTES, (b"x",)), ("extra/ab", BYTES, (b"y",))],  # one key starts another: upb's own order
    [("a", FLOAT, (0.1,))],  # float32 rounding is the runtime's
    [("a", INT64, (2**63,))],  # out of range: the runtime's error
])
def test_what_only_the_runtime_writes_is_left_to_it(features):
    assert example_pieces(features, large=0) is None


def test_encode_example_matches_the_runtime_for_every_record_shape():
    extras = (schema.ExtraSpec("n", "int64"), schema.ExtraSpec("f", "float32"), schema.ExtraSpec("s", "string", True))
    records = [
        schema.ImageRecord(b"\xff\xd8" + bytes(LARGE), 4, 5, 3, 2, "cat", "cat/1.jpg", "ab" * 32),
        schema.ImageRecord(b"\xff\xd8" + bytes(9000), 4, 5, 3, 2, "cat", "cat/1.jpg", "ab" * 32),
        schema.ImageRecord(b"jpg", 1, 1, 1, -1, "", "u/é.jpg", "00", labels=(-1,), label_texts=("",)),
        schema.ImageRecord(b"jpg", 1, 1, 3, 0, "", "m.jpg", "00", labels=(0, 3), label_texts=("a", "b"),
                           extras=((extras[0], (7,)), (extras[2], ("x", "y")))),
        schema.ImageRecord(b"jpg", 1, 1, 3, 0, "", "f.jpg", "00", extras=((extras[1], (0.1,)),)),
        schema.ImageRecord(b"", 8, 8, 3, 1, "b", "v.mp4", "00", frames=(b"a" * LARGE, b"b"), frame_rate=2.5),
        schema.ImageRecord(b"jpg", 1, 1, 3, 0, "a", "e.jpg", "00", embedding=(0.5, -1.25)),
        schema.ImageRecord(b"jpg", 1, 1, 3, 0, "a", "k.jpg", "00", embedding=(0.5,), embedding_key=schema.IMAGE_HEIGHT),
    ]
    for record in records:
        assert schema.encode_example(record) == runtime_bytes(schema.record_features(record))
        assert schema.decode_lists(schema.encode_example(record))[schema.SOURCE_ID] == [record.source_id.encode()]


def test_framing_pieces_frames_the_joined_record():
    record = [b"head", bytes(range(256)) * 40, b"", b"tail"]
    joined = b"".join(record)
    length = struct.pack("<Q", len(joined))
    want = length + struct.pack("<I", masked_crc(length)) + joined + struct.pack("<I", masked_crc(joined))
    assert frame_pieces(record) == frame(joined) == want
    assert list(iter_records(io.BytesIO(want + frame_pieces([])))) == [joined, b""]
