"""The peer: a TensorFlow Datasets GeneratorBasedBuilder over the same folder, in one process, timed.

    python -m build_bench.tfds_child RESULT.json {jpeg|png} INPUT DATA_DIR [--check]

jpeg: `_generate_examples` yields each file's path into Image(encoding_format="jpeg"): TFDS reads the
bytes and stores them as they are. png: it yields each file opened with Pillow: TFDS saves the image as
JPEG with Pillow's default quality, 75. TensorFlow and TFDS are imported before the clock starts; the
clock covers making the builder and download_and_prepare().

--check instead builds under cProfile and verifies that description against the stored records: JPEG
bytes identical to the sources, PNGs stored as exactly the bytes Pillow writes at quality 75, and (from
the profile) no image decoded when JPEGs are passed through. Writes what it found to RESULT.json.
"""
from __future__ import annotations

import cProfile
import glob
import hashlib
import io
import json
import os
import pstats
import resource
import sys
import time

import tensorflow as tf  # noqa: F401 - imported before the clock starts
import tensorflow_datasets as tfds
from absl import logging as absl_logging
from PIL import Image

absl_logging.set_verbosity(absl_logging.ERROR)
tfds.disable_progress_bar()  # the job runs with --no-progress too
SOURCE: str = ""
KIND: str = "jpeg"


def source_files() -> list[str]:
    return sorted(os.path.join(d, f) for d, _, names in os.walk(SOURCE) for f in names)


class BenchImages(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Labelled images from class folders, stored as JPEG."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "benchmark"}

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(encoding_format="jpeg"),
                "label": tfds.features.ClassLabel(names=sorted(os.listdir(SOURCE))),
            }),
            supervised_keys=("image", "label"))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for path in source_files():
            image = path if KIND == "jpeg" else Image.open(path)
            yield os.path.relpath(path, SOURCE), {"image": image, "label": os.path.basename(os.path.dirname(path))}


def cpu_seconds() -> float:
    """CPU time (user + system, every thread) of this process and of its children that have exited."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def build(data_dir: str) -> None:
    BenchImages(data_dir=data_dir).download_and_prepare()


def stored_images(data_dir: str) -> list[bytes]:
    """The image bytes of every record TFDS wrote (read with TensorFlow's own Example parser)."""
    files = sorted(glob.glob(os.path.join(data_dir, "**", "*.tfrecord*"), recursive=True))
    out = []
    for record in tf.data.TFRecordDataset(files):
        example = tf.train.Example.FromString(record.numpy())
        out.append(example.features.feature["image"].bytes_list.value[0])
    return out


DECODERS = ("decode", "load", "load_prepare", "load_read", "load_end", "draft")


def decode_calls(stats: pstats.Stats) -> dict[str, int]:
    """Calls of Pillow's or TensorFlow's image decoding functions seen by the profile, by function."""
    found = {}
    for (filename, _, name), (_, calls, *_rest) in stats.stats.items():
        pillow = "PIL" in filename and name in DECODERS
        tf_decode = "decode_jpeg" in name or "decode_image" in name or "DecodeJpeg" in name
        if pillow or tf_decode:
            found[f"{os.path.basename(filename)}:{name}"] = calls
    return found


def check(data_dir: str) -> dict:
    profile = cProfile.Profile()
    profile.enable()
    build(data_dir)
    profile.disable()
    stored = stored_images(data_dir)
    sources = source_files()
    out: dict = {"records": len(stored), "sources": len(sources),
                 "decode_calls": decode_calls(pstats.Stats(profile))}
    if KIND == "jpeg":
        want = sorted(hashlib.sha256(open(p, "rb").read()).hexdigest() for p in sources)
        out["bytes_unchanged"] = sorted(hashlib.sha256(b).hexdigest() for b in stored) == want
    else:
        expected = []
        for path in sources:
            buf = io.BytesIO()
            with Image.open(path) as image:
                image.save(buf, "JPEG", quality=75)
            expected.append(hashlib.sha256(buf.getvalue()).hexdigest())
        out["all_jpeg"] = all(b[:3] == b"\xff\xd8\xff" for b in stored)
        out["equals_pillow_q75"] = sorted(hashlib.sha256(b).hexdigest() for b in stored) == sorted(expected)
    return out


def main(argv: list[str]) -> None:
    global SOURCE, KIND
    result_path, KIND, SOURCE, data_dir = argv[:4]
    if "--check" in argv[4:]:
        result = check(data_dir)
    else:
        start, cpu = time.perf_counter(), cpu_seconds()
        build(data_dir)
        result = {"seconds": time.perf_counter() - start, "cpu_seconds": cpu_seconds() - cpu}
    with open(result_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1:])
