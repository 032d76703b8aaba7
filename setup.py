"""tpu-shards: balanced JPEG TFRecord shards for TPUs, built with Apache Beam, plus a tf.data loader.

Staged to Dataflow workers with --setup_file ./setup.py; workers need no TensorFlow unless they compute
embeddings (extra `embed`), and PyAV only for video input (extra `video`).
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
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["beam_jobs", "beam_jobs.*", "shard_utils", "shard_utils.*"]),
    install_requires=[
        "apache-beam[gcp]>=2.77,<3",
        "google-cloud-storage>=3,<4",
        "google-crc32c>=1.5",
        "numpy>=1.26",
        "Pillow>=12",
        "protobuf>=6.33,<7",
        "fastavro>=1.9",  # the per-split record index and Avro listings
        "tqdm>=4.66",  # the build's progress bars, shown by default on a terminal
    ],
    extras_require={
        "tf": ["tensorflow-cpu>=2.21,<2.22"],
        "heif": ["pillow-heif>=1.8,<2"],  # HEIC/HEIF phone photos (AVIF needs nothing: Pillow 12 reads it)
        "array_record": ["array-record>=0.8"],  # --format array_record/both: Grain's random-access shards
        # Reading with Grain: RandomAccessSource and Grain's ArrayRecordDataSource (which needs array-record; Grain
        # requires it too, except on Windows). Not pulled by `array_record`, which Dataflow images install to write.
        "grain": ["grain>=0.2.18", "array-record>=0.8"],
        "report": ["matplotlib>=3.8"],
        # JAX training input (shard_utils.jax_loader): global jax.Array batches, Orbax-saved input state, Grain
        "jax": ["jax>=0.7", "orbax-checkpoint>=0.11", "grain>=0.2.18", "array-record>=0.8"],
        # Validating croissant.json with MLCommons' own checker; writing it needs nothing (it is plain JSON)
        "croissant": ["mlcroissant>=1.1,<1.2"],
        "video": ["av>=18,<20"],  # video clips (PyAV bundles FFmpeg)
        "embed": ["tensorflow-cpu>=2.21,<2.22"],  # --embed-model; the loader's TensorFlow is the same
        # benchmarks/bench_build.py: the TensorFlow Datasets peer it compares the job with
        "bench": ["tensorflow-cpu>=2.21,<2.22", "tensorflow-datasets>=4.9.10,<4.10"],
        "test": [
            "tensorflow-cpu>=2.21,<2.22",
            "pillow-heif>=1.8,<2",
            "av>=18,<20",
            "pytest>=8",
            "pytest-xdist>=3.5",  # the full run's two processes (README): a file's tests stay in one of them
            "hypothesis>=6.100",
            "gcp-storage-emulator>=2024.8",
            "nbformat>=5",
            "matplotlib>=3.8",
            "grain>=0.2.18",  # random access is tested against the real Grain and TFDS
            "array-record>=0.8",  # ArrayRecord shards are written and read with the real package
            "tensorflow-datasets>=4.9.10,<4.10",
            "mlcroissant>=1.1,<1.2",  # every build's croissant.json is validated by the real checker
            "jax>=0.7",  # the JAX loader on 8 CPU devices and several local processes
            "orbax-checkpoint>=0.11",  # its input state saved beside the model
            "imagehash>=4.3",  # the perceptual hash near-duplicates are compared with
            "pandas>=2",  # the README reads the index with pandas; its test would otherwise skip
            "mkdocs>=1.6",  # tests/test_docs.py builds the docs site with warnings as errors
            "mkdocstrings[python]>=1.0",
            "ruff>=0.6",  # tests/test_checks.py: the lint pyproject.toml configures
            "mypy>=1.10",  # and its type check of the public modules
        ],
        "docs": ["mkdocs>=1.6", "mkdocstrings[python]>=1.0"],  # mkdocs serve / mkdocs build (mkdocs.yml)
    },
    entry_points={"console_scripts": ["tpu-shards=beam_jobs.cli:console"]},
)
