"""The manifest: the dataset's contract with the loader, `verify` and `inspect`.

Loading validates every field and refuses shard paths that leave the dataset folder.
Nothing in a manifest is ever evaluated, unpickled or imported: it is plain JSON.
"""
from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import IO, Any

from shard_utils import storage
from shard_utils.errors import InternalError, TpuShardsError
from shard_utils.format import json_text, json_values, names, schema
from shard_utils.format import splits as split_expressions
from shard_utils.format.filenames import (  # noqa: F401
    CARD_NAME,
    CROISSANT_NAME,
    MANIFEST_NAME,
    REJECTED_NAME,
    SKIPPED_NAME,
)
from shard_utils.format.image_size import MAX_IMAGE_SIDE, ImageSize
from shard_utils.format.shard_formats import ARRAY_RECORD as AR
from shard_utils.format.shard_formats import FIRST, FORMATS, TFRECORD, ShardFormat, get

__all__ = [
    "ARRAY_RECORD", "ARRAY_RECORD_PATTERN", "CARD_NAME", "CROISSANT_NAME", "MANIFEST_NAME", "REJECTED_NAME",
    "SHARD_PATTERN", "SKIPPED_NAME", "array_record_name", "FORMAT_VERSION", "ARRAY_RECORD_VERSION",
    "READABLE_VERSIONS", "SHARD_FORMATS", "MEDIA", "MAX_MANIFEST_BYTES",
    "ManifestError", "Shard", "Generation", "IndexFile", "Split", "Manifest", "unknown_split", "safe_relative_path",
    "from_dict", "check_generations", "parse", "MAX_REPORT_LINE", "bounded_lines", "iter_report_entries",
    "read_report", "manifest_path", "read_manifest_bytes", "load", "assemble"
]

FORMAT_VERSION = TFRECORD.manifest_version
ARRAY_RECORD_VERSION = AR.manifest_version  # ArrayRecord shards only: readers of 1 and 2 must refuse it
# The names the stable path `shard_utils.manifest` has always exported, now the shard formats' own.
ARRAY_RECORD = AR.name
SHARD_PATTERN = TFRECORD.pattern.pattern
ARRAY_RECORD_PATTERN = AR.pattern.pattern
array_record_name = AR.twin_name
READABLE_VERSIONS = (1, 2, 3)  # 1: before media, label_offset, multi_label, embedding, indexes, duplicates
# Version 2 also carries, once a dataset has been appended to, `generations` and each later shard's `generation`;
# both are optional, so a manifest without them (a dataset built once) is unchanged. A dataset built with
# --format both stays version 2: its `shards` are TFRecord as before, and each split's `array_record_shards`
# (twins, one per shard, the same records in the same order) are ignored by older readers. Version 3 has
# `shard_format: "array_record"`: its `shards` are ArrayRecord files and it has no index.
SHARD_FORMATS = tuple(FORMATS)
MEDIA = ("image", "video")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CRC32C = re.compile(r"^[A-Za-z0-9+/]{6}==$")
MAX_MANIFEST_BYTES = 64 * 2**20  # a manifest of a quarter of a million shards; a larger one is refused unparsed


class ManifestError(ValueError, TpuShardsError):
    """A manifest is missing, malformed or unsafe; the message says which field and why."""


@dataclass(frozen=True)
class Shard:
    """One shard file, relative to the manifest's folder."""

    path: str
    num_records: int
    num_bytes: int
    crc32c: str
    sha256: str
    generation: int = 0  # which build (0) or append (1, 2, ...) wrote it


@dataclass(frozen=True)
class Generation:
    """One build (generation 0) or append of a dataset, with its own accounting:
    files_seen = its records + rejected + skipped. `already_in_dataset` counts the files it found already there
    (not counted in files_seen)."""

    generation: int
    created: str
    input: str
    files_seen: int
    num_records: dict[str, int]  # per split (splits it added nothing to are absent)
    num_shards: dict[str, int]
    rejected: int
    skipped: int
    already_in_dataset: int = 0
    labels_added: list[str] = field(default_factory=list)
    tool_version: str = ""
    # per split: records of earlier generations its shards hold, copied from the split's latest generation,
    # which they replace (an append whose new records were too few for shards of their own)
    carried: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class IndexFile:
    """A split's per-record index (Avro), relative to the manifest's folder."""

    path: str
    num_rows: int
    num_bytes: int
    crc32c: str
    sha256: str


@dataclass(frozen=True)
class Split:
    """One split's totals and shards."""

    num_records: int
    num_bytes: int
    class_counts: dict[str, int]
    shards: list[Shard]
    index: IndexFile | None = None
    array_record_shards: list[Shard] | None = None  # --format both: each shard's ArrayRecord twin, in shard order
    unlabeled: int = 0  # records without a label (schema.NO_LABEL): all of them in an unlabeled build

    @property
    def labeled(self) -> bool:
        """False for a split of unlabeled records (e.g. a Kaggle test set): the loader yields their source ids."""
        return not (self.unlabeled and self.unlabeled == self.num_records)


@dataclass
class Manifest:
    """A loaded, validated manifest. `location` is the folder (local or gs://) it was read from."""

    tool_version: str
    created: str
    input: str
    options: dict[str, Any]
    features: dict[str, dict[str, Any]]
    labels: list[str]
    splits: dict[str, Split]
    rejected: dict[str, Any]
    skipped: dict[str, Any]
    files_seen: int
    image_size: list[int] | None = None
    num_cores: int = 8
    num_hosts: int = 1
    media: str = "image"
    label_offset: int = 0  # stored label = label id + label_offset (e.g. 1 for readers that subtract 1)
    multi_label: bool = False
    embedding: dict[str, Any] | None = None  # key, dim, shape, model, model_sha256, preprocess, input_size
    duplicates: dict[str, Any] | None = None  # with --dedup: count, cross_split {"train|test": n}
    quality: dict[str, Any] | None = None  # the quality checks: count, by_kind {kind: n}, path (quality.jsonl)
    generations: list[Generation] | None = None  # None: built once (every shard is generation 0)
    shard_format: str = FIRST.name  # what `shards` are: tfrecord, or array_record (--format array_record)
    format_version: int = FORMAT_VERSION
    location: str = field(default="", compare=False)

    @property
    def tpu(self) -> str | None:
        """The TPU slice the build was balanced for (`--tpu`, e.g. "v5e-16"), or None (given as cores x hosts, or a
        build before --tpu existed)."""
        value = self.options.get("tpu")
        return value if isinstance(value, str) and value else None

    @property
    def num_classes(self) -> int:
        return len(self.labels)

    def split(self, name: str) -> Split:
        """A split by name, or a ManifestError naming the closest names and listing the splits there are."""
        if name not in self.splits:
            raise ManifestError(unknown_split(name, list(self.splits)))
        return self.splits[name]

    def select(self, expression: str | Sequence[str]) -> split_expressions.Selection:
        """The records a split name, expression ('train[:80%]+validation', 'fold0+fold1') or list of them selects,
        as shard pieces (see `shard_utils.format.splits`). An unknown split is a ManifestError naming the closest
        names, before anything else is checked; a malformed expression a ValueError naming what is wrong."""
        terms = split_expressions.parse(expression)
        for term in terms:
            if term.name != split_expressions.ALL or split_expressions.ALL in self.splits:
                self.split(term.name)
        counts = {name: [s.num_records for s in split.shards] for name, split in self.splits.items()}
        return split_expressions.resolve(expression, counts)

    def num_records(self, split: str | Sequence[str]) -> int:
        """Records of a split, or of what a split expression selects."""
        if not split_expressions.is_expression(split):
            return self.split(split).num_records  # type: ignore[arg-type]
        return self.select(split).num_records

    @property
    def formats(self) -> tuple[str, ...]:
        """The shard formats the dataset holds: ("tfrecord",), ("array_record",) or both."""
        twins = any(s.array_record_shards for s in self.splits.values())
        return (self.shard_format, AR.name) if twins else (self.shard_format,)

    @property
    def first_format(self) -> ShardFormat:
        """The format of the splits' `shards` (the manifest's `shard_format`)."""
        return get(self.shard_format)

    def shard_paths(self, split: str | Sequence[str]) -> list[str]:
        """Full paths (local or gs://) of the TFRecord shards of a split, or of an expression made of whole shards
        ('fold0+fold1', 'train[:4shard]'), in reading order; ManifestError for a dataset of ArrayRecord shards only,
        ValueError for an expression that cuts a shard (read it with the loader)."""
        if not self.first_format.indexed:
            raise ManifestError(f"split {split!r} holds ArrayRecord shards only (built with --format array_record): "
                                "read them with grain.sources.ArrayRecordDataSource(manifest.array_record_paths("
                                f"{split!r})), or reshard to TFRecord")
        if not split_expressions.is_expression(split):
            return [storage.join(self.location, s.path) for s in self.split(split).shards]  # type: ignore[arg-type]
        selection = self.select(split)
        cut = [p for p, whole in zip(selection.pieces, selection.whole, strict=True) if not whole]
        if cut:
            raise ValueError(f"split expression {selection.expression!r} cuts shard {cut[0].shard} of "
                             f"{cut[0].split!r} (takes its records {cut[0].start}..{cut[0].stop - 1}); shard_paths "
                             "lists whole shards: read the expression with the loader or RandomAccessSource, or "
                             "slice on shard boundaries (e.g. train[:4shard])")
        return [storage.join(self.location, self.splits[p.split].shards[p.shard].path) for p in selection.pieces]

    def array_record_shards(self, split: str) -> list[Shard]:
        """A split's ArrayRecord shards in shard order; ManifestError when the dataset has none."""
        entry = self.split(split)
        if self.shard_format == AR.name:
            return list(entry.shards)
        if entry.array_record_shards is None:
            raise ManifestError(f"split {split!r} has no ArrayRecord shards (build with --format both or "
                                "array_record, or reshard with --format array_record)")
        return list(entry.array_record_shards)

    def array_record_paths(self, split: str) -> list[str]:
        """Full paths (local or gs://) of a split's ArrayRecord shards, in shard order: what
        grain.sources.ArrayRecordDataSource takes (array-record reads gs:// itself; `array_record_source` makes
        the source from the manifest's counts without opening the shards)."""
        return [storage.join(self.location, s.path) for s in self.array_record_shards(split)]

    @property
    def media_key(self) -> str:
        """The feature holding the encoded media (image/encoded or video/encoded)."""
        return schema.media_key(self.features)

    def to_dict(self) -> dict[str, Any]:
        out = _plain(self)
        out.pop("location")
        for split in out["splits"].values():
            if split["index"] is None:
                split.pop("index")
            if split["array_record_shards"] is None:
                split.pop("array_record_shards")
            if not split["unlabeled"]:
                split.pop("unlabeled")
            for shard in split["shards"] + (split.get("array_record_shards") or []):
                if not shard["generation"]:
                    shard.pop("generation")
        order = ["format_version", "tool_version", "created", "input", "options", "media", "features", "labels",
                 "label_offset", "multi_label", "image_size", "embedding", "num_cores", "num_hosts", "files_seen",
                 "shard_format", "splits", "rejected", "skipped", "duplicates", "quality", "generations"]
        if out["quality"] is None:  # a build without the quality checks (or before them)
            order.remove("quality")
        if out["generations"] is None:
            order.remove("generations")
        else:
            for g in out["generations"]:
                if not g["carried"]:
                    g.pop("carried")
        if out["shard_format"] == FIRST.name:
            order.remove("shard_format")
        return {k: out[k] for k in order}

    def to_json(self) -> str:
        return json_text.dumps(self.to_dict()) + "\n"


_SCALARS = {str, int, float, bool, type(None)}


def _plain(value: Any) -> Any:
    """dataclasses.asdict for a manifest, in time linear and small in its labels: a list or dict of plain values
    (labels, class counts) is copied in one call, not value by value as asdict does."""
    if is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        if set(map(type, value.values())) <= _SCALARS:
            return dict(value)
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if set(map(type, value)) <= _SCALARS:
            return type(value)(value)
        return type(value)(_plain(v) for v in value)
    return value


def unknown_split(name: object, available: Sequence[str]) -> str:
    """One line: `name` is not a split here; the closest names (aliases such as valid/val/eval for validation,
    then close spellings) and every split there is. A split expression given where one name is taken says so."""
    listed = ", ".join(sorted(available))
    if isinstance(name, str) and split_expressions.is_expression(name) and names.split_name_problem(name):
        return (f"{name!r} is a split expression; this takes one split's name (the loader, steps_per_epoch, "
                f"eval_steps, num_records and RandomAccessSource take expressions); the dataset has {listed}")
    close = split_expressions.closest_names(name, list(available)) if isinstance(name, str) else []
    hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
    return f"split {names.shown(name)} is not in this dataset; {hint}it has {listed}"


def safe_relative_path(path: Any, what: str = "shard path") -> str:
    """Accept only plain relative paths that stay inside the dataset folder: normal, each part a plain name of
    bounded length without control characters."""
    if not isinstance(path, str) or not path:
        raise ManifestError(f"{what} must be a non-empty string, got {names.shown(path)}")
    if "\\" in path or "\x00" in path or ":" in path or path.startswith("/") or path.startswith("~"):
        raise ManifestError(f"{what} {names.shown(path)} is not a plain relative path inside the dataset folder; "
                            "refused")
    if ".." in path.split("/") or posixpath.normpath(path) != path:
        raise ManifestError(f"{what} {names.shown(path)} leaves or is not normal within the dataset folder; refused")
    problem = next(filter(None, map(names.path_part_problem, path.split("/"))), None)
    if problem or len(path) > names.MAX_PATH:
        raise ManifestError(f"{what} {names.shown(path)} {problem or f'is longer than {names.MAX_PATH} characters'}; "
                            "refused")
    return path


def _get(obj: Mapping[str, Any], key: str, kind: type | tuple, where: str) -> Any:
    if key not in obj:
        raise ManifestError(f"{where}: missing field {key!r}")
    value = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        names = "/".join(k.__name__ for k in kinds)
        raise ManifestError(f"{where}: field {key!r} must be {names}, got {type(value).__name__}")
    return value


def _count(obj: Mapping[str, Any], key: str, where: str, minimum: int = 0) -> int:
    value = _get(obj, key, int, where)
    if value < minimum:
        raise ManifestError(f"{where}: field {key!r} must be >= {minimum}, got {value}")
    return value


def _shard(obj: Any, where: str, shard_format: ShardFormat = FIRST) -> Shard:
    if not isinstance(obj, Mapping):
        raise ManifestError(f"{where}: must be an object")
    path = safe_relative_path(_get(obj, "path", str, where))
    if not shard_format.matches(posixpath.basename(path)):
        raise ManifestError(f"{where}: shard name {path!r} does not follow {shard_format.name_rule}")
    crc, sha = _get(obj, "crc32c", str, where), _get(obj, "sha256", str, where)
    if not _CRC32C.match(crc):
        raise ManifestError(f"{where}: crc32c {crc!r} is not a base64 CRC32C")
    if not _SHA256.match(sha):
        raise ManifestError(f"{where}: sha256 {sha!r} is not 64 lowercase hex digits")
    generation = _count(obj, "generation", where) if "generation" in obj else 0
    num_records, num_bytes = _count(obj, "num_records", where, 1), _count(obj, "num_bytes", where, 1)
    if num_records * shard_format.min_record_bytes > num_bytes:
        raise ManifestError(f"{where}: {num_records} records cannot fit in {num_bytes} bytes (a record takes at least "
                            f"{shard_format.min_record_bytes})")
    return Shard(path, num_records, num_bytes, crc, sha, generation)


def _split(name: str, obj: Any, shard_format: ShardFormat = FIRST) -> Split:
    problem = names.split_name_problem(name)
    if problem:
        raise ManifestError(f"manifest: split name {names.shown(name)} {problem}; refused (it would become part of "
                            "file names)")
    where = f"split {name!r}"
    if not isinstance(obj, Mapping):
        raise ManifestError(f"{where}: must be an object")
    shards_raw = _get(obj, "shards", list, where)
    if not shards_raw:
        raise ManifestError(f"{where}: has no shards")
    shards = [_shard(s, f"{where} shard {i}", shard_format) for i, s in enumerate(shards_raw)]
    num_records, num_bytes = _count(obj, "num_records", where), _count(obj, "num_bytes", where)
    if sum(s.num_records for s in shards) != num_records:
        raise ManifestError(f"{where}: num_records {num_records} is not the sum of its shards' records")
    if sum(s.num_bytes for s in shards) != num_bytes:
        raise ManifestError(f"{where}: num_bytes {num_bytes} is not the sum of its shards' bytes")
    counts = _get(obj, "class_counts", dict, where)
    if not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in counts.items()):
        raise ManifestError(f"{where}: class_counts must map label names to integers")
    impossible = [(k, v) for k, v in counts.items() if not 0 <= v <= num_records]
    if impossible:
        raise ManifestError(f"{where}: class_counts gives {names.shown(impossible[0][0])} {impossible[0][1]} records; "
                            f"a count must be in 0..{num_records}, the split's records")
    unlabeled = _count(obj, "unlabeled", where) if "unlabeled" in obj else 0
    if unlabeled > num_records:
        raise ManifestError(f"{where}: unlabeled {unlabeled} is more than its {num_records} records")
    index = _index(obj["index"], f"{where} index", num_records) if obj.get("index") is not None else None
    if index is not None and not shard_format.indexed:
        raise ManifestError(f"{where}: a split of {shard_format.title} shards has no index (its shards give random "
                            "access)")
    twins = _twins(obj["array_record_shards"], shards, where) if obj.get("array_record_shards") is not None else None
    if twins is not None and shard_format is not FIRST:
        raise ManifestError(f"{where}: array_record_shards are the twins of {FIRST.title} shards; this dataset's "
                            f"shards are {shard_format.title} already")
    return Split(num_records, num_bytes, dict(counts), shards, index, twins, unlabeled)


def _twins(raw: Any, shards: Sequence[Shard], where: str) -> list[Shard]:
    """A split's ArrayRecord twins: one per TFRecord shard, beside it, named after it, as many records."""
    if not isinstance(raw, list) or len(raw) != len(shards):
        raise ManifestError(f"{where}: array_record_shards must list one ArrayRecord shard per shard ({len(shards)})")
    twins = [_shard(t, f"{where} array_record shard {i}", AR) for i, t in enumerate(raw)]
    for i, (shard, twin) in enumerate(zip(shards, twins, strict=True)):
        twin_name = AR.twin_name(posixpath.basename(shard.path))
        expected = posixpath.join(posixpath.dirname(shard.path), twin_name)
        if twin.path != expected or twin.num_records != shard.num_records or twin.generation != shard.generation:
            raise ManifestError(f"{where} array_record shard {i}: {twin.path!r} ({twin.num_records} records) is not "
                                f"the twin of {shard.path!r} ({shard.num_records} records)")
    return twins


def _index(obj: Any, where: str, num_records: int) -> IndexFile:
    if not isinstance(obj, Mapping):
        raise ManifestError(f"{where}: must be an object")
    path = safe_relative_path(_get(obj, "path", str, where), "index path")
    crc, sha = _get(obj, "crc32c", str, where), _get(obj, "sha256", str, where)
    if not _CRC32C.match(crc) or not _SHA256.match(sha):
        raise ManifestError(f"{where}: crc32c/sha256 are not a base64 CRC32C and 64 lowercase hex digits")
    rows = _count(obj, "num_rows", where)
    if rows != num_records:
        raise ManifestError(f"{where}: {rows} rows for {num_records} records")
    return IndexFile(path, rows, _count(obj, "num_bytes", where, 1), crc, sha)


def from_dict(obj: Any, location: str = "") -> Manifest:
    """Validate a parsed manifest and build the Manifest; raises ManifestError naming the first problem."""
    if not isinstance(obj, Mapping):
        raise ManifestError("manifest must be a JSON object")
    problem = json_values.depth_problem(obj) or json_values.option_problem(_get(obj, "options", dict, "manifest"))
    if problem:
        raise ManifestError(f"manifest: {problem}; refused")
    version = _get(obj, "format_version", int, "manifest")
    if version not in READABLE_VERSIONS:
        raise ManifestError(f"manifest format_version {version} is not supported; this tpu-shards reads "
                            f"{', '.join(map(str, READABLE_VERSIONS))} (a newer tpu-shards wrote it?)")
    try:
        schema.check_features(_get(obj, "features", dict, "manifest"))
    except ValueError as exc:
        raise ManifestError(f"manifest features: {exc}") from None
    labels = _get(obj, "labels", list, "manifest")
    if not set(map(type, labels)) <= {str} or len(set(labels)) != len(labels):
        raise ManifestError("manifest: labels must be distinct strings")
    splits_raw = _get(obj, "splits", dict, "manifest")
    if not splits_raw:
        raise ManifestError("manifest: has no splits")
    shard_format = obj.get("shard_format", FIRST.name)
    if shard_format not in SHARD_FORMATS:
        raise ManifestError(f"manifest: shard_format must be one of {', '.join(SHARD_FORMATS)}, got "
                            f"{names.shown(shard_format)}")
    first = FORMATS[shard_format]
    if first is not FIRST and version < first.manifest_version:  # every version so far reads TFRecord shards
        raise ManifestError(f"manifest: shard_format {first.name} needs format_version {first.manifest_version}, "
                            f"got {version}")
    splits = {name: _split(name, s, first) for name, s in splits_raw.items()}
    if len({s.array_record_shards is None for s in splits.values()}) > 1:
        raise ManifestError("manifest: array_record_shards must be given for every split or for none")
    image_size = _image_size(obj.get("image_size"))
    rejected, skipped = _get(obj, "rejected", dict, "manifest"), _get(obj, "skipped", dict, "manifest")
    n_rejected, n_skipped = _count(rejected, "count", "rejected"), _count(skipped, "count", "skipped")
    for part, name in ((rejected, "rejected"), (skipped, "skipped")):
        if "path" in part:
            safe_relative_path(part["path"], f"{name} path")
    quality = _quality(obj.get("quality"))
    _check_distinct_files(splits, rejected, skipped, quality or {})
    media = obj.get("media", "image")
    if media not in MEDIA:
        raise ManifestError(f"manifest: media must be one of {', '.join(MEDIA)}, got {media!r}")
    label_offset = _count(obj, "label_offset", "manifest") if "label_offset" in obj else 0
    multi_label = obj.get("multi_label", False)
    if not isinstance(multi_label, bool):
        raise ManifestError("manifest: multi_label must be true or false")
    if not multi_label:
        _check_single_label_counts(splits)
    embedding = obj.get("embedding")
    if embedding is not None and not (isinstance(embedding, Mapping) and isinstance(embedding.get("key"), str)
                                      and embedding["key"] in obj["features"]):
        raise ManifestError("manifest: embedding must be null or an object whose 'key' is a declared feature")
    duplicates = obj.get("duplicates")
    if duplicates is not None and not isinstance(duplicates, Mapping):
        raise ManifestError("manifest: duplicates must be null or an object")
    seen = _count(obj, "files_seen", "manifest")
    written = sum(s.num_records for s in splits.values())
    if seen != written + n_rejected + n_skipped:
        raise ManifestError(f"manifest accounting does not close: files_seen {seen} != records {written} "
                            f"+ rejected {n_rejected} + skipped {n_skipped}")
    generations = None
    if obj.get("generations") is not None:
        generations = _generations(obj["generations"])
        check_generations(generations, splits, seen, n_rejected, n_skipped)
    else:
        _all_first_generation(splits)
    return Manifest(
        tool_version=str(obj.get("tool_version", "")), created=str(obj.get("created", "")),
        input=str(obj.get("input", "")), options=dict(_get(obj, "options", dict, "manifest")),
        features={k: dict(v) for k, v in obj["features"].items()}, labels=list(labels), splits=splits,
        rejected=dict(rejected), skipped=dict(skipped), files_seen=seen, image_size=image_size,
        num_cores=_count(obj, "num_cores", "manifest", 1) if "num_cores" in obj else 8,
        num_hosts=_count(obj, "num_hosts", "manifest", 1) if "num_hosts" in obj else 1,
        media=media, label_offset=label_offset, multi_label=multi_label,
        embedding=dict(embedding) if embedding is not None else None,
        duplicates=dict(duplicates) if duplicates is not None else None, quality=quality, generations=generations,
        shard_format=shard_format, format_version=version, location=location)


def _image_size(value: Any) -> list[int] | None:
    """The manifest's image_size: null, or [height, width] within what a loader can allocate."""
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == 2 and all(
            isinstance(d, int) and not isinstance(d, bool) and 0 < d <= MAX_IMAGE_SIDE for d in value)):
        raise ManifestError(f"manifest: image_size must be null or [height, width], each in 1..{MAX_IMAGE_SIDE}, "
                            f"got {names.shown(value)}")
    problem = ImageSize(*value).problem()
    if problem is not None:
        raise ManifestError(f"manifest: image_size {problem}; refused (a loader would allocate that per image)")
    return value


def _quality(value: Any) -> dict[str, Any] | None:
    """The manifest's quality section: null (no quality checks), or its count, counts by kind, and report path."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ManifestError("manifest: quality must be null or an object")
    _count(value, "count", "quality")
    by_kind = value.get("by_kind", {})
    if not (isinstance(by_kind, Mapping) and all(isinstance(k, str) and isinstance(n, int) and not isinstance(n, bool)
                                                 and n >= 0 for k, n in by_kind.items())):
        raise ManifestError("manifest: quality.by_kind must map each kind to a count")
    if "path" in value:
        safe_relative_path(value["path"], "quality path")
    return dict(value)


def _check_distinct_files(splits: Mapping[str, Split], rejected: Mapping[str, Any],
                          skipped: Mapping[str, Any], quality: Mapping[str, Any]) -> None:
    """Every file the manifest names is named once: a shard listed twice, or in two splits, would be read as
    twice the records; an index or report sharing a name with another file would be overwritten by it."""
    owners: dict[str, str] = {MANIFEST_NAME: "the manifest itself", CROISSANT_NAME: "the Croissant description",
                              CARD_NAME: "the dataset card"}
    named = [(shard.path, f"split {name!r} shard {i}") for name, split in splits.items()
             for i, shard in enumerate(split.shards)]
    named += [(twin.path, f"split {name!r} array_record shard {i}") for name, split in splits.items()
              for i, twin in enumerate(split.array_record_shards or ())]
    named += [(split.index.path, f"split {name!r} index") for name, split in splits.items() if split.index]
    named += [(part["path"], f"the {what} report") for part, what in ((rejected, "rejected"), (skipped, "skipped"),
                                                                       (quality, "quality")) if "path" in part]
    for path, where in named:
        if path in owners:
            raise ManifestError(f"manifest: {where} names {names.shown(path)}, as {owners[path]} does; every file "
                                "must be listed once")
        owners[path] = where


def _check_single_label_counts(splits: Mapping[str, Split]) -> None:
    """In a single-label dataset a record counts under one label at most, and an unlabeled one under none."""
    for name, split in splits.items():
        total = sum(split.class_counts.values())
        if total + split.unlabeled > split.num_records:
            raise ManifestError(f"split {name!r}: class_counts add up to {total}, and {split.unlabeled} records are "
                                f"unlabeled: more than its {split.num_records} records (each has one label or none)")


def _counts(obj: Mapping[str, Any], key: str, where: str) -> dict[str, int]:
    value = _get(obj, key, dict, where)
    if not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
               for k, v in value.items()):
        raise ManifestError(f"{where}: {key} must map split names to non-negative integers")
    return dict(value)


def _generation(i: int, obj: Any) -> Generation:
    where = f"generation {i}"
    if not isinstance(obj, Mapping):
        raise ManifestError(f"{where}: must be an object")
    if _count(obj, "generation", where) != i:
        raise ManifestError(f"{where}: field 'generation' is {obj['generation']}; generations must be numbered "
                            "0, 1, 2, ... in order")
    added = obj.get("labels_added", [])
    if not isinstance(added, list) or not all(isinstance(x, str) for x in added):
        raise ManifestError(f"{where}: labels_added must be a list of strings")
    return Generation(
        generation=i, created=_get(obj, "created", str, where), input=_get(obj, "input", str, where),
        files_seen=_count(obj, "files_seen", where), num_records=_counts(obj, "num_records", where),
        num_shards=_counts(obj, "num_shards", where), rejected=_count(obj, "rejected", where),
        skipped=_count(obj, "skipped", where),
        already_in_dataset=_count(obj, "already_in_dataset", where) if "already_in_dataset" in obj else 0,
        labels_added=list(added), tool_version=str(obj.get("tool_version", "")),
        carried=_counts(obj, "carried", where) if "carried" in obj else {})


def _generations(raw: Any) -> list[Generation]:
    if not isinstance(raw, list) or not raw:
        raise ManifestError("manifest: generations must be null or a non-empty list")
    return [_generation(i, g) for i, g in enumerate(raw)]


def check_generations(generations: Sequence[Generation], splits: Mapping[str, Split], seen: int, rejected: int,
                      skipped: int) -> None:
    """Each generation's accounting closes, its counts match its shards (less those a later generation replaced,
    plus those it carried), shards come in generation order, and the generations add up to the manifest's
    totals; ManifestError naming the first mismatch."""
    last = len(generations) - 1
    for name, split in splits.items():
        previous = 0
        for i, shard in enumerate(split.shards):
            if not previous <= shard.generation <= last:
                raise ManifestError(f"split {name!r} shard {i}: generation {shard.generation} is out of order or not "
                                    f"one of the manifest's generations 0..{last}")
            previous = shard.generation
    stored = _stored_records(generations)
    for g in generations:
        where = f"generation {g.generation}"
        unknown = sorted(set(g.num_records) - set(splits))
        if unknown or set(g.num_shards) != set(g.num_records):
            raise ManifestError(f"{where}: num_records and num_shards must name the same splits of the dataset")
        for name, split in splits.items():
            mine = [s for s in split.shards if s.generation == g.generation]
            records = stored.get((g.generation, name), 0)
            shards = g.num_shards.get(name, 0) if records else 0
            if len(mine) != shards or sum(s.num_records for s in mine) != records:
                raise ManifestError(f"{where}: split {name!r} has {len(mine)} shards of "
                                    f"{sum(s.num_records for s in mine)} records, the generation says "
                                    f"{shards} of {records}")
        if g.files_seen != sum(g.num_records.values()) + g.rejected + g.skipped:
            raise ManifestError(f"{where}: accounting does not close: files_seen {g.files_seen} != records "
                                f"{sum(g.num_records.values())} + rejected {g.rejected} + skipped {g.skipped}")
    totals = (sum(g.files_seen for g in generations), sum(g.rejected for g in generations),
              sum(g.skipped for g in generations))
    if totals != (seen, rejected, skipped):
        raise ManifestError(f"manifest: the generations' files_seen/rejected/skipped add up to {totals}, the manifest "
                            f"says {(seen, rejected, skipped)}")


def _stored_records(generations: Sequence[Generation]) -> dict[tuple[int, str], int]:
    """(generation, split) -> records its shards hold now: those it added, plus those it carried from the split's
    latest earlier generation (which then holds none)."""
    stored: dict[tuple[int, str], int] = {}
    latest: dict[str, int] = {}
    for g in generations:
        where = f"generation {g.generation}"
        for name, added in g.num_records.items():
            carried = g.carried.get(name, 0)
            if carried:
                before = latest.get(name)
                if before is None or stored[(before, name)] != carried:
                    raise ManifestError(f"{where}: split {name!r} carries {carried} records, but its latest earlier "
                                        f"generation holds {stored[(before, name)] if before is not None else 0}")
                stored[(before, name)] = 0
            stored[(g.generation, name)] = added + carried
            latest[name] = g.generation
        if set(g.carried) - set(g.num_records):
            raise ManifestError(f"{where}: carried must name splits the generation added records to")
    return stored


def _all_first_generation(splits: Mapping[str, Split]) -> None:
    for name, split in splits.items():
        for i, shard in enumerate(split.shards):
            if shard.generation:
                raise ManifestError(f"split {name!r} shard {i}: generation {shard.generation}, but the manifest lists "
                                    "no generations")


def parse(text: bytes | str, location: str = "") -> Manifest:
    """Parse manifest JSON text; any malformation is a ManifestError."""
    if len(text) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"manifest is {len(text)} bytes, more than the {MAX_MANIFEST_BYTES} a manifest may hold; "
                            "refused unparsed")
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ManifestError(f"manifest is not valid JSON: {str(exc)[:200]}") from None
    return from_dict(obj, location)


MAX_REPORT_LINE = 1 << 20  # bytes of one line of a rejected or skipped report (an entry takes a few hundred)


def bounded_lines(stream: IO[bytes], limit: int = MAX_REPORT_LINE) -> Iterator[bytes | None]:
    """A stream's lines, each read no further than `limit` bytes; a longer line is given as None and ends them (the
    rest is not read: a report holding such a line is damaged, and the line may run to the end of the file)."""
    while line := stream.readline(limit + 1):
        if len(line) > limit:
            yield None
            return
        yield line


def iter_report_entries(stream: IO[bytes], path: str) -> Iterator[dict[str, Any]]:
    """The entries of a dataset's rejected or skipped report, read one line at a time (a line holds at most
    MAX_REPORT_LINE bytes): one JSON object per line, each with a string `source` and `reason`; ManifestError naming
    the first line that is not one."""
    for number, line in enumerate(bounded_lines(stream), start=1):
        if line is None:
            raise ManifestError(f"{path} line {number} is longer than {MAX_REPORT_LINE} bytes; not a report entry")
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):
            entry = None
        if not (isinstance(entry, dict) and isinstance(entry.get("source"), str)
                and isinstance(entry.get("reason"), str)):
            raise ManifestError(f"{path} line {number} is not a report entry (a JSON object with a source and a "
                                "reason)")
        yield entry


def read_report(uri: str, path: str) -> Iterator[dict[str, Any]]:
    """The entries of the report at `uri` (`path`: as messages name it), read one line at a time; none when the
    file is absent (a skipped report may be)."""
    try:
        with storage.open_read(uri) as f:
            yield from iter_report_entries(f, path)
    except storage.NotFoundError:
        return


def manifest_path(dataset: str) -> tuple[str, str]:
    """(manifest file, dataset folder) from either a folder or a path to manifest.json."""
    problem = names.gcs_name_problem(dataset) if storage.is_gcs(dataset) else None
    if problem:
        raise ManifestError(f"{names.shown(dataset)} {problem}")
    if dataset.rstrip("/").endswith(".json"):
        return dataset, storage.parent(dataset)
    return storage.join(dataset, MANIFEST_NAME), dataset.rstrip("/") or dataset


def read_manifest_bytes(path: str) -> bytes:
    """A manifest file's bytes, read no further than one byte past the most a manifest may hold (`parse` refuses
    a larger one)."""
    return storage.read_bytes(path, limit=MAX_MANIFEST_BYTES + 1)


def load(dataset: str, reader: Callable[[str], bytes] | None = None) -> Manifest:
    """Load and validate the manifest of a dataset folder (local or gs://) or of a manifest.json path."""
    path, folder = manifest_path(dataset)
    read = reader or read_manifest_bytes
    try:
        data = read(path)
    except Exception as exc:
        raise ManifestError(f"no readable manifest at {path}: {storage.problem(exc, path)}. "
                            "Is this a tpu-shards dataset whose build finished?") from None
    return parse(data, folder)


def assemble(*, splits: Mapping[str, Split], rejected: Mapping[str, int], skipped: Mapping[str, int],
             skipped_extensions: Mapping[str, int], seen: int, skipped_path: str | None = None,
             **fields: Any) -> Manifest:
    """The manifest of a finished build, from its splits and its accounting (`rejected` and `skipped`: counts by
    reason; the manifest names the reports that list them, never their lines).

    Raises InternalError when the accounting does not close (a bug: every input must end as a record,
    a rejection or a skip). `fields` are the Manifest's other fields (tool_version, options, ...).
    """
    written = sum(s.num_records for s in splits.values())
    n_skipped, n_rejected = sum(skipped.values()), sum(rejected.values())
    if seen != written + n_rejected + n_skipped:
        raise InternalError(f"accounting does not close: {seen} inputs seen, {written} written, "
                            f"{n_rejected} rejected, {n_skipped} skipped")
    by_reason = {reason: n for reason, n in rejected.items() if n}
    skipped_part: dict[str, Any] = {"count": n_skipped, "by_reason": dict(sorted(skipped.items()))}
    if skipped_extensions:
        skipped_part["by_extension"] = dict(sorted(skipped_extensions.items()))
    if skipped_path:
        skipped_part["path"] = skipped_path
    return Manifest(
        splits=dict(sorted(splits.items())), files_seen=seen, skipped=skipped_part,
        rejected={"count": n_rejected, "by_reason": dict(sorted(by_reason.items())), "path": REJECTED_NAME},
        **fields)
