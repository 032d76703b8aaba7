"""tpu-shards: balanced JPEG TFRecord shards for TPUs, built with Apache Beam, plus a tf.data loader.

Staged to Dataflow workers with --setup_file ./setup.py; workers need no TensorFlow.
"""
import re
from pathlib import Path

from setuptools import find_packages, setup

VERSION = re.search(r'__version__ = "([^"]+)"', Path(__file__).with_name("shard_utils").joinpath(
    "__init__.py").read_text()).group(1)

setup(
    name="tpu-shards",
    version=VERSION,
    description="Balanced, JPEG-encoded TFRecord shards for TPU cores, with a manifest and a tf.data loader",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8")
    if Path(__file__).with_name("README.md").exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["beam_jobs", "beam_jobs.*", "shard_utils", "shard_utils.*"]),
    install_requires=[
        "apache-beam[gcp]>=2.77,<3",
        "google-cloud-storage>=3,<4",
        "google-crc32c>=1.5",
        "numpy>=1.26",
        "Pillow>=12",
        "protobuf>=6.33,<7",
    ],
    extras_require={
        "tf": ["tensorflow-cpu>=2.21,<2.22"],
        "heif": ["pillow-heif>=1.8,<2"],  # HEIC/HEIF phone photos (AVIF needs nothing: Pillow 12 reads it)
        # `tpu-shards inspect --report` and the build's progress bars; not needed to build or load
        "report": ["matplotlib>=3.8", "tqdm>=4.66"],
        # benchmarks/bench_build.py: the TensorFlow Datasets peer it compares the job with
        "bench": ["tensorflow-cpu>=2.21,<2.22", "tensorflow-datasets>=4.9.10,<5"],
        "test": [
            "tensorflow-cpu>=2.21,<2.22",
            "pillow-heif>=1.8,<2",
            "pytest>=8",
            "hypothesis>=6.100",
            "gcp-storage-emulator>=2024.8",
            "nbformat>=5",
            "matplotlib>=3.8",
            "tqdm>=4.66",
        ],
    },
    entry_points={"console_scripts": ["tpu-shards=beam_jobs.cli:main"]},
)
