"""Image embeddings from a user's TensorFlow model: load (local or gs://), check, preprocess, embed.

`load_embedder(spec)` loads a Keras `.keras` file or a TensorFlow SavedModel folder, reads its input
size, and checks it on a probe batch before anything is written; every problem is one `EmbedError`
line. `Embedder.embed` resizes images to the model's input, preprocesses them and runs the model in
batches of exactly `batch_size` rows (the last one padded), so an image's embedding never depends on
which other images shared its batch. TensorFlow is imported only inside functions; no Beam here.
"""
from __future__ import annotations

import atexit
import hashlib
import io
import math
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from PIL import Image

from shard_utils import storage
from shard_utils.errors import TpuShardsError
from shard_utils.extras import require
from shard_utils.media.images import resize

__all__ = [
    "PREPROCESS_MODES", "IMAGENET_MEAN", "IMAGENET_STD", "EMBEDDING_NAN", "DEFAULT_BATCH_SIZE", "MAX_BATCH_SIZE",
    "ImageInput", "EmbedError", "EmbedSpec", "ModelInfo", "parse_input_size", "preprocess", "record_pixels",
    "fit_to_input", "nonfinite_rows", "Embedder", "check_model", "load_embedder", "model_sha256", "local_model_path",
    "EmbedRecords"
]

PREPROCESS_MODES = ("scale01", "minus1to1", "imagenet", "none")
# torchvision's ImageNet statistics, on the [0, 1] scale (RGB): (x / 255 - mean) / std.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
EMBEDDING_NAN = "embedding_nan"  # the reject reason of a record whose embedding has a NaN or infinity
DEFAULT_BATCH_SIZE = 32
MAX_BATCH_SIZE = 4096
_INPUT_DTYPES = ("float16", "bfloat16", "float32", "float64", "uint8")

ImageInput = np.ndarray | bytes


class EmbedError(ValueError, TpuShardsError):
    """The embedding model cannot be used as given; the message says what to change."""


@dataclass(frozen=True)
class EmbedSpec:
    """Which model to run and how to feed it (picklable: it travels to the workers).

    `model`: a `.keras` file or a SavedModel folder, local or gs://. `preprocess`: one of
    PREPROCESS_MODES, applied to RGB pixels 0..255. `input_size`: (height, width) when the model accepts
    any size, or to state the size explicitly. `output`: the output's name for a model with several.
    """

    model: str
    preprocess: str
    input_size: tuple[int, int] | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    output: str | None = None

    def __post_init__(self) -> None:
        if self.preprocess not in PREPROCESS_MODES:
            raise EmbedError(f"--embed-preprocess {self.preprocess!r} is not one of {', '.join(PREPROCESS_MODES)}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) \
                or not 1 <= self.batch_size <= MAX_BATCH_SIZE:
            raise EmbedError(f"--embed-batch-size must be an integer from 1 to {MAX_BATCH_SIZE}, "
                             f"got {self.batch_size!r}")
        if self.input_size is not None and (len(self.input_size) != 2 or not all(
                isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in self.input_size)):
            raise EmbedError(f"--embed-input-size must be two positive integers H,W, got {self.input_size!r}")


@dataclass(frozen=True)
class ModelInfo:
    """What identifies the model and its embeddings; `to_json()` is what a manifest records."""

    path: str
    sha256: str
    format: str  # "keras" or "saved_model"
    input_size: tuple[int, int]
    input_dtype: str
    embedding_dim: int
    preprocess: str
    output: str | None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["input_size"] = list(self.input_size)
        return out


def parse_input_size(text: str) -> tuple[int, int]:
    """`--embed-input-size 224` or `224,192` -> (height, width); raises EmbedError."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        dims = [int(p) for p in parts]
    except ValueError:
        dims = []
    if len(dims) not in (1, 2) or not all(d > 0 for d in dims):
        raise EmbedError(f"--embed-input-size {text!r} must be H or H,W with positive integers")
    return (dims[0], dims[-1])


def preprocess(batch: np.ndarray, mode: str) -> np.ndarray:
    """uint8 RGB [B, H, W, 3] -> float32 model input: scale01 [0, 1], minus1to1 [-1, 1], imagenet
    (torchvision mean/std on [0, 1]), none (0..255 as float, for models that normalise inside)."""
    x = batch.astype(np.float32)
    if mode == "scale01":
        return x / np.float32(255)
    if mode == "minus1to1":
        return x / np.float32(127.5) - np.float32(1)
    if mode == "imagenet":
        mean = np.asarray(IMAGENET_MEAN, np.float32)
        std = np.asarray(IMAGENET_STD, np.float32)
        return (x / np.float32(255) - mean) / std
    if mode == "none":
        return x
    raise EmbedError(f"unknown preprocessing {mode!r}; expected one of {', '.join(PREPROCESS_MODES)}")


def record_pixels(encoded: bytes) -> np.ndarray:
    """A stored record image (JPEG bytes) as uint8 RGB [H, W, 3]: what a training input pipeline decodes."""
    with Image.open(io.BytesIO(encoded)) as image:
        return np.asarray(image.convert("RGB"))


def fit_to_input(image: ImageInput, size: tuple[int, int]) -> np.ndarray:
    """uint8 RGB [H, W, 3] (or JPEG bytes) at the model's (height, width): resized like `--resize fill`
    (cover, then centre-crop), untouched when it already has that size."""
    pixels = record_pixels(image) if isinstance(image, (bytes, bytearray)) else image
    if not isinstance(pixels, np.ndarray) or pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        shape = getattr(pixels, "shape", None)
        raise ValueError(f"an image to embed must be uint8 [H, W, 3] or JPEG bytes, got {type(image).__name__} "
                         f"{shape} {getattr(pixels, 'dtype', '')}")
    if pixels.shape[:2] == tuple(size):
        return pixels
    return np.asarray(resize(Image.fromarray(pixels, "RGB"), size, "fill"))


def nonfinite_rows(embeddings: np.ndarray) -> np.ndarray:
    """A boolean per row: True where the embedding holds a NaN or an infinity (such records are rejected)."""
    return ~np.isfinite(embeddings).all(axis=tuple(range(1, embeddings.ndim)))


class Embedder:
    """A loaded, checked model: `embed(images)` -> float32 [n, embedding_dim]."""

    def __init__(self, info: ModelInfo, run: Callable[[np.ndarray], np.ndarray], batch_size: int):
        self.info = info
        self.batch_size = batch_size
        self._run = run  # [batch_size, H, W, 3] model input -> [batch_size, D] float32

    def embed(self, images: Sequence[ImageInput]) -> np.ndarray:
        """Embeddings of the images, in order; batches are padded to batch_size with black images."""
        size, batch = self.info.input_size, self.batch_size
        out = np.empty((len(images), self.info.embedding_dim), np.float32)
        for start in range(0, len(images), batch):
            chunk = [fit_to_input(image, size) for image in images[start:start + batch]]
            pixels = np.zeros((batch, size[0], size[1], 3), np.uint8)
            pixels[:len(chunk)] = np.stack(chunk)
            out[start:start + len(chunk)] = self._run(self._model_input(pixels))[:len(chunk)]
        return out

    def _model_input(self, pixels: np.ndarray) -> np.ndarray:
        if self.info.input_dtype == "uint8":
            return pixels
        return preprocess(pixels, self.info.preprocess)


def check_model(spec: EmbedSpec) -> ModelInfo:
    """Load and probe the model on the driver, before any work: its identity, or one EmbedError line."""
    return load_embedder(spec).info


def load_embedder(spec: EmbedSpec) -> Embedder:
    """Load the model (downloading gs:// to a temporary folder), read its input, and check it on a probe batch."""
    require("tensorflow", "embed", "--embed-model")
    local = local_model_path(spec.model)
    loaded = _load_keras(local, spec) if local.endswith(".keras") else _load_saved_model(local, spec)
    fn, input_shape, input_dtype, output_name, fmt = loaded
    input_size = _input_size(input_shape, spec)
    if input_dtype not in _INPUT_DTYPES:
        raise EmbedError(f"the model's input has dtype {input_dtype}; expected a float type or uint8")
    if input_dtype == "uint8" and spec.preprocess != "none":
        raise EmbedError(f"the model takes uint8 pixels; use --embed-preprocess none (not {spec.preprocess})")
    run = _batch_runner(fn, spec.batch_size, input_size, input_dtype)
    dim = _probe(run, spec, input_size, input_dtype)
    path = spec.model if storage.is_gcs(spec.model) else os.path.abspath(spec.model)
    info = ModelInfo(path, model_sha256(local), fmt, input_size, input_dtype, dim, spec.preprocess, output_name)
    return Embedder(info, lambda x: _as_rows(run(x), dim), spec.batch_size)


def model_sha256(path: str) -> str:
    """SHA-256 of a model file; for a folder, over every file in sorted relative-path order
    (path, NUL, 8-byte big-endian size, content), so the same files always give the same value."""
    digest = hashlib.sha256()
    if os.path.isfile(path):
        with open(path, "rb") as f:
            while block := f.read(1 << 22):
                digest.update(block)
        return digest.hexdigest()
    files = []
    for root, _, names in os.walk(path):
        files += [os.path.join(root, n) for n in names]
    for full in sorted(files, key=lambda p: os.path.relpath(p, path).replace(os.sep, "/")):
        rel = os.path.relpath(full, path).replace(os.sep, "/")
        digest.update(rel.encode("utf-8") + b"\0" + os.path.getsize(full).to_bytes(8, "big"))
        with open(full, "rb") as f:
            while block := f.read(1 << 22):
                digest.update(block)
    return digest.hexdigest()


_downloads: dict[str, str] = {}
_downloads_lock = threading.Lock()


def local_model_path(uri: str) -> str:
    """A local path for the model: the path itself, or a per-process download of a gs:// object or prefix."""
    if not storage.is_gcs(uri):
        if not os.path.exists(uri):
            raise EmbedError(f"no model at {uri}: expected a .keras file or a SavedModel folder")
        return uri
    with _downloads_lock:
        if uri not in _downloads:
            _downloads[uri] = _download(uri)
        return _downloads[uri]


def _download(uri: str) -> str:
    """Copy gs://bucket/model.keras, or every object under gs://bucket/folder/, into a temporary folder."""
    folder = tempfile.mkdtemp(prefix="tpu-shards-model-")
    atexit.register(shutil.rmtree, folder, True)
    base = uri.rstrip("/")
    try:
        if base.endswith(".keras"):
            target = os.path.join(folder, storage.basename(base))
            storage.copy(base, target)
            return target
        target = os.path.join(folder, storage.basename(base) or "model")
        count = 0
        for entry in storage.walk(base):
            parts = entry.rel_path.split("/")
            if entry.reason or ".." in parts or not all(parts):
                raise EmbedError(f"cannot download the model {uri}: object {entry.rel_path!r} "
                                 f"{entry.message or 'has a name that leaves the model folder'}")
            local = os.path.join(target, *parts)
            os.makedirs(os.path.dirname(local), exist_ok=True)
            storage.copy(storage.join(base, entry.rel_path), local)
            count += 1
    except storage.NotFoundError:
        raise EmbedError(f"no model at {uri}: the object does not exist") from None
    except storage.StorageError as exc:
        raise EmbedError(f"cannot download the model {uri}: {storage.problem(exc, uri)}") from None
    if count == 0:
        raise EmbedError(f"no model at {uri}: no objects under it (expected a SavedModel folder or a .keras file)")
    return target


def _load_keras(path: str, spec: EmbedSpec):
    """A Keras v3 file: (call, input shape, input dtype, output name, "keras"). Unsafe (lambda) layers are refused."""
    import keras
    import tensorflow as tf

    try:
        model = keras.saving.load_model(path, compile=False)
    except Exception as exc:
        raise EmbedError(f"cannot load the Keras model {path}: {_first_line(exc)}") from None
    if len(model.inputs) != 1:
        raise EmbedError(f"the model has {len(model.inputs)} inputs; an embedding model takes one image batch")
    names = list(getattr(model, "output_names", None) or [f"output_{i}" for i in range(len(model.outputs))])
    index = _choose_output(names, spec.output)

    def call(x):
        out = model(x, training=False)
        if isinstance(out, dict):
            return out[names[index]]
        return out[index] if isinstance(out, (list, tuple)) else out

    shape = tuple(model.inputs[0].shape)
    return tf.function(call), shape, str(tf.as_dtype(model.inputs[0].dtype).name), \
        (names[index] if len(names) > 1 else None), "keras"


def _load_saved_model(path: str, spec: EmbedSpec):
    """A SavedModel folder, called through its `serving_default` signature.

    Returns (call, input shape, input dtype, output name, "saved_model").
    """
    import tensorflow as tf

    if not os.path.isdir(path) or not os.path.exists(os.path.join(path, "saved_model.pb")):
        raise EmbedError(f"{spec.model} is neither a .keras file nor a SavedModel folder (no saved_model.pb)")
    try:
        loaded = tf.saved_model.load(path)
    except Exception as exc:
        raise EmbedError(f"cannot load the SavedModel {spec.model}: {_first_line(exc)}") from None
    signature = loaded.signatures.get("serving_default")
    if signature is None:
        raise EmbedError(f"the SavedModel {spec.model} has no 'serving_default' signature (it has "
                         f"{', '.join(loaded.signatures) or 'none'}); export it with model.export(path) or "
                         "tf.saved_model.save(obj, path, signatures=...)")
    args, kwargs = signature.structured_input_signature
    inputs = list(args) + list(kwargs.items())
    if len(inputs) != 1:
        raise EmbedError(f"the model's signature has {len(inputs)} inputs; an embedding model takes one image batch")
    input_name, input_spec = inputs[0]
    names = sorted(signature.structured_outputs)
    output = names[_choose_output(names, spec.output)]

    def call(x):
        return signature(**{input_name: x})[output]

    return call, tuple(input_spec.shape), input_spec.dtype.name, (output if len(names) > 1 else None), "saved_model"


def _choose_output(names: list[str], wanted: str | None) -> int:
    if wanted is not None:
        if wanted not in names:
            raise EmbedError(f"the model has no output {wanted!r}; its outputs are {', '.join(names)}")
        return names.index(wanted)
    if len(names) != 1:
        raise EmbedError(f"the model has {len(names)} outputs ({', '.join(names)}); name the embedding with "
                         "--embed-output")
    return 0


def _input_size(shape: tuple, spec: EmbedSpec) -> tuple[int, int]:
    """(height, width) from an input shape [batch, H, W, 3], or from --embed-input-size when the model's is open."""
    if len(shape) != 4 or shape[3] != 3:
        raise EmbedError(f"the model's input has shape {_shape_text(shape)}; expected [batch, height, width, 3] "
                         "(RGB images)")
    fixed = (shape[1], shape[2])
    if spec.input_size is None:
        if None in fixed:
            raise EmbedError(f"the model accepts images of any size ({_shape_text(shape)}); "
                             "pass --embed-input-size H,W")
        return int(fixed[0]), int(fixed[1])
    for given, own, name in zip(spec.input_size, fixed, ("height", "width"), strict=True):
        if own is not None and own != given:
            raise EmbedError(f"--embed-input-size {spec.input_size[0]},{spec.input_size[1]} does not match the "
                             f"model's input {_shape_text(shape)} ({name} {own})")
    return spec.input_size


def _batch_runner(fn, batch_size: int, size: tuple[int, int], dtype: str) -> Callable[[np.ndarray], np.ndarray]:
    """Calls the model on [batch_size, H, W, 3] arrays only: one shape, so one trace and the same kernels."""
    import tensorflow as tf

    tf_dtype = tf.as_dtype(dtype)

    def run(x: np.ndarray) -> np.ndarray:
        return np.asarray(fn(tf.cast(tf.convert_to_tensor(x), tf_dtype)))

    return run


def _probe(run, spec: EmbedSpec, size: tuple[int, int], dtype: str) -> int:
    """Run one batch of ordinary images (gray, gradient, noise); returns D or raises EmbedError."""
    h, w = size
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:h, 0:w]
    gradient = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), 255 - x * 255 // max(w - 1, 1)],
                        -1).astype(np.uint8)
    samples = [np.full((h, w, 3), 128, np.uint8), gradient, rng.integers(0, 256, (h, w, 3), dtype=np.uint8)]
    pixels = np.stack([samples[i % len(samples)] for i in range(spec.batch_size)])
    x = pixels if dtype == "uint8" else preprocess(pixels, spec.preprocess)
    try:
        out = run(x)
    except Exception as exc:
        raise EmbedError(f"the model fails on a [{spec.batch_size}, {h}, {w}, 3] {dtype} batch: "
                         f"{_first_line(exc)}") from None
    if out.ndim < 2 or out.shape[0] != spec.batch_size:
        raise EmbedError(f"the model's output has shape {list(out.shape)} for a batch of {spec.batch_size}; "
                         "expected [batch, D]")
    dims = [d for d in out.shape[1:] if d != 1]
    if len(dims) > 1:
        raise EmbedError(f"the model's output has shape {['batch', *out.shape[1:]]}, not one vector per image; "
                         "use a model that pools its features (e.g. Keras applications with pooling='avg')")
    if not np.issubdtype(out.dtype, np.number):
        raise EmbedError(f"the model's output has dtype {out.dtype}; expected numbers")
    if nonfinite_rows(out.reshape(out.shape[0], -1).astype(np.float32)).any():
        raise EmbedError(f"the model gives NaN or infinite values on ordinary images (gray, gradient, noise) "
                         f"preprocessed with {spec.preprocess!r}; check the model and --embed-preprocess")
    return int(math.prod(out.shape[1:]))


def _as_rows(out: np.ndarray, dim: int) -> np.ndarray:
    return out.reshape(out.shape[0], dim).astype(np.float32, copy=False)


def _shape_text(shape: tuple) -> str:
    return "[" + ", ".join("None" if d is None else str(d) for d in shape) + "]"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


_LOADED: dict[EmbedSpec, Embedder] = {}  # one model per spec per process


class EmbedRecords:
    """Adds the model's embedding to prepared records (every frame of a clip) and frames them; a record whose
    embedding holds NaN or infinite values becomes an `embedding_nan` rejection. The model is loaded once per
    process. The same records in the same order always form the same model batches."""

    def __init__(self, spec: EmbedSpec, key: str):
        self.spec, self.key = spec, key

    def __call__(self, prepared: Sequence) -> list:
        from shard_utils.media.encode import framed

        if not prepared:
            return []
        if self.spec not in _LOADED:
            _LOADED[self.spec] = load_embedder(self.spec)
        images, counts = [], []
        for p in prepared:
            frames = [p.record.encoded] if p.record.frames is None else list(p.record.frames)
            images += frames
            counts.append(len(frames))
        vectors = _LOADED[self.spec].embed(images)
        out, at = [], 0
        for p, n in zip(prepared, counts, strict=True):
            rows, at = vectors[at:at + n], at + n
            if nonfinite_rows(rows).any():
                out.append({"source": p.meta.source_id, "reason": EMBEDDING_NAN,
                            "message": "the model's embedding of this image holds NaN or infinite values"})
            else:
                out.append(framed(p, tuple(float(x) for x in rows.reshape(-1)), self.key))
        return out
