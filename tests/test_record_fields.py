"""What the JAX iterator reads out of a record, against what every other reader reads: `schema.decode_fields` gives
`decode_lists`' values of the keys asked for (records of every feature kind, multi-label, extras, video,
embeddings, damaged bytes), and `Decoder.picture` gives `Decoder.__call__`'s pixels and label, and its errors."""
from __future__ import annotations

import io
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from shard_utils.format import schema
from shard_utils.format.schema import ExtraSpec, ImageRecord
from shard_utils.read.random_access import Decoder

KEYS = (schema.IMAGE_ENCODED, schema.VIDEO_ENCODED, schema.LABEL, schema.SOURCE_ID, schema.VIDEO_FRAME_RATE,
        schema.EMBEDDING, "extra/n", "extra/x", "extra/s", "absent/key")
SPECS = (ExtraSpec("n", "int64", True), ExtraSpec("x", "float32"), ExtraSpec("s", "string", True))
small_ints = st.integers(-(2**63), 2**63 - 1)
texts = st.text(max_size=6)


@st.composite
def records(draw) -> bytes:
    """Example bytes of any kind the job writes: image or video, one label or several, extras, an embedding."""
    labels = draw(st.lists(st.integers(-1, 2**40), max_size=3))
    video = draw(st.booleans())
    frames = tuple(draw(st.lists(st.binary(max_size=40), min_size=1, max_size=3))) if video else None
    extras = ((SPECS[0], tuple(draw(st.lists(small_ints, max_size=3)))),
              (SPECS[1], tuple(draw(st.lists(st.floats(width=32, allow_nan=False), max_size=1)))),
              (SPECS[2], tuple(draw(st.lists(texts, max_size=2)))))
    record = ImageRecord(
        encoded=draw(st.binary(max_size=80)), height=draw(st.integers(0, 5000)), width=3, channels=3,
        label=labels[0] if labels else 0, label_text="t", source_id=draw(texts), sha256="ab",
        labels=tuple(labels) if len(labels) != 1 else None, label_texts=("t",) * len(labels) if labels else None,
        frames=frames, frame_rate=draw(st.floats(0, 60, width=32)) if video else None,
        extras=extras[:draw(st.integers(0, 3))],
        embedding=tuple(draw(st.lists(st.floats(width=32, allow_nan=False), max_size=3))) or None)
    return schema.encode_example(record)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records(), st.lists(st.sampled_from(KEYS), unique=True))
def test_decode_fields_gives_decode_lists_values_of_the_keys_asked_for(data, keys):
    every = schema.decode_lists(data)
    assert schema.decode_fields(data, keys) == {key: every[key] for key in keys if key in every}


def test_a_feature_without_a_kind_is_an_empty_list_and_every_parse_refuses_the_same_damage():
    example = schema.Example()
    example.features.feature["image/encoded"].bytes_list.value.append(b"jpeg")
    example.features.feature["empty"].SetInParent()
    data = example.SerializeToString()
    assert schema.decode_fields(data, ("empty", "image/encoded")) == {"empty": [], "image/encoded": [b"jpeg"]}
    for damaged in (data[:-1], b"\xff" * 5, data[:3] + b"\x80" * 11 + data[3:]):
        with pytest.raises(ValueError) as lists:
            schema.decode_lists(damaged)
        with pytest.raises(ValueError) as fields:
            schema.decode_fields(damaged, ("image/encoded",))
        assert str(fields.value) == str(lists.value) and str(lists.value).startswith("not a tf.train.Example")


def jpeg(size: tuple[int, int], mode: str = "RGB", seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(out, "JPEG", quality=90)
    return out.getvalue()


def encoded(image: bytes, labels: tuple[int, ...], source_id: str = "a/b.jpg") -> bytes:
    return schema.encode_example(ImageRecord(
        encoded=image, height=0, width=0, channels=3, label=labels[0] if labels else 0, label_text="",
        source_id=source_id, sha256="", labels=labels if len(labels) != 1 else None))


@pytest.mark.parametrize("size", [None, (24, 24), (10, 14), (40, 30)])
@pytest.mark.parametrize("decoder, labels", [
    (Decoder(5, label_offset=1), (3,)),
    (Decoder(5), (-1,)),  # stored without a label
    (Decoder(4, multi_label=True, label_offset=2), (2, 5)),
    (Decoder(4, multi_label=True), ()),
])
def test_picture_gives_the_pixels_and_label_of_call(decoder, labels, size):
    decoder.image_size = size
    for image in (jpeg((40, 30)), jpeg((24, 24), "L", seed=1), jpeg((31, 17), "CMYK", seed=2)):
        data = encoded(image, labels)
        picture, label = decoder.picture(data)
        out = decoder(data)
        assert picture.mode == "RGB"
        np.testing.assert_array_equal(np.asarray(picture), out["image"])
        assert type(label) is type(out["label"]) and np.array_equal(label, out["label"])
        assert np.asarray(label).dtype == np.asarray(out["label"]).dtype


@pytest.mark.parametrize("data, message", [
    (encoded(b"not a jpeg", (0,)), r"record 'a/b.jpg': image does not decode"),
    (encoded(jpeg((8, 8)), (9,)), r"record 'a/b.jpg': label ids \[9\] are outside 0..4"),
    (schema.encode_example(ImageRecord(encoded=b"", height=0, width=0, channels=3, label=0, label_text="",
                                       source_id="c", sha256="", frames=(b"x",))),
     r"record 'c' has no 'image/encoded'"),
    (b"\x0a\x05", "not a tf.train.Example"),
])
def test_picture_refuses_a_bad_record_as_call_does(data, message):
    decoder = Decoder(5, image_size=(8, 8))
    with pytest.raises(ValueError, match=message) as called:
        decoder(data)
    with pytest.raises(ValueError, match=message) as pictured:
        decoder.picture(data)
    def address_free(error):
        return re.sub(r"0x[0-9a-f]+", "0x", str(error.value))  # Pillow names the file object it read

    assert address_free(pictured) == address_free(called)
