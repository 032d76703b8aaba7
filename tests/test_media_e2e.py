"""Video clips and embeddings through the whole job, from a folder and from a bucket; progress on a terminal."""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

import pytest
from conftest import REPO, photo, run_cli, run_job, write_images
from readers import by_source, rejected, shard_bytes
from terminal import run_in_terminal

from shard_utils.format import schema
from shard_utils.read.verify import verify

av = pytest.importorskip("av")


def clip(n: int, codec: str = "libx264", fmt: str = "mp4", size=(48, 32)) -> bytes:
    """A small clip whose frame i is a flat gray of level 8*i."""
    import numpy as np

    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=10)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        for i in range(n):
            frame = av.VideoFrame.from_ndarray(np.full((size[1], size[0], 3), 8 * i, np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    root = tmp_path_factory.mktemp("clips") / "in"
    for label, codec, fmt, ext in [("run", "libx264", "mp4", "mp4"), ("walk", "libvpx", "webm", "webm")]:
        (root / label).mkdir(parents=True)
        for i in range(5):
            (root / label / f"c{i}.{ext}").write_bytes(clip(12 + i, codec, fmt))
    good = bytearray(clip(12))
    middle = len(good) // 2
    good[middle:middle + 64] = bytes(b ^ 0xFF for b in good[middle:middle + 64])  # damage inside the stream
    (root / "run" / "short.mp4").write_bytes(clip(2))
    (root / "run" / "broken.mp4").write_bytes(bytes(good))
    (root / "run" / "empty.mp4").write_bytes(b"")
    return root


@pytest.mark.slow
def test_clips_become_records_of_n_frames_and_bad_clips_are_rejected(clips, tmp_path):
    out = tmp_path / "out"
    m = run_job(clips, out, "--video-frames", "4", "--image-size", "32", "--num-cores", "2")
    assert m.media == "video" and m.features["video/encoded"] == {"dtype": "string", "shape": [4]}
    assert m.splits["train"].num_records == 10
    assert rejected(out) == {"run/short.mp4": "too_few_frames", "run/broken.mp4": "corrupt",
                             "run/empty.mp4": "empty"}
    rec = by_source(out)["walk/c3.webm"]
    assert len(rec[schema.VIDEO_ENCODED]) == 4 and rec[schema.VIDEO_NUM_FRAMES] == 4
    assert rec[schema.IMAGE_HEIGHT] == rec[schema.IMAGE_WIDTH] == 32
    assert verify(str(out), deep=True) == []


@pytest.mark.slow
def test_a_video_build_with_still_images_fails_in_one_line(clips, tmp_path):
    src = tmp_path / "mixed"
    import shutil

    shutil.copytree(clips / "walk", src / "walk")
    photo(32, 24, 1).save(src / "walk" / "still.jpg")
    done = run_cli("build", "--input", src, "--output", tmp_path / "out", "--video-frames", "4", "--num-cores", "1")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and "video clips or still images, not both" in lines[0]
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_clips_from_a_bucket_give_the_same_records(gcs, clips, tmp_path):
    local = tmp_path / "local"
    run_job(clips, local, "--video-frames", "3", "--num-cores", "2")
    bucket = gcs.new_bucket("clips")
    gcs.upload_tree(clips, bucket, "in")
    out = f"gs://{gcs.new_bucket('clip-out')}/ds"
    with contextlib.redirect_stdout(io.StringIO()):
        m = run_job(f"gs://{bucket}/in", out, "--video-frames", "3", "--num-cores", "2")
    objects = gcs.objects(*out[5:].split("/", 1))
    assert {k.lstrip("/"): v for k, v in objects.items() if k.endswith(".tfrecord")} == shard_bytes(local)
    assert m.media == "video"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    keras = pytest.importorskip("keras")
    keras.utils.set_random_seed(3)
    inputs = keras.Input((24, 24, 3))
    x = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    path = tmp_path_factory.mktemp("model") / "head.keras"
    keras.Model(inputs, keras.layers.Dense(6)(x)).save(path)
    return path


@pytest.mark.slow
def test_embeddings_are_stored_per_record_identically_on_one_and_two_workers(model, tmp_path):
    write_images(tmp_path / "in", {"a": 9, "b": 9}, size=(40, 30))
    one, two = tmp_path / "one", tmp_path / "two"
    m = run_job(tmp_path / "in", one, "--embed-model", model, "--embed-preprocess", "scale01", "--workers", "1",
                "--embed-batch-size", "4", "--num-cores", "2")
    run_job(tmp_path / "in", two, "--embed-model", model, "--embed-preprocess", "scale01", "--workers", "2",
            "--embed-batch-size", "4", "--num-cores", "2")
    assert shard_bytes(one) == shard_bytes(two)
    assert m.embedding["shape"] == [6] and m.embedding["sha256"] and m.embedding["path"] == str(model)
    assert m.features[schema.EMBEDDING] == {"dtype": "float32", "shape": [6]}
    rec = by_source(one)["a/img0003.jpg"]
    assert len(rec[schema.EMBEDDING]) == 6
    import keras
    import numpy as np

    from shard_utils.media.embed import fit_to_input, preprocess, record_pixels

    # The model saw the record's own JPEG, decoded and fitted to its input as shard_utils.media.embed documents.
    pixels = fit_to_input(record_pixels(rec[schema.IMAGE_ENCODED]), (24, 24))[None]
    expected = keras.models.load_model(model).predict(preprocess(pixels, "scale01"), verbose=0)[0]
    np.testing.assert_allclose(rec[schema.EMBEDDING], expected, rtol=1e-4, atol=1e-5)
    assert verify(str(one), deep=True) == []


def test_embeddings_of_clip_frames_and_from_a_bucket(model, clips, gcs, tmp_path):
    bucket = gcs.new_bucket("emb-in")
    gcs.upload_tree(clips / "walk", bucket, "in/walk")
    out = f"gs://{gcs.new_bucket('emb-out')}/ds"
    with contextlib.redirect_stdout(io.StringIO()):
        m = run_job(f"gs://{bucket}/in", out, "--video-frames", "3", "--embed-model", model,
                    "--embed-preprocess", "minus1to1", "--num-cores", "1")
    assert m.features[schema.EMBEDDING] == {"dtype": "float32", "shape": [3, 6]}
    assert m.splits["train"].num_records == 5 and verify(out, deep=True) == []


def run_as_a_user(*args) -> subprocess.CompletedProcess:
    """`tpu-shards ARGS` in a user's environment: no TF_CPP_MIN_LOG_LEVEL, and TensorFlow's oneDNN kernels on
    (TF_ENABLE_ONEDNN_OPTS=1), as on CPUs where TensorFlow turns them on itself and says so on stderr."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run([sys.executable, "-m", "beam_jobs.cli", *map(str, args)], capture_output=True, text=True,
                          env={**env, "TF_ENABLE_ONEDNN_OPTS": "1"}, timeout=300, cwd=REPO)


@pytest.mark.slow
def test_a_model_that_does_not_load_is_one_line_before_any_work(tmp_path):
    write_images(tmp_path / "in", {"a": 8})
    (tmp_path / "bad.keras").write_bytes(b"not a model")
    done = run_as_a_user("build", "--input", tmp_path / "in", "--output", tmp_path / "out", "--embed-model",
                         tmp_path / "bad.keras", "--embed-preprocess", "none")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"tpu-shards: error: cannot load the Keras model {tmp_path / 'bad.keras'}: ")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_an_embedding_build_writes_only_its_own_lines(model, tmp_path):
    """TensorFlow's start-up lines stay off the build's stderr."""
    write_images(tmp_path / "in", {"a": 4, "b": 4})
    done = run_as_a_user("build", "--input", tmp_path / "in", "--output", tmp_path / "out", "--embed-model", model,
                         "--embed-preprocess", "scale01", "--num-cores", "2")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith(f"tpu-shards: wrote {tmp_path / 'out'} in ") and "oneDNN" not in done.stdout


@pytest.mark.slow
def test_progress_shows_on_a_terminal_and_not_in_a_pipe(tmp_path):
    write_images(tmp_path / "in", {"a": 20, "b": 20})
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "COLUMNS": "100"}
    cmd = [sys.executable, "-m", "beam_jobs.cli", "build", "--input", str(tmp_path / "in"), "--num-cores", "2"]
    code, text = run_in_terminal([*cmd, "--output", str(tmp_path / "tty")], cwd=REPO, env=env)
    assert code == 0, text
    assert "encoding : 100%" in text and "writing  : 100%" in text and "40/40" in text
    piped = run_cli("build", "--input", tmp_path / "in", "--output", tmp_path / "pipe", "--num-cores", "2")
    assert piped.returncode == 0 and "encoding" not in piped.stderr and "images/s" not in piped.stderr
