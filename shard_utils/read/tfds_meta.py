"""The files TensorFlow Datasets needs beside our shards, so `tfds.builder_from_directory(output)` loads them.

From the manifest alone, without TFDS or TensorFlow: `dataset_info.json` (every split's shard lengths,
bytes and a `filepathTemplate` that names our own shard files, and the supervised keys), `features.json` and
the label names file. Features are the records' own keys, at the top level:

    {"image/encoded": Image(jpeg), "image/class/label": ClassLabel(names), "image/source_id": Text}

so `example["image/encoded"]` is a uint8 image and `example["image/class/label"]` the label (a Sequence of
ClassLabel for a multi-label dataset), and `as_supervised=True` gives (image, label) pairs: TFDS looks the
supervised keys up at the top level only. TFDS's JSON parsers are strict: nothing else is written. With a
`label_offset`, the first `label_offset` class names are placeholders (`unused-0`, ...), as the stored ids are
shifted by that much.

A dataset without labels (an unlabeled build, e.g. a Kaggle test set) has no ClassLabel: its label is a plain
int64 Tensor (schema.NO_LABEL, -1, in every record), it has no label names file and no supervised keys.

A split grown by appends cannot be one TFDS split: TFDS allows one filepathTemplate per split, and old shards
(`-of-00008`) are never renamed. Each generation is then its own TFDS split, generation 0 included
(`train-g000`, `train-g001`, ...), so `split="train"` is refused by TFDS ("Unknown split 'train'. Should be one
of ['train-g000', 'train-g001', ...]") instead of silently reading generation 0 alone; `split_expression(m,
"train")` gives `"train-g000+train-g001"`, the whole split, which the dataset's description also lists.
"""
from __future__ import annotations

import json
import posixpath
import re
from typing import Any

from shard_utils.format import filenames, schema
from shard_utils.format.filenames import generation_split
from shard_utils.format.manifest import Manifest, Shard
from shard_utils.format.shard_formats import ARRAY_RECORD, FIRST, of_shard

__all__ = ["GENERATION_0", "tfds_files", "class_names", "split_expression", "tfds_split_name", "array_record_builder"]

DATASET_INFO, FEATURES, LABELS = filenames.TFDS_DATASET_INFO, filenames.TFDS_FEATURES, filenames.TFDS_LABELS
GENERATION_0 = "g000"  # the TFDS name of generation 0 once a split has several: train-g000
_SPLIT = re.compile(r"^[A-Za-z0-9_-]+$")  # TFDS split names: word characters and '-'
_FEATURES = "tensorflow_datasets.core.features."


def tfds_files(m: Manifest, *, name: str = "tpu_shards", version: str = "1.0.0") -> dict[str, bytes]:
    """{file name: bytes} to write in the dataset folder (beside manifest.json) for TFDS to read it."""
    if m.media != "image":
        raise ValueError(f"TFDS metadata is written for image datasets; this one holds {m.media}")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise ValueError(f"TFDS needs a snake_case dataset name and an x.y.z version, got {name!r}, {version!r}")
    names = class_names(m) if m.labels else []
    info: dict[str, Any] = {"name": name, "version": version, "fileFormat": m.formats[0],
                            "description": _description(m),
                            "splits": [info for split in m.splits for info in _split_infos(split, m)]}
    if names:
        info["supervisedKeys"] = {"tuple": {"items": [{"featureKey": schema.IMAGE_ENCODED},
                                                      {"featureKey": schema.LABEL}]}}
    if _both(m):
        info["alternativeFileFormats"] = list(m.formats[1:])
    files = {DATASET_INFO: _json(info), FEATURES: _json(_features(m, len(names)))}
    if names:
        files[LABELS] = "".join(n + "\n" for n in names).encode("utf-8")
    return files


def class_names(m: Manifest) -> list[str]:
    """ClassLabel names indexed by stored id: label_offset placeholders, then the labels."""
    placeholders = [f"unused-{i}" for i in range(m.label_offset)]
    names = placeholders + list(m.labels)
    for label in m.labels:
        if not label or label != label.strip() or "\n" in label or "\r" in label or label in placeholders:
            raise ValueError(f"label {label!r} cannot be a TFDS class name (one per line, no surrounding blanks, "
                             "not a placeholder)")
    if not names:
        raise ValueError("a dataset with no labels has no TFDS ClassLabel")
    return names


def split_expression(m: Manifest, split: str) -> str:
    """The TFDS split expression reading every generation of `split`: `train`, or `train-g000+train-g001+...`."""
    generations = _by_generation(m.split(split).shards)
    return "+".join(tfds_split_name(split, g, len(generations)) for g in generations)


def tfds_split_name(split: str, generation: int, generations: int) -> str:
    """The TFDS split of one generation: the split's own name while it has one generation, else `train-g000`..."""
    if generation == 0 and generations > 1:
        return f"{split}-{GENERATION_0}"
    return generation_split(split, generation)


def _description(m: Manifest) -> str:
    grown = [f"{name}: {split_expression(m, name)!r}" for name, split in m.splits.items()
             if len({s.generation for s in split.shards}) > 1]
    whole = f". Splits grown by appends are one TFDS split per generation; read them whole with split= " \
            f"{'; '.join(grown)}" if grown else ""
    return f"Image classification records written by tpu-shards {m.tool_version}".strip() + whole


def _by_generation(shards: list[Shard]) -> dict[int, list[Shard]]:
    groups: dict[int, list[Shard]] = {}
    for shard in shards:
        groups.setdefault(shard.generation, []).append(shard)
    return groups


def _both(m: Manifest) -> bool:
    """Whether TFDS can read either format: ArrayRecord twins beside `.tfrecord` shards (TFDS names a format by
    its file suffix, so twins of `.tfrec` shards are not offered to it)."""
    first = m.first_format
    return len(m.formats) > 1 and all(first.extension_of(posixpath.basename(s.path)) == first.name
                                      for split in m.splits.values() for s in split.shards)


def _split_infos(split: str, m: Manifest) -> list[dict[str, Any]]:
    """One TFDS split per generation of `split`."""
    if not _SPLIT.match(split):
        raise ValueError(f"split {split!r} is not a TFDS split name (letters, digits, '_' and '-' only)")
    out = []
    generations = _by_generation(m.split(split).shards)
    for generation, shards in generations.items():
        name = tfds_split_name(split, generation, len(generations))
        if name != split and name in m.splits:
            raise ValueError(f"split {name!r} is both a split and generation {generation} of split {split!r}")
        out.append({"name": name, "numBytes": str(sum(s.num_bytes for s in shards)),
                    "shardLengths": [str(s.num_records) for s in shards],
                    "filepathTemplate": _template(name, generation_split(split, generation),
                                                  [s.path for s in shards], _both(m))})
    return out


def _template(split: str, stored_as: str, paths: list[str], any_format: bool = False) -> str:
    """TFDS's filepathTemplate for our shard names (stored under `stored_as`, read as TFDS split `split`);
    refuses names it would not reproduce exactly. `any_format`: the suffix is TFDS's {FILEFORMAT}, so the
    template names the TFRecord shards and their ArrayRecord twins alike."""
    shard_format = of_shard(posixpath.basename(paths[0]))
    first = shard_format.matches(posixpath.basename(paths[0])) if shard_format else None
    folder = posixpath.dirname(paths[0])
    prefix = "{SPLIT}" if stored_as == split else stored_as
    suffix = "{FILEFORMAT}" if any_format else first["extension"] if first else ""
    template = posixpath.join(folder, prefix + "-{SHARD_X_OF_Y}." + suffix) if first else ""
    digits = max(len(str(len(paths))), 5)  # TFDS pads index and count to this width
    for i, path in enumerate(paths):
        expected = template.format(SPLIT=split, SHARD_X_OF_Y=f"{i:0{digits}d}-of-{len(paths):0{digits}d}",
                                   FILEFORMAT=FIRST.name)
        if path != expected:
            raise ValueError(f"split {split!r}: shard {path!r} is not named as TFDS expects ({expected!r})")
    return template


def _feature(kind: str, cls: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"pythonClassName": _FEATURES + cls, kind: body}


def _dict(features: dict[str, Any]) -> dict[str, Any]:
    return _feature("featuresDict", "features_dict.FeaturesDict", {"features": features})


def _features(m: Manifest, num_classes: int) -> dict[str, Any]:
    height, width = m.image_size or (-1, -1)
    image = _feature("image", "image_feature.Image", {
        "shape": {"dimensions": [str(height), str(width), "3"]}, "dtype": "uint8", "encodingFormat": "jpeg"})
    label = _feature("classLabel", "class_label_feature.ClassLabel", {"numClasses": str(num_classes)})
    if not num_classes:  # no labels: every record holds NO_LABEL
        label = _feature("tensor", "tensor_feature.Tensor", {"shape": {}, "dtype": "int64", "encoding": "none"})
    elif m.multi_label:
        label = _feature("sequence", "sequence_feature.Sequence", {"feature": label, "length": "-1"})
    text = _feature("text", "text_feature.Text", {})
    return _dict({schema.IMAGE_ENCODED: image, schema.LABEL: label, schema.SOURCE_ID: text})


def _json(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def array_record_builder(dataset: str):
    """`tfds.builder_from_directory(dataset)` reading the ArrayRecord shards, for `as_data_source`: a dataset
    built with --format both lists them as TFDS's alternative format, which TFDS 4.9's own `file_format=`
    argument refuses to switch to ("File format is already set"); the builder's format is switched here."""
    from shard_utils.extras import require

    tfds = require("tensorflow_datasets", "bench", "reading a dataset with TFDS")
    builder = tfds.builder_from_directory(dataset)
    if builder.info.file_format.value != ARRAY_RECORD.name:
        if ARRAY_RECORD.name not in {f.value for f in builder.info.alternative_file_formats}:
            raise ValueError(f"{dataset} has no ArrayRecord shards for TFDS (build with --format both or "
                             "array_record)")
        builder.info.set_file_format(ARRAY_RECORD.name, override=True, override_if_initialized=True)
    return builder
