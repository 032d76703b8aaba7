"""Embeddings: models built here (no downloads), loaded by shard_utils.media.embed, run through the Embedder the
build's workers use and compared with a plain `model.predict` on the same preprocessed inputs.

Tolerance against `predict`: rtol 1e-5, atol 1e-6. The Embedder always calls the model on batches of
exactly batch_size rows; `predict`'s last batch is smaller, and TensorFlow's CPU kernels may round
differently at another batch size (about 1e-11 for EfficientNetB0 here).
"""
from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO
from PIL import Image

from shard_utils.media.embed import (
    EmbedError,
    EmbedSpec,
    check_model,
    load_embedder,
    model_sha256,
    nonfinite_rows,
    parse_input_size,
    preprocess,
    record_pixels,
)
from shard_utils.media.images import resize

tf = pytest.importorskip("tensorflow")  # the [test] extra installs it; the module says so if it is missing
keras = tf.keras
RTOL, ATOL = 1e-5, 1e-6


def images(n: int, size=(32, 32), seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (*size, 3), dtype=np.uint8) for _ in range(n)]


def embedded(spec: EmbedSpec, inputs: list) -> np.ndarray:
    """The build's embedding step on `inputs`, in order: a freshly loaded Embedder, as a worker loads it."""
    return load_embedder(spec).embed(inputs)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A small conv net saved three ways: .keras, model.export (SavedModel) and tf.saved_model.save."""
    keras.utils.set_random_seed(1)
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(8)(x))
    root = tmp_path_factory.mktemp("small")
    model.save(root / "small.keras")
    model.export(str(root / "exported"), verbose=False)
    tf.saved_model.save(model, str(root / "tf_saved"))
    return model, {"keras": root / "small.keras", "export": root / "exported", "tf_saved": root / "tf_saved"}


@pytest.mark.parametrize("kind", ["keras", "export", "tf_saved"])
def test_embeddings_equal_predict_on_the_same_inputs(small, kind, tmp_path):
    model, paths = small
    spec = EmbedSpec(str(paths[kind]), "imagenet", batch_size=4)
    pixels = images(7) + [images(1, size=(40, 50), seed=3)[0]]  # the last one is resized inside
    got = embedded(spec, pixels)
    fitted = np.stack(pixels[:7] + [np.asarray(resize(Image.fromarray(pixels[7]), (32, 32), "fill"))])
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    expected = model.predict(((fitted / 255.0 - mean) / std).astype(np.float32), verbose=0)
    assert got.dtype == np.float32 and got.shape == (8, 8) and not nonfinite_rows(got).any()
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)
    info = check_model(spec)
    assert (info.input_size, info.embedding_dim, info.format) == ((32, 32), 8, "keras" if kind == "keras"
                                                                   else "saved_model")


def test_jpeg_bytes_embed_as_their_decoded_pixels(small, tmp_path):
    _, paths = small
    spec = EmbedSpec(str(paths["keras"]), "scale01", batch_size=2)
    jpegs = []
    for img in images(3, seed=5):
        path = tmp_path / f"{len(jpegs)}.jpg"
        Image.fromarray(img).save(path, quality=90)
        jpegs.append(path.read_bytes())
    got = embedded(spec, jpegs)
    direct = embedded(spec, [record_pixels(j) for j in jpegs])
    assert np.array_equal(got, direct)


@pytest.fixture(scope="module")
def mean_model(tmp_path_factory) -> Path:
    """Any-size input -> per-channel mean: the embedding is exactly the preprocessed pixels' mean."""
    inputs = keras.Input((None, None, 3))
    path = tmp_path_factory.mktemp("mean") / "mean.keras"
    keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(inputs)).save(path)
    return path


@pytest.mark.parametrize("mode,formula", [
    ("scale01", lambda m: m / 255), ("minus1to1", lambda m: m / 127.5 - 1), ("none", lambda m: m),
    ("imagenet", lambda m: (m / 255 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])),
])
def test_preprocessing_modes(mean_model, mode, formula):
    pixels = images(3, size=(16, 16), seed=7)
    embedder = load_embedder(EmbedSpec(str(mean_model), mode, input_size=(16, 16), batch_size=2))
    expected = np.stack([formula(img.reshape(-1, 3).astype(np.float64).mean(0)) for img in pixels])
    np.testing.assert_allclose(embedder.embed(pixels), expected, rtol=RTOL, atol=ATOL)
    corners = preprocess(np.array([[[[0, 128, 255]]]], np.uint8), mode)[0, 0, 0]
    np.testing.assert_allclose(corners, formula(np.array([0.0, 128.0, 255.0])), rtol=1e-6, atol=1e-6)


def test_open_input_size_needs_embed_input_size(mean_model):
    with pytest.raises(EmbedError, match="--embed-input-size"):
        check_model(EmbedSpec(str(mean_model), "none"))
    assert check_model(EmbedSpec(str(mean_model), "none", input_size=(20, 30))).input_size == (20, 30)
    assert parse_input_size("224") == (224, 224) and parse_input_size("224, 192") == (224, 192)
    for bad in ("", "0", "a,b", "1,2,3", "-4"):
        with pytest.raises(EmbedError, match="--embed-input-size"):
            parse_input_size(bad)


class _Sqrt(tf.Module):
    """sqrt(mean pixel + shift) per channel: NaN where the mean is below -shift."""

    def __init__(self, shift: float):
        super().__init__()
        self.shift = tf.constant(shift)

    @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 3], tf.float32)])
    def __call__(self, x):
        return tf.sqrt(tf.reduce_mean(x, axis=[1, 2]) + self.shift)


def save_module(module: tf.Module, path: Path, signatures=True) -> str:
    tf.saved_model.save(module, str(path), signatures=module.__call__ if signatures else {})
    return str(path)


def test_nan_embeddings_are_found_row_by_row(tmp_path):
    model = save_module(_Sqrt(-0.001), tmp_path / "sqrt")  # black images (mean 0) give sqrt(-0.001) = NaN
    black, bright = np.zeros((8, 8, 3), np.uint8), np.full((8, 8, 3), 200, np.uint8)
    got = embedded(EmbedSpec(model, "scale01", batch_size=2), [black, bright])
    assert nonfinite_rows(got).tolist() == [True, False]  # the build rejects the first record (embedding_nan)
    np.testing.assert_allclose(got[1], np.sqrt(np.full(3, 200 / 255) - 0.001), rtol=RTOL)


def _keras_model(path: Path, inputs, outputs) -> str:
    keras.Model(inputs, outputs).save(path)
    return str(path)


def test_bad_models_fail_with_one_line_before_any_work(tmp_path, small):
    _, paths = small
    garbage = tmp_path / "garbage.keras"
    garbage.write_bytes(b"PK\x03\x04 not really a zip")
    (tmp_path / "empty_folder").mkdir()
    rank3 = keras.Input((32, 32))
    gray = keras.Input((32, 32, 1))
    conv_in = keras.Input((8, 8, 3))
    two_in = keras.Input((8, 8, 3))
    pooled = keras.layers.GlobalAveragePooling2D()(two_in)
    cases = {
        "missing": (EmbedSpec(str(tmp_path / "nope.keras"), "scale01"), "no model at"),
        "garbage .keras": (EmbedSpec(str(garbage), "scale01"), "cannot load the Keras model"),
        "not a SavedModel": (EmbedSpec(str(tmp_path / "empty_folder"), "scale01"), "no saved_model.pb"),
        "rank 3 input": (EmbedSpec(_keras_model(tmp_path / "r3.keras", rank3, keras.layers.Flatten()(rank3)),
                                   "scale01"), r"expected \[batch, height, width, 3\]"),
        "one channel": (EmbedSpec(_keras_model(tmp_path / "g.keras", gray, keras.layers.Flatten()(gray)),
                                  "scale01"), r"\[None, 32, 32, 1\]"),
        "feature map": (EmbedSpec(_keras_model(tmp_path / "fm.keras", conv_in, keras.layers.Conv2D(4, 3)(conv_in)),
                                  "scale01"), "not one vector per image"),
        "always NaN": (EmbedSpec(save_module(_Sqrt(-10.0), tmp_path / "nan"), "scale01"), "NaN or infinite"),
        "no signature": (EmbedSpec(save_module(_Sqrt(0.0), tmp_path / "nosig", signatures=False), "scale01"),
                         "no 'serving_default' signature"),
        "two outputs": (EmbedSpec(_keras_model(tmp_path / "two.keras", two_in,
                                               {"a": keras.layers.Dense(2, name="a")(pooled),
                                                "b": keras.layers.Dense(5, name="b")(pooled)}), "scale01"),
                        "--embed-output"),
        "size mismatch": (EmbedSpec(str(paths["keras"]), "scale01", input_size=(64, 64)), "does not match"),
        "Lambda layer (code run on load)": (
            EmbedSpec(_keras_model(tmp_path / "lambda.keras", conv_in,
                                   keras.layers.Lambda(lambda t: keras.ops.mean(t, axis=(1, 2)))(conv_in)), "scale01"),
            "cannot load the Keras model.*safe_mode"),
    }
    for name, (spec, needle) in cases.items():
        with pytest.raises(EmbedError, match=needle) as info:
            check_model(spec)
            pytest.fail(f"{name}: accepted")
        assert "\n" not in str(info.value), name
    for kwargs, needle in (({"preprocess": "caffe"}, "--embed-preprocess"), ({"batch_size": 0}, "--embed-batch-size")):
        with pytest.raises(EmbedError, match=needle):
            EmbedSpec(**{"model": "m.keras", "preprocess": "scale01", **kwargs})


def test_outputs_that_flatten_to_a_vector_and_named_outputs(tmp_path):
    x = keras.Input((8, 8, 3))
    one_by_one = _keras_model(tmp_path / "1x1.keras", x, keras.layers.Conv2D(6, 8)(x))  # [B, 1, 1, 6]
    assert check_model(EmbedSpec(one_by_one, "scale01")).embedding_dim == 6
    pooled = keras.layers.GlobalAveragePooling2D()(x)
    two = _keras_model(tmp_path / "two.keras", x, {"a": keras.layers.Dense(2, name="a")(pooled),
                                                    "b": keras.layers.Dense(5, name="b")(pooled)})
    info = check_model(EmbedSpec(two, "scale01", output="b"))
    assert (info.embedding_dim, info.output) == (5, "b")


def test_model_identity_is_the_sha256_of_its_files(small, tmp_path):
    _, paths = small
    assert check_model(EmbedSpec(str(paths["keras"]), "scale01")).sha256 == \
        hashlib.sha256(paths["keras"].read_bytes()).hexdigest()
    folder = paths["export"]
    digest = hashlib.sha256()
    for f in sorted((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.relative_to(folder).as_posix()):
        digest.update(f.relative_to(folder).as_posix().encode() + b"\0" + f.stat().st_size.to_bytes(8, "big"))
        digest.update(f.read_bytes())
    assert model_sha256(str(folder)) == digest.hexdigest()
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in folder.rglob("*"):
        if f.is_file():
            (copy / f.relative_to(folder)).parent.mkdir(parents=True, exist_ok=True)
            (copy / f.relative_to(folder)).write_bytes(f.read_bytes())
    assert model_sha256(str(copy)) == digest.hexdigest()
    (copy / "variables" / "note.txt").write_text("changed")
    assert model_sha256(str(copy)) != digest.hexdigest()


def test_efficientnet_b0_shapes_and_batching(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.applications.EfficientNetB0(weights=None, include_top=False, pooling="avg",
                                              input_shape=(224, 224, 3))
    path = tmp_path / "effnet.keras"
    model.save(path)
    spec = EmbedSpec(str(path), "none", batch_size=4)  # EfficientNet rescales and normalises inside
    pixels = images(6, size=(224, 224), seed=11)
    got = embedded(spec, pixels)
    assert got.shape == (6, 1280) and got.dtype == np.float32
    expected = model.predict(np.stack(pixels).astype(np.float32), batch_size=6, verbose=0)  # one trace
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


def test_model_from_cloud_storage(gcs, small):
    _, paths = small
    bucket = gcs.new_bucket("models")
    gcs.client.bucket(bucket).blob("m/small.keras").upload_from_filename(str(paths["keras"]))
    gcs.upload_tree(paths["export"], bucket, "m/exported")
    pixels = images(3, seed=2)
    for name, local in (("m/small.keras", paths["keras"]), ("m/exported", paths["export"])):
        remote = load_embedder(EmbedSpec(f"gs://{bucket}/{name}", "scale01", batch_size=2))
        here = load_embedder(EmbedSpec(str(local), "scale01", batch_size=2))
        assert remote.info.sha256 == here.info.sha256 and remote.info.path == f"gs://{bucket}/{name}"
        assert remote.embed(pixels).tobytes() == here.embed(pixels).tobytes()
    for missing in ("m/other.keras", "nothing/here"):
        with pytest.raises(EmbedError, match="no model at"):
            check_model(EmbedSpec(f"gs://{bucket}/{missing}", "scale01"))


def test_without_tensorflow_the_error_names_the_extra(small):
    _, paths = small
    code = (
        "import sys\n"
        "import beam_jobs.pipeline.encode, shard_utils.media.embed, shard_utils.media.video\n"
        "assert 'tensorflow' not in sys.modules and 'av' not in sys.modules, 'imported too early'\n"
        "sys.modules['tensorflow'] = None\n"  # what an environment without TensorFlow looks like to `import`
        "from shard_utils.media.embed import EmbedSpec, check_model\n"
        "from shard_utils.extras import MissingExtra\n"
        "try:\n"
        f"    check_model(EmbedSpec({str(paths['keras'])!r}, 'scale01'))\n"
        "except MissingExtra as exc:\n"
        "    print(exc); sys.exit(7)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO)}, timeout=120)
    assert done.returncode == 7, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and 'pip install -e ".[embed]"' in lines[0] and "--embed-model" in lines[0]
