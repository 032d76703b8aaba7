"""Embeddings in the pipeline: Beam's RunInference with a model handler around `shard_utils.media.embed.Embedder`.

Batches are formed from the keys, not from bundles: elements are bucketed by a hash of their key and
sorted by key within a bucket (`KeyedBatches`), then run through RunInference without its own batching.
TensorFlow's CPU kernels can round a row differently at another position in the batch (seen here with
EfficientNetB0: about 1e-7 relative), so batches made from whatever a bundle holds would make the
embeddings, and so the shards, depend on the runner.

Why not Beam's `TFModelHandlerNumpy`: its module imports `tensorflow_hub` (not a dependency here) and
loads models with `tf.keras.models.load_model`, which in Keras 3 refuses SavedModel folders; it stacks
the elements as they come (no resize to the model's input, no padding to one batch shape) and has no
NaN handling. RunInference still loads the model once per process, shares it and keeps the metrics.
TensorFlow is imported when the model is loaded, never by importing this module.
"""
from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Iterable, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.ml.inference.base import KeyedModelHandler, ModelHandler, RunInference

from shard_utils.media.embed import EMBEDDING_NAN, Embedder, EmbedSpec, ImageInput, load_embedder, nonfinite_rows

METRICS_NAMESPACE = "tpu_shards_embed"
BATCHES_PER_BUCKET = 16  # a bucket holds about this many batches: its tail batch is the only padded one


class _NoMemoryNotice(logging.Filter):
    """Drops RunInference's "Resource module is not available ..." warning, logged on the root logger at every
    model load and batch when PyTorch is absent (Beam reads memory use through a module that needs it): it
    concerns Beam's metrics, not the user's build."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Resource module is not available")


# Installed wherever this module is imported: the driver and every worker process that unpickles the handler.
if not any(isinstance(f, _NoMemoryNotice) for f in logging.getLogger().filters):
    logging.getLogger().addFilter(_NoMemoryNotice())


class EmbeddingModelHandler(ModelHandler[ImageInput, np.ndarray, Embedder]):
    """Loads the model of an EmbedSpec and embeds a batch of images (uint8 [H, W, 3] arrays or JPEG bytes).

    Meant for prebatched input (`.with_no_batching()`, batches from KeyedBatches); the Embedder pads every
    model call to `spec.batch_size` rows, so the model always sees one shape.
    """

    def __init__(self, spec: EmbedSpec):
        super().__init__()
        self.spec = spec

    def load_model(self) -> Embedder:
        return load_embedder(self.spec)

    def run_inference(self, batch: Sequence[ImageInput], model: Embedder,
                      inference_args: dict[str, Any] | None = None) -> Iterable[np.ndarray]:
        return list(model.embed(batch))

    def get_num_bytes(self, batch: Sequence[ImageInput]) -> int:
        return sum(x.nbytes if isinstance(x, np.ndarray) else len(x) for x in batch)

    def get_metrics_namespace(self) -> str:
        return METRICS_NAMESPACE


class KeyedBatches(beam.PTransform):
    """(key, value) -> lists of at most `batch_size` (key, value) pairs, made from the keys alone.

    Args:
      batch_size: the largest batch.

    Elements go to one of max(1, n / (batch_size x 16)) buckets by a hash of repr(key) and are sorted by
    repr(key) (then by content, for equal keys) inside it; each bucket is cut into batches in that order.
    The same elements therefore always form the same batches, whatever the runner or bundling. A worker
    holds one bucket (about 16 batches) at a time.
    """

    def __init__(self, batch_size: int):
        super().__init__()
        self.batch_size = batch_size

    def expand(self, pcoll):
        count = pcoll | "Count" >> beam.combiners.Count.Globally()
        return (pcoll
                | "Bucket" >> beam.Map(_to_bucket, self.batch_size, beam.pvalue.AsSingleton(count))
                | "Group" >> beam.GroupByKey()
                | "Cut" >> beam.FlatMap(_cut, self.batch_size))


def _to_bucket(item, batch_size: int, count: int):
    buckets = max(1, math.ceil(count / (batch_size * BATCHES_PER_BUCKET)))
    digest = hashlib.sha256(repr(item[0]).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % buckets, item


def _cut(bucket, batch_size: int):
    _, items = bucket
    ordered = sorted(items, key=lambda kv: (repr(kv[0]), _content_digest(kv[1])))
    for start in range(0, len(ordered), batch_size):
        yield ordered[start:start + batch_size]


def _content_digest(value) -> bytes:
    data = value.tobytes() if isinstance(value, np.ndarray) else bytes(value)
    return hashlib.sha256(data).digest()


class EmbedImages(beam.PTransform):
    """(key, image) -> (key, float32 embedding [D]), through RunInference.

    Args:
      spec: the model and how to feed it (`shard_utils.media.embed.EmbedSpec`); check it on the driver first with
        `shard_utils.media.embed.check_model(spec)`, which raises a one-line EmbedError.

    Input elements: (key, image), the image a uint8 RGB array [H, W, 3] of any size (resized to the model's
    input inside) or the record's JPEG bytes (smaller to shuffle). Keys are unique values with a stable
    repr, e.g. a source id, or (source id, frame index) for the frames of a clip. Returns a tuple of two
    PCollections: `embeddings` with (key, np.ndarray float32 [D]) and `rejected` with
    (key, "embedding_nan", message) for images whose embedding holds a NaN or an infinity.
    """

    def __init__(self, spec: EmbedSpec):
        super().__init__()
        self.spec = spec

    def expand(self, images):
        handler: ModelHandler = KeyedModelHandler(EmbeddingModelHandler(self.spec)).with_no_batching()
        return (images
                | "Batch" >> KeyedBatches(self.spec.batch_size)
                | "RunInference" >> RunInference(handler)
                | "SplitNonFinite" >> beam.ParDo(_SplitNonFinite()).with_outputs("rejected", main="embeddings"))


class _SplitNonFinite(beam.DoFn):
    def process(self, item):
        key, embedding = item
        if nonfinite_rows(embedding[None, :])[0]:
            beam.metrics.Metrics.counter(METRICS_NAMESPACE, "embeddings_nan").inc()
            yield beam.pvalue.TaggedOutput("rejected", (key, EMBEDDING_NAN, "the model's embedding of this image "
                                                                            "holds NaN or infinite values"))
            return
        yield key, embedding
